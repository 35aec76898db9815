"""`--mode=compare RUN1 RUN2 ...`: the paper's table (variant, gate score, M-Act, F-Attn, PPL)
and side-by-side figures (per-layer F-Attn, per-layer M-Act, loss curves) for several runs.

Each run's numbers come from RUN/analysis/report.json (run `--mode=analyze` first). A run not
analysed yet falls back to its last validation row in metrics.jsonl, which the training loop
computes on the first held-out batch only; such rows are marked in the table. modes/compare.py
reads the run directories; this module builds the rows, the table and the figures.

A run trained on a mixture (data.mixture) adds a column per source: its validation loss at the
run's last evaluation (`loss/<name>` of the last validation row in metrics.jsonl).

Writes OUT/compare.md, OUT/compare.json, OUT/f_attn_per_layer.png, OUT/m_act_per_layer.png and
OUT/loss_curves.png; returns the markdown.
"""

import json
import os

from gated_attention import storage
from gated_attention.analysis import goodput as goodput_lib
from gated_attention.analysis import plots

COLUMNS = ('variant', 'gate score', 'M-Act', 'F-Attn', 'PPL')
_FALLBACK_MARK = '*'


def _fmt(x, spec):
  return '-' if x is None else format(x, spec)


def run_summary(workdir: str, variant: str, rows: list[dict], rep: dict | None,
                sessions: list[dict] | None = None) -> dict:
  """One run's row: from its analysis report `rep`, else the last validation row of its
  metrics `rows`; with its goodput columns from its sessions' time accounts."""
  out = {'workdir': workdir, 'variant': variant,
         'metrics': rows, 'source': None, 'step': None, 'gate_score': None, 'm_act': None,
         'f_attn': None, 'ppl': None, 'f_attn_per_layer': None, 'm_act_per_layer': None,
         'sessions': len(sessions or []), 'source_loss': {},
         **goodput_lib.columns(goodput_lib.summarize(sessions) if sessions else None)}
  val = [r for r in rows if r.get('split') == 'val']
  if val:   # a mixture's per-source validation losses (metrics.jsonl holds them)
    out['source_loss'] = {k.split('/', 1)[1]: v for k, v in val[-1].items()
                          if k.startswith('loss/')}
  if rep is not None:
    out.update(source='analysis', step=rep.get('step'), gate_score=rep.get('gate_score_mean'),
               m_act=rep.get('m_act_mean'), f_attn=rep.get('f_attn_mean'), ppl=rep.get('ppl'),
               f_attn_per_layer=rep.get('f_attn'),
               m_act_per_layer=(rep.get('m_act') or {}).get('ffn_residual'))
    return out
  if val:
    last = val[-1]
    out.update(source='metrics', step=last.get('step'), gate_score=last.get('gate_score_mean'),
               m_act=last.get('m_act_mean'), f_attn=last.get('f_attn_mean'),
               ppl=last.get('ppl'), f_attn_per_layer=last.get('f_attn'),
               m_act_per_layer=last.get('m_act'))
  return out


def _names(summaries) -> list[str]:
  """Variant names, made unique with the run directory's name where variants repeat."""
  variants = [s['variant'] for s in summaries]
  names = []
  for s in summaries:
    name = s['variant']
    if variants.count(name) > 1:
      name = f'{name} ({os.path.basename(os.path.normpath(s["workdir"]))})'
    names.append(name)
  return names


def source_columns(summaries) -> list[str]:
  """The mixture sources any run has a validation loss for, sorted."""
  return sorted({name for s in summaries for name in s.get('source_loss') or {}})


