"""Figures of the analysis (matplotlib's object API with the Agg canvas: no pyplot, no display).

Each function returns a `matplotlib.figure.Figure`; `save(fig, path)` writes a PNG. Figures show
inline in a notebook when displayed (`display(fig)`), whatever the notebook's backend.
"""

import io
import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gated_attention import storage
from gated_attention.analysis import metrics
from gated_attention.model import gating

SITE_LABELS = {'attn_out': 'attention output', 'attn_residual': 'after attention residual',
               'ffn_out': 'FFN output', 'ffn_residual': 'after FFN residual (layer output)'}


def _figure(width: float, height: float) -> Figure:
  fig = Figure(figsize=(width, height), layout='constrained')
  FigureCanvasAgg(fig)
  return fig


MAX_LABELLED_TOKENS = 64  # attention maps of longer sequences get no token labels


def to_png(fig: Figure) -> bytes:
  """PNG bytes of `fig` (for `IPython.display.Image(data=...)`)."""
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=100)
  return buf.getvalue()


def save(fig: Figure, path: str) -> str:
  """`fig` as a PNG file at `path` (a local path or gs://...)."""
  if storage.is_remote(path):
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=110)
    storage.write(path, buf.getvalue())
    return path
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  return path


def _layers(n, report: dict | None = None):
  """The model layers of `n` per-layer values: 0 .. n-1, or a hybrid's attention layers when the
  values are per attention layer (report['attention_layers'])."""
  named = (report or {}).get('attention_layers')
  return np.asarray(named) if named is not None and len(named) == n else np.arange(n)


def _integer_ticks(ax, *axes):
  for a in axes:
    getattr(ax, f'{a}axis').set_major_locator(MaxNLocator(integer=True))


def f_attn_figure(report: dict, title: str = '') -> Figure:
  """Per-layer F-Attn (with its mean) and the per-head values as a heatmap."""
  fig = _figure(10, 3.6)
  ax, ax_h = fig.subplots(1, 2, width_ratios=[1.2, 1])
  f = np.asarray(report['f_attn'], float)
  ax.bar(_layers(len(f), report), f, color='tab:blue')
  ax.axhline(report['f_attn_mean'], color='k', ls='--', lw=1,
             label=f'mean {report["f_attn_mean"]:.3f}')
  ax.set(xlabel='layer', ylabel='F-Attn (attention to token 0)', ylim=(0, 1),
         title=title or 'F-Attn per layer')
  ax.legend(loc='upper right')
  _integer_ticks(ax, 'x')
  per_head = np.asarray(report['f_attn_per_head'], float)
  im = ax_h.imshow(per_head, aspect='auto', vmin=0, vmax=1, cmap='viridis',
                   interpolation='nearest')
  ax_h.set(xlabel='head', ylabel='layer', title='F-Attn per head')
  _integer_ticks(ax_h, 'x', 'y')
  if report.get('attention_layers') is not None:   # a hybrid: name each row's model layer
    ax_h.set_yticks(range(len(f)), [str(i) for i in _layers(len(f), report)])
  fig.colorbar(im, ax=ax_h)
  return fig


def m_act_figure(report: dict, title: str = '') -> Figure:
  """Per-layer max |h| at the four sites (log scale)."""
  fig = _figure(7, 3.6)
  ax = fig.subplots()
  for site, values in report['m_act'].items():
    v = np.asarray([np.nan if x is None else x for x in values], float)
    ax.plot(_layers(len(v)), v, marker='o', label=SITE_LABELS.get(site, site))
  ax.set_yscale('log')
  ax.set(xlabel='layer', ylabel='max |h|',
         title=title or f'M-Act (layer-output mean {report["m_act_mean"]:.1f})')
  ax.legend(fontsize=8)
  _integer_ticks(ax, 'x')
  return fig


