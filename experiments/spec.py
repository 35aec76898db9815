"""Experiment files: what they hold, how they expand into runs, and each run's commands.

An experiment is a Python file under experiments/ with these module-level names:

  VARIANTS = ['baseline', 'g1_elementwise']   # config files configs/<variant>.py (required)
  SEEDS = [0, 1, 2]                           # --config.seed of each run (default [0])
  SCALE = 'tiny'                              # the config-string argument (default 'tiny')
  OVERRIDES = {'train.steps': 600}            # --config.<key>=<value> for every run
  GRID = {'train.learning_rate': [1e-3, 3e-3]}  # optional: one group per combination
  VARIANT_OVERRIDES = {'g1_elementwise': {...}}  # optional: extra overrides of one variant
  ANALYZE_OVERRIDES = {'data.val_batches': 8}    # optional: --config.X of --mode=analyze
  COLUMNS = ['val_loss', 'f_attn_mean', ...]     # table columns (experiments/report.py METRICS)
  PER_SEED = ['f_attn_max']                      # optional: columns that list each seed's value
  POINTS = [{'model.num_heads': 2}, {...}]       # optional: one group per dict of overrides
                                                 # (a one-factor-at-a-time sweep; with GRID,
                                                 # every point x every grid combination)
  TITLE = '...'; DESCRIPTION = '...'             # optional: the heading and text in results.md

Long context (optional; Qiu et al. 2025, Table 5):
  EXTEND = 'seq_len=1024,rope_base=1e6,steps=300'  # continue each run at a longer context:
                                                   # configs/extend_context.py:<run>,<EXTEND>
  LONG_CONTEXT = {'rope': {}, 'yarn': {'model.rope_scaling.type': 'yarn', ...}}
                                                   # --mode=long_context of the (extended) run,
                                                   # one evaluation per label, its overrides
  LONG_CONTEXT_OVERRIDES = {'long_context.lengths': '256,1024,4096'}  # of every evaluation

Runs are VARIANTS x POINTS x GRID combinations x SEEDS; a group is one (variant, grid point), and the
table reports each column's mean ± std over the group's seeds.
"""

import dataclasses
import importlib.util
import itertools
import os
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COLUMNS = ('val_loss', 'f_attn_mean', 'f_attn_max', 'm_act_mean', 'gate_score_mean',
                   'train_minutes')


class ExperimentError(ValueError):
  """An experiment file that cannot be run; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: `name` is its directory under <out>/runs/."""
  name: str
  group: str
  variant: str
  seed: int
  overrides: tuple[tuple[str, object], ...]

  def train_args(self, scale: str, workdir: str) -> list[str]:
    """main.py's arguments that train this run in `workdir` (resuming if it has checkpoints)."""
    return ['main.py', f'--config=configs/{self.variant}.py:{scale}', f'--workdir={workdir}',
            f'--config.seed={self.seed}'] + [f'--config.{k}={_flag(v)}' for k, v in self.overrides]


def seeds_train_args(runs, scale: str, workdir: str) -> list[str]:
  """main.py's arguments that train the seeds of `runs` (one group: one variant and overrides)
  as one program (--seeds); `workdir` holds {seed}, where each seed's number goes."""
  first = runs[0]
  if any((r.group, r.variant, r.overrides) != (first.group, first.variant, first.overrides)
         for r in runs):
    raise ValueError(f'seeds_train_args: {[r.name for r in runs]} are not one group.')
  return ['main.py', f'--config=configs/{first.variant}.py:{scale}', f'--workdir={workdir}',
          '--seeds=' + ','.join(str(r.seed) for r in runs)] + [
              f'--config.{k}={_flag(v)}' for k, v in first.overrides]


@dataclasses.dataclass
class Experiment:
  name: str
  path: str
  title: str
  description: str
  scale: str
  runs: list[Run]
  columns: list[str]
  analyze_overrides: dict
  per_seed: tuple = ()
  extend: str = ''
  long_context: dict = dataclasses.field(default_factory=dict)
  long_context_overrides: dict = dataclasses.field(default_factory=dict)

  def analyze_args(self, workdir: str) -> list[str]:
    return ['main.py', '--mode=analyze', f'--workdir={workdir}'] + [
        f'--config.{k}={_flag(v)}' for k, v in self.analyze_overrides.items()]

  def extend_args(self, workdir: str, extended: str) -> list[str]:
    """Continues the run in `workdir` at a longer context, in `extended`."""
    arg = workdir + (f',{self.extend}' if self.extend else '')
    return ['main.py', f'--config=configs/extend_context.py:{arg}', f'--workdir={extended}']

  def long_context_args(self, workdir: str, label: str) -> list[str]:
    """--mode=long_context of `workdir` for the evaluation `label`, written to
    <workdir>/long_context/<label>/."""
    overrides = {**self.long_context_overrides, **self.long_context[label],
                 'long_context.tag': label}
    return ['main.py', '--mode=long_context', f'--workdir={workdir}'] + [
        f'--config.{k}={_flag(v)}' for k, v in overrides.items()]

  def groups(self) -> list[str]:
    return list(dict.fromkeys(r.group for r in self.runs))


