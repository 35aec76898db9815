"""An experiment's results: the table (mean ± std over seeds), the figures, the results.md section.

Each run directory holds what main.py writes (config.json, metrics.jsonl, analysis/report.json)
and the runner's runner.json (status, commands, wall times). Nothing here trains or analyses.
"""

import dataclasses
import json
import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gated_attention.analysis import metrics as metrics_lib
from gated_attention.analysis import plots
from gated_attention.analysis import runs as runs_lib

RUNNER_FILE = 'runner.json'
FIGURES = ('f_attn_layers.png', 'm_act_layers.png', 'loss_curves.png')


@dataclasses.dataclass
class Result:
  """What one run left behind; `report` is None until its analysis has run."""
  run: object  # spec.Run
  runner: dict
  report: dict | None
  rows: list[dict]

  @property
  def status(self) -> str:
    return self.runner.get('status', 'missing')


def _last_train_loss(res: Result):
  losses = [r['loss'] for r in res.rows if r.get('split') == 'train' and r.get('loss') is not None]
  return losses[-1] if losses else None


def _from_report(key, reduce=None):
  def get(res: Result):
    if res.report is None or res.report.get(key) is None:
      return None
    value = res.report[key]
    return reduce(value) if reduce else value
  return get


def _seconds(key):
  return lambda res: res.runner[key] / 60 if res.runner.get(key) is not None else None


# name -> (column heading, value of a Result (float, list for per-layer values, or None), format)
METRICS = {
    'val_loss': ('val loss', _from_report('loss'), '.3f'),
    'ppl': ('PPL', _from_report('ppl'), '.3f'),
    'train_loss': ('final train loss', _last_train_loss, '.3f'),
    'f_attn_mean': ('F-Attn', _from_report('f_attn_mean'), '.3f'),
    'f_attn_max': ('F-Attn max layer', _from_report('f_attn', max), '.3f'),
    'f_attn_layers': ('F-Attn per layer', _from_report('f_attn'), '.2f'),
    'm_act_mean': ('M-Act', _from_report('m_act_mean'), '.1f'),
    'm_act_layers': ('M-Act per layer', _from_report('m_act', lambda m: m['ffn_residual']), '.0f'),
    'gate_score_mean': ('gate score', _from_report('gate_score_mean'), '.3f'),
    # the guard's spikes as the analysis counts them (metrics.stability, every attempt's rows)
    'loss_spikes': ('loss spikes', _from_report('stability', lambda s: s['spikes']), '.1f'),
    'train_minutes': ('train min', _seconds('train_seconds'), '.1f'),
}


def read_runner(workdir: str) -> dict:
  """The run's runner.json ({} when there is none)."""
  path = os.path.join(workdir, RUNNER_FILE)
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


def read(run, workdir: str) -> Result:
  runner = read_runner(workdir)
  report_path = os.path.join(workdir, runs_lib.ANALYSIS_DIR, 'report.json')
  report = None
  if runner.get('status') == 'done' and os.path.isfile(report_path):
    with open(report_path) as f:
      report = json.load(f)
  return Result(run, runner, report, runs_lib.read_metrics(workdir))


def _cell(values: list, fmt: str) -> str:
  values = [v for v in values if v is not None]
  if not values:
    return '-'
  if isinstance(values[0], list):  # per-layer: the mean over seeds of each layer
    return ' / '.join(format(x, fmt) for x in np.mean(np.asarray(values, float), axis=0))
  mean = format(float(np.mean(values)), fmt)
  return mean if len(values) == 1 else f'{mean} ± {format(float(np.std(values, ddof=1)), fmt)}'


def _runs_cell(results: list[Result]) -> str:
  done = sum(r.status == 'done' for r in results)
  other = sorted({r.status for r in results} - {'done'})
  counts = ', '.join(f'{sum(r.status == s for r in results)} {s}' for s in other)
  return f'{done}/{len(results)}' + (f' ({counts})' if counts else '')


def by_group(experiment, results: list[Result]) -> dict[str, list[Result]]:
  return {g: [r for r in results if r.run.group == g] for g in experiment.groups()}


