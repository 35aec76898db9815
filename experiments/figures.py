"""Figures of an experiment's runs: per-layer F-Attn and M-Act, loss and training curves, each
seed's analysis, long context (the stability and scaling figures are theirs: stability.py,
scaling.py).
"""

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments import rundata
from experiments.rundata import Result
from gated_attention.analysis import metrics as metrics_lib


FIGURES = ('f_attn_layers.png', 'm_act_layers.png', 'loss_curves.png', 'training_curves.png',
           'seeds.png')


LONG_CONTEXT_FIGURE = 'long_context.png'


def new_figure(width: float, height: float, ncols: int = 1):
  fig = Figure(figsize=(width, height), layout='constrained')
  FigureCanvasAgg(fig)
  return fig, np.atleast_1d(fig.subplots(1, ncols))


def _band(ax, x, values, color, label, marker=None):
  """The mean of `values` [seeds, len(x)] with a ±1 std band (none for a single seed)."""
  v = np.asarray(values, float)
  mean = np.nanmean(v, axis=0)
  ax.plot(x, mean, color=color, marker=marker, label=f'{label} (n={len(v)})')
  if len(v) > 1:
    std = np.nanstd(v, axis=0, ddof=1)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, lw=0)


def _layer_positions(results, metric: str, n: int) -> np.ndarray:
  """The model layers a group's `n` per-layer values are of: a hybrid's F-Attn is per attention
  layer (its reports' `attention_layers` name them: [3] for three DeltaNets then attention), every
  other per-layer value per model layer."""
  named = {tuple(r.report.get('attention_layers') or ()) for r in results
           if r.status == 'done' and r.report}
  if metric == 'f_attn_layers' and len(named) == 1:
    (layers,) = named
    if len(layers) == n:
      return np.asarray(layers)
  return np.arange(n)


def per_layer_figure(experiment, results, metric: str, ylabel: str, log: bool = False) -> Figure:
  """One line per group: the per-layer `metric` (f_attn_layers, m_act_layers) over seeds."""
  fig, (ax,) = new_figure(7, 4)
  seq_lens = set()
  for i, (group, rs) in enumerate(rundata.by_group(experiment, results).items()):
    values = [rundata.METRICS[metric][1](r) for r in rs if r.status == 'done']
    values = [[np.nan if x is None else x for x in v] for v in values if v is not None]
    seq_lens |= {r.report['seq_len'] for r in rs if r.report}
    if values and len({len(v) for v in values}) == 1:
      _band(ax, _layer_positions(rs, metric, len(values[0])), values, f'C{i % 10}', group,
            marker='o')
  if metric == 'f_attn_layers' and len(seq_lens) == 1:
    ax.axhline(metrics_lib.uniform_causal_f_attn(seq_lens.pop()), color='gray', ls=':',
               label='uniform causal attention')
  ax.set(xlabel='layer', ylabel=ylabel, title=f'{experiment.name}: {ylabel} (mean ± std)')
  if log:
    ax.set_yscale('log')
  if metric == 'f_attn_layers':
    ax.set_ylim(0, 1)
  ax.xaxis.get_major_locator().set_params(integer=True)
  if ax.lines:
    ax.legend(fontsize=7)
  return fig


def _curve(rows, split):
  return {r['step']: r['loss'] for r in rows
          if r.get('split') == split and r.get('loss') is not None}


def loss_figure(experiment, results) -> Figure:
  """Train and validation loss against step, mean ± std over each group's seeds."""
  fig, axes = new_figure(11, 4, ncols=2)
  for ax, split in zip(axes, ('train', 'val')):
    for i, (group, rs) in enumerate(rundata.by_group(experiment, results).items()):
      curves = [_curve(r.rows, split) for r in rs if r.rows]
      steps = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
      if steps:
        _band(ax, steps, [[c[s] for s in steps] for c in curves], f'C{i % 10}', group,
              marker='o' if split == 'val' else None)
    ax.set(xlabel='step', ylabel='loss (nats/token)', title=f'{split} loss (mean ± std)')
    if ax.lines:
      ax.legend(fontsize=7)
  return fig


def _val_curve(rows, get):
  return {r['step']: get(r) for r in rows if r.get('split') == 'val' and get(r) is not None}


def _train_curve(rows, key):
  return {r['step']: r[key] for r in rows if r.get('split') == 'train' and r.get(key) is not None}