def gate_figure(report: dict, title: str = '') -> Figure:
  """Gate-score histograms per layer (heatmap) and the per-layer mean / fraction below 0.1."""
  gate = report['gate']
  fig = _figure(10, 3.6)
  ax_h, ax_m = fig.subplots(1, 2)
  hist = np.asarray(gate['hist'], float)
  lo, hi = gate.get('hist_range', (0.0, 1.0))
  im = ax_h.imshow(hist, aspect='auto', cmap='magma', interpolation='nearest',
                   extent=(lo, hi, hist.shape[0] - 0.5, -0.5))
  ax_h.set(xlabel='gate score', ylabel='layer', title='gate-score histogram (fraction)')
  _integer_ticks(ax_h, 'y')
  fig.colorbar(im, ax=ax_h)
  n = len(gate['mean'])
  ax_m.plot(_layers(n, report), gate['mean'], marker='o', label='mean')
  ax_m.plot(_layers(n, report), gate[metrics.GATE_FRAC_KEY], marker='s', label='fraction < 0.1')
  ax_m.set(xlabel='layer', ylim=(0, 1),
           title=title or f'gate score (mean over layers {report["gate_score_mean"]:.3f})')
  ax_m.legend()
  _integer_ticks(ax_m, 'x')
  return fig


def linear_gate_figure(report: dict, title: str = '') -> Figure:
  """A hybrid's Gated DeltaNet layers: the output gate SiLU(z) per layer, its histogram
  (heatmap) and its mean, mean |.| and share below 0.1 in magnitude."""
  gate = report['linear_gate']
  layers = np.asarray(report.get('linear_attention_layers') or range(len(gate['mean'])))
  fig = _figure(10, 3.6)
  ax_h, ax_m = fig.subplots(1, 2)
  hist = np.asarray(gate['hist'], float)
  lo, hi = gating.HIST_RANGE['silu']
  im = ax_h.imshow(hist, aspect='auto', cmap='magma', interpolation='nearest',
                   extent=(lo, hi, hist.shape[0] - 0.5, -0.5))
  ax_h.set(xlabel='SiLU(z)', ylabel='DeltaNet layer (in order)',
           title='output-gate histogram (fraction)')
  _integer_ticks(ax_h, 'y')
  fig.colorbar(im, ax=ax_h)
  ax_m.plot(layers, gate['mean'], marker='o', label='mean')
  ax_m.plot(layers, gate['abs_mean'], marker='^', label='mean |.|')
  ax_m.plot(layers, gate[metrics.LINEAR_GATE_FRAC_KEY], marker='s', label='fraction |.| < 0.1')
  ax_m.set(xlabel='layer', title=title or 'Gated DeltaNet output gate SiLU(z) (mean over '
           f'layers {report["linear_gate_score_mean"]:.3f})')
  ax_m.legend()
  _integer_ticks(ax_m, 'x')
  return fig


def sparsity_figure(report: dict, title: str = '') -> Figure:
  """Mean |Y| and the fractions of |Y| below 1e-2 / 1e-3, before and after the gate."""
  sp = report['sparsity']
  fig = _figure(10, 3.6)
  ax_a, ax_f = fig.subplots(1, 2)
  for name, style in (('pre_gate', '-'), ('post_gate', '--')):
    if name not in sp:
      continue
    s = sp[name]
    n = len(s['abs_mean'])
    ax_a.plot(_layers(n, report), s['abs_mean'], ls=style, marker='o',
              label=name.replace('_', ' '))
    for key, color in (('frac_below_1e-2', 'tab:orange'), ('frac_below_1e-3', 'tab:green')):
      ax_f.plot(_layers(n, report), s[key], ls=style, marker='o', color=color,
                label=f'{name.replace("_", " ")}: {key.replace("frac_below_", "< ")}')
  ax_a.set(xlabel='layer', ylabel='mean |Y|', title=title or 'SDPA output magnitude')
  ax_a.legend()
  ax_f.set(xlabel='layer', ylabel='fraction', ylim=(0, 1), title='SDPA output sparsity')
  ax_f.legend(fontsize=8)
  _integer_ticks(ax_a, 'x')
  _integer_ticks(ax_f, 'x')
  return fig