def table(experiment, results: list[Result]) -> str:
  """Markdown: one row per group, each column's mean ± std (sample std) over its seeds."""
  heads = ['run', 'seeds done'] + [METRICS[c][0] for c in experiment.columns]
  lines = ['| ' + ' | '.join(heads) + ' |', '|' + '---|' * len(heads)]
  for group, rs in by_group(experiment, results).items():
    done = [r for r in rs if r.status == 'done']
    cells = [_cell([METRICS[c][1](r) for r in done], METRICS[c][2]) for c in experiment.columns]
    lines.append('| ' + ' | '.join([group, _runs_cell(rs)] + cells) + ' |')
  return '\n'.join(lines)


def summary(experiment, results: list[Result]) -> dict:
  """JSON: per group, every metric's per-seed values, mean and std."""
  out = {}
  for group, rs in by_group(experiment, results).items():
    done = [r for r in rs if r.status == 'done']
    entry = {'runs': {r.run.name: r.status for r in rs}}
    for name, (_, get, _) in METRICS.items():
      values = [get(r) for r in done]
      entry[name] = {'values': values}
      kept = [v for v in values if v is not None]
      if kept:
        arr = np.asarray(kept, float)
        entry[name].update(mean=np.mean(arr, axis=0).tolist(),
                           std=(np.std(arr, axis=0, ddof=1) if len(kept) > 1
                                else np.zeros_like(arr[0])).tolist())
    out[group] = entry
  return out


def _figure(width: float, height: float, ncols: int = 1):
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


def per_layer_figure(experiment, results, metric: str, ylabel: str, log: bool = False) -> Figure:
  """One line per group: the per-layer `metric` (f_attn_layers, m_act_layers) over seeds."""
  fig, (ax,) = _figure(7, 4)
  seq_lens = set()
  for i, (group, rs) in enumerate(by_group(experiment, results).items()):
    values = [METRICS[metric][1](r) for r in rs if r.status == 'done']
    values = [[np.nan if x is None else x for x in v] for v in values if v is not None]
    seq_lens |= {r.report['seq_len'] for r in rs if r.report}
    if values and len({len(v) for v in values}) == 1:
      _band(ax, np.arange(len(values[0])), values, f'C{i % 10}', group, marker='o')
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
  fig, axes = _figure(11, 4, ncols=2)
  for ax, split in zip(axes, ('train', 'val')):
    for i, (group, rs) in enumerate(by_group(experiment, results).items()):
      curves = [_curve(r.rows, split) for r in rs if r.rows]
      steps = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
      if steps:
        _band(ax, steps, [[c[s] for s in steps] for c in curves], f'C{i % 10}', group,
              marker='o' if split == 'val' else None)
    ax.set(xlabel='step', ylabel='loss (nats/token)', title=f'{split} loss (mean ± std)')
    if ax.lines:
      ax.legend(fontsize=7)
  return fig


def write(experiment, results: list[Result], out_dir: str, header: str) -> str:
  """Writes results.md, summary.json and the figures into out_dir; returns the markdown."""
  os.makedirs(out_dir, exist_ok=True)
  figures = {'f_attn_layers.png': per_layer_figure(experiment, results, 'f_attn_layers',
                                                   'F-Attn (attention to token 0)'),
             'm_act_layers.png': per_layer_figure(experiment, results, 'm_act_layers',
                                                  'M-Act (max |h|, layer output)', log=True),
             'loss_curves.png': loss_figure(experiment, results)}
  for name, fig in figures.items():
    plots.save(fig, os.path.join(out_dir, name))
  with open(os.path.join(out_dir, 'summary.json'), 'w') as f:
    json.dump(summary(experiment, results), f, indent=1)
  text = f'{header}\n\n{table(experiment, results)}\n'
  with open(os.path.join(out_dir, 'results.md'), 'w') as f:
    f.write(f'# {experiment.title}\n\n{text}\n' + ''.join(f'![{n}]({n})\n' for n in FIGURES))
  return text


def update_section(path: str, name: str, body: str):
  """Replaces the section of experiment `name` in the markdown file `path`, or appends it."""
  start, end = f'<!-- experiment:{name} -->', f'<!-- /experiment:{name} -->'
  section = f'{start}\n{body.rstrip()}\n{end}\n'
  text = open(path).read() if os.path.isfile(path) else '# Results\n\n'
  if start in text and end in text:
    head, rest = text.split(start, 1)
    text = head + section + rest.split(end, 1)[1].lstrip('\n')
  else:
    text = text.rstrip('\n') + '\n\n' + section
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)