def _flag(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def _label(key: str, value) -> str:
  return f'{key.rsplit(".", 1)[-1]}={_flag(value)}'


def _module(path: str):
  if not os.path.isfile(path):
    raise ExperimentError(f'{path!r} does not exist; pass an experiment file such as '
                          'experiments/sink_synthetic.py.')
  spec = importlib.util.spec_from_file_location(f'_experiment_{abs(hash(path))}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _check_long_context(path: str, m):
  labels = dict(getattr(m, 'LONG_CONTEXT', {}))
  for label, overrides in labels.items():
    if not label or not label.replace('_', '').replace('-', '').isalnum():
      raise ExperimentError(f'{path}: LONG_CONTEXT label {label!r} must be a name of letters, '
                            'digits, - and _ (it names a directory).')
    if not isinstance(overrides, dict):
      raise ExperimentError(f'{path}: LONG_CONTEXT[{label!r}] must be a dict of overrides.')
  if getattr(m, 'EXTEND', '') and not labels:
    raise ExperimentError(f'{path}: EXTEND without LONG_CONTEXT evaluates nothing; add '
                          "LONG_CONTEXT = {'rope': {}}.")
  return labels


def _check_points(path: str, points) -> list[dict]:
  if not isinstance(points, (list, tuple)) or not all(isinstance(p, dict) for p in points):
    raise ExperimentError(f'{path}: POINTS must be a list of dicts of overrides, e.g. '
                          "[{}, {'model.num_heads': 2}].")
  labels = [_point_label(p) for p in points]
  if len(set(labels)) != len(labels):
    raise ExperimentError(f'{path}: POINTS has a repeated point ({labels}); each names a group.')
  return [dict(p) for p in points] or [{}]


def _point_label(point: dict) -> str:
  return '_'.join(_label(k, v) for k, v in point.items())


def _check(path: str, variants, seeds, columns, known_columns):
  if not variants:
    raise ExperimentError(f'{path}: VARIANTS must list at least one config name.')
  for v in variants:
    if not os.path.isfile(os.path.join(REPO, 'configs', f'{v}.py')):
      raise ExperimentError(f'{path}: VARIANTS names {v!r}, but configs/{v}.py does not exist.')
  if not seeds or len(set(seeds)) != len(seeds):
    raise ExperimentError(f'{path}: SEEDS must be a non-empty list of distinct integers.')
  unknown = [c for c in columns if c not in known_columns]
  if unknown:
    raise ExperimentError(f'{path}: unknown COLUMNS {unknown}; known: {", ".join(known_columns)}.')


def load(path: str, known_columns) -> Experiment:
  """Reads and checks an experiment file; `known_columns` are the metric names of the table."""
  m = _module(path)
  variants, seeds = list(getattr(m, 'VARIANTS', [])), [int(s) for s in getattr(m, 'SEEDS', [0])]
  columns = list(getattr(m, 'COLUMNS', DEFAULT_COLUMNS))
  _check(path, variants, seeds, columns, known_columns)
  common, grid = dict(getattr(m, 'OVERRIDES', {})), dict(getattr(m, 'GRID', {}))
  per_variant = dict(getattr(m, 'VARIANT_OVERRIDES', {}))
  points = _check_points(path, getattr(m, 'POINTS', []))
  per_seed = tuple(getattr(m, 'PER_SEED', ()))
  if set(per_seed) - set(columns):
    raise ExperimentError(f'{path}: PER_SEED names {sorted(set(per_seed) - set(columns))}, '
                          'which are not in COLUMNS.')
  runs = []
  for variant in variants:
    for chosen in points:
      for point in itertools.product(*[[(k, v) for v in vs] for k, vs in grid.items()]):
        labels = [_point_label(chosen)] if chosen else []
        group = '_'.join([variant] + labels + [_label(k, v) for k, v in point])
        overrides = {**common, **per_variant.get(variant, {}), **chosen, **dict(point)}
        for seed in seeds:
          runs.append(Run(f'{group}_s{seed}', group, variant, seed, tuple(overrides.items())))
  name = getattr(m, 'NAME', os.path.splitext(os.path.basename(path))[0])
  doc = (m.__doc__ or '').strip()
  return Experiment(name=name, path=path, title=getattr(m, 'TITLE', doc.split('\n')[0] or name),
                    description=getattr(m, 'DESCRIPTION', '\n'.join(doc.split('\n')[1:]).strip()),
                    scale=getattr(m, 'SCALE', 'tiny'), runs=runs, columns=columns,
                    analyze_overrides=dict(getattr(m, 'ANALYZE_OVERRIDES', {})),
                    per_seed=per_seed,
                    extend=str(getattr(m, 'EXTEND', '')),
                    long_context=_check_long_context(path, m),
                    long_context_overrides=dict(getattr(m, 'LONG_CONTEXT_OVERRIDES', {})))


def shell(args: list[str], python: str = '') -> str:
  """One shell line running `args` with `python` (default: this interpreter)."""
  return shlex.join([python or sys.executable] + list(args))