def attention_maps_figure(maps, layers, labels=None, title: str = '', names=None) -> Figure:
  """Head-averaged attention maps (query rows, key columns) of `layers`; maps is [L, n, n];
  `names`: the model layer of each map (a hybrid's attention layers), default its index."""
  maps = np.asarray(maps, float)
  layers = list(layers)
  n = maps.shape[-1]
  show_labels = labels is not None and n <= MAX_LABELLED_TOKENS
  size = max(4.5, 0.14 * n) if show_labels else 3.4
  fig = _figure(size * len(layers) + 0.8, size)
  axes = np.atleast_1d(fig.subplots(1, len(layers)))
  im = None
  for ax, layer in zip(axes, layers):
    im = ax.imshow(maps[layer], cmap='viridis', vmin=0, vmax=1, interpolation='nearest')
    ax.set(title=f'layer {layer if names is None else names[layer]}', xlabel='key',
           ylabel='query')
    if show_labels:
      ax.set_xticks(range(n), list(labels)[:n], rotation=90, fontsize=7)
      ax.set_yticks(range(n), list(labels)[:n], fontsize=7)
  if im is not None:
    fig.colorbar(im, ax=list(axes), shrink=0.8)
  if title:
    fig.suptitle(title)
  return fig


def _curve(rows, split, key='loss'):
  pts = [(r['step'], r[key]) for r in rows if r.get('split') == split and r.get(key) is not None]
  return np.asarray(pts, float).reshape(-1, 2)


def loss_curves_figure(runs: dict, title: str = '') -> Figure:
  """Train and validation loss against step for {name: metrics rows}."""
  fig = _figure(10, 3.6)
  ax_t, ax_v = fig.subplots(1, 2)
  for i, (name, rows) in enumerate(runs.items()):
    color = f'C{i % 10}'
    train, val = _curve(rows, 'train'), _curve(rows, 'val')
    if len(train):
      ax_t.plot(train[:, 0], train[:, 1], color=color, label=name)
    if len(val):
      ax_v.plot(val[:, 0], val[:, 1], color=color, marker='o', label=name)
  ax_t.set(xlabel='step', ylabel='loss', title=title or 'train loss')
  ax_v.set(xlabel='step', ylabel='loss', title='validation loss')
  for ax in (ax_t, ax_v):
    if ax.lines:
      ax.legend(fontsize=8)
    else:
      ax.text(0.5, 0.5, 'no points', ha='center', va='center', transform=ax.transAxes)
  return fig


def per_layer_compare_figure(runs: dict, ylabel: str, log: bool = False,
                             title: str = '') -> Figure:
  """One line per run: {name: per-layer list (None: the run has none)}."""
  fig = _figure(7, 3.6)
  ax = fig.subplots()
  for name, values in runs.items():
    if values is None:
      continue
    v = np.asarray([np.nan if x is None else x for x in values], float)
    ax.plot(_layers(len(v)), v, marker='o', label=name)
  if log:
    ax.set_yscale('log')
  ax.set(xlabel='layer', ylabel=ylabel, title=title)
  _integer_ticks(ax, 'x')
  if ax.lines:
    ax.legend(fontsize=8)
  else:
    ax.text(0.5, 0.5, 'no per-layer values', ha='center', va='center', transform=ax.transAxes)
  return fig


def long_context_loss_figure(reports: dict, title: str = '') -> Figure:
  """Cross-entropy against position for {name: long_context report}, with the training length
  and the bucket edges marked (log-scaled positions)."""
  fig = _figure(7, 3.6)
  ax = fig.subplots()
  for i, (name, rep) in enumerate(reports.items()):
    curve = rep['loss']['curve']
    ax.plot(np.maximum(curve['position'], 1), curve['loss'], color=f'C{i % 10}', label=name)
  some = next(iter(reports.values()))
  ax.axvline(some['train_seq_len'], color='k', ls='--', lw=1, label='training length')
  ax.set_xscale('log', base=2)
  ax.set(xlabel='position (tokens)', ylabel='cross-entropy (nats)', title=title)
  ax.legend(fontsize=8)
  return fig


def ruler_figure(accuracy: dict, title: str = '') -> Figure:
  """Exact-match accuracy against prompt length, one line per task: {task: {length: acc}}."""
  fig = _figure(7, 3.6)
  ax = fig.subplots()
  for task, acc in accuracy.items():
    n = sorted((x for x in acc if acc[x] is not None), key=int)  # None: the task did not fit
    ax.plot([int(x) for x in n], [100 * acc[x] for x in n], marker='o', label=task)
  ax.set_xscale('log', base=2)
  ax.set(xlabel='prompt length (tokens)', ylabel='exact match (%)', ylim=(-2, 102), title=title)
  ax.legend(fontsize=8)
  return fig
