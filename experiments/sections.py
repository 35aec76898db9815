"""An experiment's write-up: results.md, summary.json and the figures in the output directory,
and its section of a results file (docs/results.md) with the command, commits and wall time.
"""

import json
import os

from experiments import (divergence, figures, paired, processes, rundata, scaling, spec, stability,
                         tables)
from experiments.rundata import Result
from gated_attention import storage
from gated_attention.analysis import plots


def figure_names(experiment) -> tuple[str, ...]:
  return (figures.FIGURES + ((figures.LONG_CONTEXT_FIGURE,) if experiment.long_context else ())
          + ((scaling.FIGURE,) if experiment.scaling else ())
          + ((stability.FIGURE,) if experiment.stability else ())
          + ((divergence.FIGURE,) if experiment.second_cutoff is not None else ()))


def write(experiment, results: list[Result], out_dir: str, header: str) -> str:
  """Writes results.md, summary.json and the figures into out_dir; returns the markdown."""
  storage.makedirs(out_dir)
  made = {'f_attn_layers.png': figures.per_layer_figure(experiment, results, 'f_attn_layers',
                                                        'F-Attn (attention to token 0)'),
          'm_act_layers.png': figures.per_layer_figure(experiment, results, 'm_act_layers',
                                                       'M-Act (max |h|, layer output)', log=True),
          'loss_curves.png': figures.loss_figure(experiment, results),
          'training_curves.png': figures.training_curves_figure(experiment, results),
          'seeds.png': figures.seeds_figure(experiment, results)}
  if experiment.long_context:
    made[figures.LONG_CONTEXT_FIGURE] = figures.long_context_figure(experiment, results)
  if experiment.scaling:
    made[scaling.FIGURE] = scaling.figure(results)
  if experiment.stability:
    made[stability.FIGURE] = stability.figure(experiment, results)
  if experiment.second_cutoff is not None:
    made[divergence.FIGURE] = divergence.figure(experiment, results)
  for name, fig in made.items():
    plots.save(fig, storage.join(out_dir, name))
  summary_json = tables.summary(experiment, results)
  if experiment.formed_below is not None:
    summary_json['_formed'] = tables.formation_counts(experiment, results)
  if experiment.stability:
    counts = stability.failures(experiment, results)
    summary_json['_stability'] = {'groups': counts,
                                  'largest_stable': stability.largest_stable(counts)}
  if experiment.second_cutoff is not None:
    summary_json['_divergence'] = divergence.summary(experiment, results)
  if experiment.paired:
    summary_json['_paired'] = paired.summary(experiment, results)
  if experiment.scaling:
    summary_json['_scaling'] = {'fits': scaling.fits(results), 'gaps': scaling.gaps(results)}
  storage.write(storage.join(out_dir, 'summary.json'), json.dumps(summary_json, indent=1))
  text = f'{header}\n\n{tables.table(experiment, results)}\n'
  if experiment.formed_below is not None:
    text += f'\n{tables.formation(experiment, results)}\n'
  if experiment.stability:
    text += f'\n{stability.table(experiment, results)}\n'
  if experiment.second_cutoff is not None:
    text += f'\n{divergence.table(experiment, results)}\n'
  if experiment.paired:
    text += f'\n{paired.table(experiment, results)}\n'
  if experiment.long_context:
    text += f'\n{tables.long_context_tables(experiment, results)}\n'
  if experiment.scaling:
    text += f'\nScaling (experiments/scaling.py):\n\n{scaling.tables(results)}\n'
  storage.write(storage.join(out_dir, 'results.md'),
                f'# {experiment.title}\n\n{text}\n' +
                ''.join(f'![{n}]({n})\n' for n in figure_names(experiment)))
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


def header(experiment, results, wall_seconds: float) -> str:
  train = sum(r.runner.get(k, 0) for r in results for k in rundata.SECONDS)
  path = os.path.abspath(experiment.path)
  if path.startswith(spec.REPO + os.sep):
    path = os.path.relpath(path, spec.REPO)
  command = spec.shell(['-m', 'experiments.run', path], 'python')
  return (f'## {experiment.title}\n\n{experiment.description}\n\n'
          f'Command: `{command}` (scale `{experiment.scale}`, {len(experiment.runs)} runs)  \n'
          f'Commit: {commits(results)}, {processes.now()}  \n'
          f'Wall time: {train / 60:.1f} min of training and evaluation summed over runs; '
          f'this invocation {wall_seconds / 60:.1f} min.').replace('\n\n\n', '\n\n')


def commits(results) -> str:
  """The commit the table is made at, and the ones its runs were trained at when they differ."""
  now = processes.git_commit()
  trained = sorted({r.runner['git_commit'] for r in results if r.runner.get('git_commit')})
  if not trained or trained == [now]:
    return f'`{now}`'
  return f'`{now}` (runs trained at {", ".join(f"`{c}`" for c in trained)})'


def publish(experiment, out: str, results_path: str, body: str):
  """Copies the figures next to results_path (figures/<name>/) and writes the section."""
  fig_dir = os.path.join(os.path.dirname(os.path.abspath(results_path)), 'figures',
                         experiment.name)
  os.makedirs(fig_dir, exist_ok=True)
  links = []
  for name in figure_names(experiment):
    with open(os.path.join(fig_dir, name), 'wb') as f:    # OUT may be on object storage
      f.write(storage.read_bytes(storage.join(out, name)))
    links.append(f'![{name}](figures/{experiment.name}/{name})')
  update_section(results_path, experiment.name, body + '\n' + '\n'.join(links) + '\n')