def training_curves_figure(experiment, results) -> Figure:
  """Over the training steps, mean ± std over each group's seeds: the largest layer's F-Attn
  and M-Act (the training loop's evaluations) and the parameter norm (its train rows): when a
  sink forms or fades, and whether the largest activation grows with the weights."""
  f_attn = lambda r: max(r['f_attn']) if isinstance(r.get('f_attn'), list) and r['f_attn'] else None  # noqa: E731
  m_act = lambda r: max(r['m_act']) if isinstance(r.get('m_act'), list) and r['m_act'] else None  # noqa: E731
  panels = [('F-Attn, largest layer', lambda rows: _val_curve(rows, f_attn), False),
            ('M-Act, largest layer', lambda rows: _val_curve(rows, m_act), True),
            ('parameter norm', lambda rows: _train_curve(rows, 'param_norm'), False)]
  fig, axes = new_figure(15, 4, ncols=3)
  for ax, (title, curve, log) in zip(axes, panels):
    for i, (group, rs) in enumerate(rundata.by_group(experiment, results).items()):
      curves = [c for c in (curve(r.rows) for r in rs if r.rows) if c]
      steps = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
      if steps:
        _band(ax, steps, [[c[s] for s in steps] for c in curves], f'C{i % 10}', group,
              marker='o' if len(steps) < 30 else None)
    ax.set(xlabel='step', title=f'{title} (mean ± std)')
    if log and ax.lines:
      ax.set_yscale('log')
    if ax.lines and len(ax.lines) <= 12:
      ax.legend(fontsize=6)
  return fig


def seeds_figure(experiment, results) -> Figure:
  """Every seed of every group as a dot: the largest layer's F-Attn (with the sink threshold)
  and M-Act of its analysis, so a group's spread, and a group split between seeds with and
  without a sink, show at a glance."""
  groups = rundata.by_group(experiment, results)
  fig, axes = new_figure(max(7.0, 0.32 * len(groups) + 2), 6.5, ncols=1)
  fig.clear()
  axes = fig.subplots(2, 1, sharex=True)
  x = np.arange(len(groups))
  for ax, (metric, label, log) in zip(axes, (('f_attn_max', 'F-Attn, largest layer', False),
                                            ('m_act_mean', 'M-Act', True))):
    for i, rs in enumerate(groups.values()):
      values = [rundata.METRICS[metric][1](r) for r in rs if r.status == 'done']
      values = [v for v in values if v is not None]
      if values:
        jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
        ax.scatter(i + np.asarray(jitter), values, s=14, color=f'C{i % 10}', zorder=3)
    if metric == 'f_attn_max':
      ax.axhline(rundata.SINK_F_ATTN, color='gray', ls=':', lw=1,
                 label=f'sink threshold {rundata.SINK_F_ATTN}')
      ax.set_ylim(-0.02, 1.0)
      ax.legend(fontsize=7, loc='upper right')
    if log:
      ax.set_yscale('log')
    ax.set(ylabel=label)
    ax.grid(axis='x', color='0.9')
  axes[-1].set_xticks(x, list(groups), rotation=75, ha='right', fontsize=7)
  axes[0].set_title(f'{experiment.name}: each seed\'s analysis')
  return fig


def long_context_figure(experiment, results: list[Result]) -> Figure:
  """Per LONG_CONTEXT label: loss by position (top) and RULER exact match by length (bottom),
  one line per group, mean ± std over seeds (with FORMED_BELOW: over the formed runs alone, the
  comparison the tables' 'formed' rows make)."""
  labels = list(experiment.long_context)
  fig = Figure(figsize=(5 * len(labels), 7), layout='constrained')
  FigureCanvasAgg(fig)
  axes = np.asarray(fig.subplots(2, len(labels), squeeze=False))
  groups = rundata.by_group(experiment, results)
  if experiment.formed_below is not None:
    groups = {f'{g}, formed': [r for r in rs if rundata.formed(r, experiment.formed_below)]
              for g, rs in groups.items()}
  for j, label in enumerate(labels):
    for i, (group, rs) in enumerate(groups.items()):
      done = [r.long_context[label] for r in rs if r.long_context.get(label)]
      if not done:
        continue
      pos = np.maximum(done[0]['loss']['curve']['position'], 1)
      _band(axes[0, j], pos, [d['loss']['curve']['loss'] for d in done], f'C{i % 10}', group)
      lengths = [n for n in done[0]['lengths'] if any(rundata.ruler_mean(d, n) is not None
                                                      for d in done)]  # where a task fits
      acc = [[np.nan if rundata.ruler_mean(d, n) is None else 100 * rundata.ruler_mean(d, n)
              for n in lengths]
             for d in done]
      if lengths:
        _band(axes[1, j], lengths, acc, f'C{i % 10}', group, marker='o')
        axes[1, j].set_xscale('log', base=2)
        axes[1, j].set_xticks(lengths, [str(n) for n in lengths])   # the evaluated lengths only
        axes[1, j].minorticks_off()
      axes[0, j].axvline(done[0]['train_seq_len'], color='gray', ls=':', lw=1)
    axes[0, j].set(xscale='log', xlabel='position', ylabel='loss (nats/token)',
                   title=f'{label}: loss by position')
    some = next((r.long_context[label] for r in results if r.long_context.get(label)), {})
    retrieval = (some.get('retrieval') or {}).get('task')
    axes[1, j].set(xlabel='prompt length (tokens)', ylabel='exact match (%)', ylim=(-2, 102),
                   title=f'{label}: ' + (f'{retrieval} retrieval' if retrieval else
                                         'RULER-style tasks'))
    for ax in axes[:, j]:
      if ax.lines:
        ax.legend(fontsize=7)
  return fig