def markdown_table(summaries, names) -> str:
  sources = source_columns(summaries)
  columns = COLUMNS + tuple(f'val loss {name}' for name in sources) + ('step', 'run')
  lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
  fallback = False
  for s, name in zip(summaries, names):
    mark = ''
    if s['source'] == 'metrics':
      mark, fallback = _FALLBACK_MARK, True
    losses = s.get('source_loss') or {}
    cells = [name + mark, _fmt(s['gate_score'], '.3f'), _fmt(s['m_act'], '.1f'),
             _fmt(s['f_attn'], '.3f'), _fmt(s['ppl'], '.3f'),
             *(_fmt(losses.get(src), '.4f') for src in sources), _fmt(s['step'], 'd'),
             f'`{s["workdir"]}`']
    lines.append('| ' + ' | '.join(cells) + ' |')
  notes = []
  if fallback:
    notes.append(f'({_FALLBACK_MARK}) not analysed yet: last validation metrics of training '
                 '(F-Attn, M-Act and gate score of the first held-out batch); run '
                 '`python main.py --mode=analyze --workdir=RUN` for the full analysis.')
  if any(s['source'] is None for s in summaries):
    notes.append('"-" in every column: no analysis and no validation metrics in that run yet.')
  notes.append('gate score: mean gate activation over layers (- for ungated runs); M-Act: max '
               '|h| of each layer\'s output, averaged over layers; F-Attn: attention to the first '
               'token, averaged over heads, queries 1..T-1 and layers; PPL: validation '
               'perplexity.')
  if sources:
    notes.append('val loss <source>: a mixture\'s validation loss on that source\'s held-out '
                 'documents at the run\'s last evaluation (metrics.jsonl; - where a run has no '
                 'such source).')
  return '\n'.join(lines) + '\n\n' + '\n'.join(f'- {n}' for n in notes) + '\n'


_TIME_COLUMNS = (('goodput', 'goodput'), ('wall_h', 'wall (h)'), ('compile_frac', 'compile'),
                 ('data_wait_frac', 'data wait'), ('eval_frac', 'eval'),
                 ('checkpoint_frac', 'checkpoint'), ('lost_frac', 'lost to restarts'))


def time_table(summaries, names) -> str:
  """Where each run's wall time went (analysis/goodput.py): goodput and the shares of the
  wall time, over all its sessions; '-' for a run that kept no account."""
  lines = ['| run | sessions | ' + ' | '.join(t for _, t in _TIME_COLUMNS) + ' |',
           '|' + '---|' * (len(_TIME_COLUMNS) + 2)]
  for s, name in zip(summaries, names):
    cells = [name, str(s.get('sessions', 0))]
    for key, _ in _TIME_COLUMNS:
      v = s.get(key)
      cells.append('-' if v is None else (f'{v:.3f}' if key == 'wall_h' else f'{100 * v:.1f}%'))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return ('\n'.join(lines) + '\n\n- goodput: productive step time (less the steps trained '
          'again after a restart) over the wall time of every session; the other columns: '
          'shares of that wall time (docs/performance.md, analysis/goodput.py).\n')


def compare(summaries: list[dict], out_dir: str) -> str:
  """Writes the comparison of the runs' `summaries` (run_summary) into `out_dir`; returns the
  markdown table."""
  if not summaries:
    raise ValueError('compare() needs at least one run.')
  names = _names(summaries)
  storage.makedirs(out_dir)
  md = '# Gated-attention runs compared\n\n' + markdown_table(summaries, names)
  md += '\n## Where the time went\n\n' + time_table(summaries, names)
  figures = {
      'f_attn_per_layer.png': plots.per_layer_compare_figure(
          {n: s['f_attn_per_layer'] for n, s in zip(names, summaries)},
          'F-Attn (attention to token 0)', title='F-Attn per layer'),
      'm_act_per_layer.png': plots.per_layer_compare_figure(
          {n: s['m_act_per_layer'] for n, s in zip(names, summaries)},
          'max |h| of the layer output', log=True, title='M-Act per layer'),
      'loss_curves.png': plots.loss_curves_figure(
          {n: s['metrics'] for n, s in zip(names, summaries)}),
  }
  for name, fig in figures.items():
    plots.save(fig, storage.join(out_dir, name))
  md += '\n' + '\n'.join(f'![{name}]({name})' for name in figures) + '\n'
  storage.write(storage.join(out_dir, 'compare.md'), md)
  table = [{k: v for k, v in s.items() if k != 'metrics'} | {'name': n}
           for s, n in zip(summaries, names)]
  storage.write(storage.join(out_dir, 'compare.json'),
                json.dumps({'runs': table, 'figures': sorted(figures)}, indent=1))
  return md
