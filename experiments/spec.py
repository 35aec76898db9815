"""Experiment files: what they hold, how they expand into runs, and each run's commands.

An experiment is a Python file under experiments/ with these module-level names:

  VARIANTS = ['baseline', 'g1_elementwise']   # config files configs/<variant>.py (required)
  SEEDS = [0, 1, 2]                           # --config.seed of each run (default [0])
  SCALE = 'tiny'                              # the config-string argument (default 'tiny')
  OVERRIDES = {'train.steps': 600}            # --config.<key>=<value> for every run
  GRID = {'train.learning_rate': [1e-3, 3e-3]}  # optional: one group per combination
  VARIANT_OVERRIDES = {'g1_elementwise': {...}}  # optional: extra overrides of one variant
  ANALYZE_OVERRIDES = {'data.val_batches': 8}    # optional: --config.X of --mode=analyze
  COLUMNS = ['val_loss', 'f_attn_mean', ...]     # table columns (experiments/rundata.py METRICS)
  PER_SEED = ['f_attn_max']                      # optional: columns that list each seed's value
  POINTS = [{'model.num_heads': 2}, {...}]       # optional: one group per dict of overrides
                                                 # (a one-factor-at-a-time sweep; with GRID,
                                                 # every point x every grid combination)
  POINT_NAMES = ['h2', ...]                      # optional: the points' names in group names
                                                 # (default: their overrides, key=value_...)
  TITLE = '...'; DESCRIPTION = '...'             # optional: the heading and text in results.md
  SCALING = True                                 # optional: loss against size and compute,
                                                 # power laws per variant (experiments/scaling.py)
  STABILITY = True                               # optional: per group, the runs that failed to
                                                 # train (halted by the guard, or final validation
                                                 # loss above DIVERGED_ABOVE) with the rate's Wilson
                                                 # interval, Fisher's exact test against the
                                                 # baseline at the same learning rate, spike steps
                                                 # per run, and the largest learning rate that trains
                                                 # on every seed, per variant
  DIVERGED_ABOVE = 3.24                          # optional, with STABILITY: a finished run above
                                                 # this final validation loss failed (collapsed)
  SECOND_CUTOFF = 2.8                            # optional, with DIVERGED_ABOVE: the failures
                                                 # counted again at this cutoff (the verdict at two)
  SPIKES_AFTER_WARMUP = True                     # optional, with STABILITY: count only the spike
                                                 # steps after each run's train.warmup_steps
  PAIRED = 'baseline'                            # optional: each variant's validation loss
                                                 # against this variant's, paired by seed
                                                 # (experiments/paired.py)
  PAIRED_METRICS = ['val_loss', 'f_attn_max']   # optional, with PAIRED: the metrics compared so
                                                 # (default the validation loss alone)
  PAPER = {'g1_elementwise': 0.265}              # optional, with PAIRED: the paper's difference
                                                 # (the same sign) per variant, for the rank
                                                 # agreement (Kendall's tau); PAPER_LABEL names it
  FORMED_BELOW = 1.17                            # optional: a run whose final validation loss is
                                                 # below this has formed the capability the
                                                 # task tests (e.g. retrieval): the table counts
                                                 # such runs per group (Wilson interval), each
                                                 # one's first evaluation below it, Fisher's
                                                 # exact test against the first group, and the
                                                 # long-context tables a row over them alone

Long context (optional; Qiu et al. 2025, Table 5):
  EXTEND = 'seq_len=1024,rope_base=1e6,steps=300'  # continue each run at a longer context:
                                                   # configs/extend_context.py:<run>,<EXTEND>
  LONG_CONTEXT = {'rope': {}, 'yarn': {'model.rope_scaling.type': 'yarn', ...}}
                                                   # --mode=long_context of the (extended) run,
                                                   # one evaluation per label, its overrides
  LONG_CONTEXT_OVERRIDES = {'long_context.lengths': '256,1024,4096'}  # of every evaluation

Inference (optional; issue 53, experiments/inference.py): with LONG_CONTEXT labels full / window /
sinks (a full cache and two sliding-window caches), the streaming tables, and
  QUANTIZATION = {'quantization.group_size': 32}   # --mode=quantization of every run, its
                                                   # overrides (--config.quantization.* ...)

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
  scaling: bool = False
  formed_below: float | None = None
  stability: bool = False
  diverged_above: float | None = None
  second_cutoff: float | None = None
  spikes_after_warmup: bool = False
  paired: str | None = None
  paired_metrics: tuple = ('val_loss',)
  paper: dict = dataclasses.field(default_factory=dict)
  paper_label: str = ''
  quantization: dict = dataclasses.field(default_factory=dict)

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

  def quantization_args(self, workdir: str) -> list[str]:
    """--mode=quantization of `workdir` with QUANTIZATION's overrides (RUN/quantization/)."""
    return ['main.py', '--mode=quantization', f'--workdir={workdir}'] + [
        f'--config.{k}={_flag(v)}' for k, v in self.quantization.items()]

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
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ExperimentError(f'{path} does not parse: {e.msg} at line {e.lineno}: '
                          f'{(e.text or "").strip()}') from e
  except Exception as e:  # pylint: disable=broad-except  # the file's own code raised
    where = _where(path, e)
    raise ExperimentError(f'{path} raised {type(e).__name__} when it was read{where}: {e}. Fix '
                          'the file (an experiment file only sets module-level names).') from e
  return module


def _where(path: str, e: BaseException) -> str:
  """' (line N: code)' of the innermost frame of `e` in `path`."""
  import traceback  # pylint: disable=g-import-not-at-top
  frames = [f for f in traceback.extract_tb(e.__traceback__)
            if os.path.abspath(f.filename) == os.path.abspath(path)]
  return f' (line {frames[-1].lineno}: {frames[-1].line})' if frames else ''


_SCALAR = (bool, int, float, str)


def _overrides(path: str, name: str, value) -> dict:
  """A dict of 'section.field' -> a number, string or bool (what --config.X= takes)."""
  if not isinstance(value, dict):
    raise ExperimentError(f'{path}: {name} must be a dict of overrides, e.g. '
                          f"{{'train.steps': 600}}; it is a {type(value).__name__}.")
  for key, v in value.items():
    if not isinstance(key, str) or not key or key.startswith('.') or ' ' in key:
      raise ExperimentError(f'{path}: {name} has the key {key!r}; keys are config fields such '
                            "as 'train.steps'.")
    if not isinstance(v, _SCALAR):
      raise ExperimentError(f'{path}: {name}[{key!r}] = {v!r} is a {type(v).__name__}; give a '
                            'number, string or bool (what --config.X=... takes).')
  return dict(value)


def _names(path: str, name: str, value, default) -> list[str]:
  value = default if value is None else value
  if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
      isinstance(v, str) for v in value):
    example = list(default)[:2] or ['baseline']
    raise ExperimentError(f'{path}: {name} must be a list of names, e.g. {example}; it is '
                          f'{value!r}.')
  return list(value)


def _seeds(path: str, value) -> list[int]:
  if (isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, range))
      or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)):
    raise ExperimentError(f'{path}: SEEDS must be a list of distinct integers, e.g. [0, 1, 2]; '
                          f'it is {value!r}.')
  return [int(s) for s in value]


def _check_keys(path: str, variants, scale, override_sets):
  """Every override names a field of each variant's config (a typo such as 'train.stepz' would
  fail every run at its start)."""
  for variant in variants:
    try:
      config = importlib.import_module(f'configs.{variant}').get_config(scale).to_dict()
    except Exception as e:  # pylint: disable=broad-except
      raise ExperimentError(f'{path}: configs/{variant}.py:{scale} cannot be made: '
                            f'{type(e).__name__}: {e}') from e
    for name, overrides in override_sets:
      unknown = [k for k in overrides if not _has_field(config, k)]
      if unknown:
        raise ExperimentError(f'{path}: {name} names {unknown}, which configs/{variant}.py does '
                              'not have; check the spelling (gated_attention/config/schema.py lists the fields).')


def _has_field(config: dict, key: str) -> bool:
  """Whether 'section.field' is a field of `config` (a key directly under a free-form field,
  an empty dict whose keys are not fixed, counts)."""
  node, parts = config, key.split('.')
  for i, part in enumerate(parts):
    if not isinstance(node, dict):
      return False
    if part not in node:
      return not node and i == len(parts) - 1
    node = node[part]
  return True


def _formed_below(path: str, value) -> float | None:
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ExperimentError(f'{path}: FORMED_BELOW must be a positive validation loss (nats a '
                          f'token), e.g. 1.17; it is {value!r}.')
  return float(value)


def _diverged_above(path: str, m) -> float | None:
  value = getattr(m, 'DIVERGED_ABOVE', None)
  if value is None:
    return None
  if not getattr(m, 'STABILITY', False):
    raise ExperimentError(f'{path}: DIVERGED_ABOVE is read only with STABILITY = True.')
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ExperimentError(f'{path}: DIVERGED_ABOVE must be a positive validation loss (nats a '
                          f'token), e.g. 3.24; it is {value!r}.')
  return float(value)


def _second_cutoff(path: str, m) -> float | None:
  value = getattr(m, 'SECOND_CUTOFF', None)
  if value is None:
    return None
  if getattr(m, 'DIVERGED_ABOVE', None) is None:
    raise ExperimentError(f'{path}: SECOND_CUTOFF is read only with DIVERGED_ABOVE (and '
                          'STABILITY = True).')
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ExperimentError(f'{path}: SECOND_CUTOFF must be a positive validation loss (nats a '
                          f'token), e.g. 2.8; it is {value!r}.')
  return float(value)


def _paired(path: str, m, variants) -> tuple[str | None, dict, str]:
  """PAIRED (a variant in VARIANTS), PAPER (variant -> number, in VARIANTS), PAPER_LABEL."""
  ref, paper = getattr(m, 'PAIRED', None), getattr(m, 'PAPER', {})
  if ref is None:
    if paper:
      raise ExperimentError(f'{path}: PAPER is read only with PAIRED (the variant the others are '
                            "compared with, e.g. PAIRED = 'baseline').")
    return None, {}, ''
  if ref not in variants:
    raise ExperimentError(f'{path}: PAIRED = {ref!r} is not in VARIANTS ({variants}).')
  if not isinstance(paper, dict) or set(paper) - set(variants) or not all(
      isinstance(v, (int, float)) and not isinstance(v, bool) for v in paper.values()):
    raise ExperimentError(f'{path}: PAPER must be a dict from names in VARIANTS to numbers (the '
                          f'paper\'s difference to {ref}); it is {paper!r}.')
  return ref, {k: float(v) for k, v in paper.items()}, str(getattr(m, 'PAPER_LABEL', ''))


def _paired_metrics(path: str, m, paired, metrics) -> tuple:
  """PAIRED_METRICS: metrics (rundata.METRICS, one number a run) compared by seed with PAIRED."""
  names = getattr(m, 'PAIRED_METRICS', None)
  if names is None:
    return ('val_loss',)
  if paired is None:
    raise ExperimentError(f'{path}: PAIRED_METRICS is read only with PAIRED (the variant the '
                          "others are compared with, e.g. PAIRED = 'baseline').")
  bad = [n for n in names if n not in metrics or metrics[n][2] in ('count', 'mode', 'layer_count')
         or metrics[n][2].startswith('=')]
  if not isinstance(names, (list, tuple)) or not names or bad:
    raise ExperimentError(f'{path}: PAIRED_METRICS must list metrics of one number a run '
                          f'(experiments/rundata.py METRICS, e.g. val_loss, f_attn_max); '
                          f'{bad or names!r} are not.')
  return tuple(names)


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
  for i, p in enumerate(points):
    _overrides(path, f'POINTS[{i}]', p)
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
  variants = _names(path, 'VARIANTS', getattr(m, 'VARIANTS', []), [])
  seeds = _seeds(path, getattr(m, 'SEEDS', [0]))
  columns = _names(path, 'COLUMNS', getattr(m, 'COLUMNS', None), DEFAULT_COLUMNS)
  _check(path, variants, seeds, columns, known_columns)
  scale = getattr(m, 'SCALE', 'tiny')
  if not isinstance(scale, str):
    raise ExperimentError(f'{path}: SCALE must be a string such as \'tiny\'; it is {scale!r}.')
  common = _overrides(path, 'OVERRIDES', getattr(m, 'OVERRIDES', {}))
  grid = getattr(m, 'GRID', {})
  if not isinstance(grid, dict) or not all(
      isinstance(vs, (list, tuple)) and vs for vs in grid.values()):
    raise ExperimentError(f'{path}: GRID must be a dict of a field to a non-empty list of values, '
                          f"e.g. {{'train.learning_rate': [1e-3, 3e-3]}}; it is {grid!r}.")
  _overrides(path, 'GRID', {k: v for k, vs in grid.items() for v in vs})
  per_variant = getattr(m, 'VARIANT_OVERRIDES', {})
  if not isinstance(per_variant, dict) or set(per_variant) - set(variants):
    raise ExperimentError(f'{path}: VARIANT_OVERRIDES must be a dict from names in VARIANTS to '
                          f'dicts of overrides; it is {per_variant!r}.')
  per_variant = {v: _overrides(path, f'VARIANT_OVERRIDES[{v!r}]', o)
                 for v, o in per_variant.items()}
  points = _check_points(path, getattr(m, 'POINTS', []))
  point_names = getattr(m, 'POINT_NAMES', None)
  if point_names is not None:
    point_names = _names(path, 'POINT_NAMES', point_names, ['small', 'large'])
    if len(point_names) != len(points) or len(set(point_names)) != len(point_names) or not all(
        n.replace('_', '').replace('-', '').replace('.', '').isalnum() for n in point_names):
      raise ExperimentError(f'{path}: POINT_NAMES must give each of the {len(points)} POINTS a '
                            'distinct name of letters, digits, -, _ and . (it names the group).')
  analyze_overrides = _overrides(path, 'ANALYZE_OVERRIDES', getattr(m, 'ANALYZE_OVERRIDES', {}))
  quantization = _overrides(path, 'QUANTIZATION', getattr(m, 'QUANTIZATION', {}))
  _check_keys(path, variants, scale, [('OVERRIDES', common), ('GRID', grid),
                                      ('ANALYZE_OVERRIDES', analyze_overrides),
                                      ('QUANTIZATION', quantization)]
              + [(f'VARIANT_OVERRIDES[{v!r}]', o) for v, o in per_variant.items()]
              + [(f'POINTS[{i}]', p) for i, p in enumerate(points)])
  per_seed = tuple(_names(path, 'PER_SEED', getattr(m, 'PER_SEED', None), ()))
  if set(per_seed) - set(columns):
    raise ExperimentError(f'{path}: PER_SEED names {sorted(set(per_seed) - set(columns))}, '
                          'which are not in COLUMNS.')
  runs = []
  for variant in variants:
    for index, chosen in enumerate(points):
      for point in itertools.product(*[[(k, v) for v in vs] for k, vs in grid.items()]):
        labels = ([point_names[index]] if point_names else
                  [_point_label(chosen)] if chosen else [])
        group = '_'.join([variant] + labels + [_label(k, v) for k, v in point])
        overrides = {**common, **per_variant.get(variant, {}), **chosen, **dict(point)}
        for seed in seeds:
          runs.append(Run(f'{group}_s{seed}', group, variant, seed, tuple(overrides.items())))
  paired, paper, paper_label = _paired(path, m, variants)
  paired_metrics = _paired_metrics(path, m, paired, known_columns)
  name = getattr(m, 'NAME', os.path.splitext(os.path.basename(path))[0])
  doc = (m.__doc__ or '').strip()
  return Experiment(name=name, path=path, title=getattr(m, 'TITLE', doc.split('\n')[0] or name),
                    description=getattr(m, 'DESCRIPTION', '\n'.join(doc.split('\n')[1:]).strip()),
                    scale=scale, runs=runs, columns=columns,
                    analyze_overrides=analyze_overrides,
                    per_seed=per_seed,
                    extend=str(getattr(m, 'EXTEND', '')),
                    long_context=_check_long_context(path, m),
                    scaling=bool(getattr(m, 'SCALING', False)),
                    formed_below=_formed_below(path, getattr(m, 'FORMED_BELOW', None)),
                    stability=bool(getattr(m, 'STABILITY', False)),
                    diverged_above=_diverged_above(path, m),
                    second_cutoff=_second_cutoff(path, m),
                    spikes_after_warmup=bool(getattr(m, 'SPIKES_AFTER_WARMUP', False)),
                    paired=paired, paired_metrics=paired_metrics, paper=paper,
                    paper_label=paper_label, quantization=quantization,
                    long_context_overrides=dict(getattr(m, 'LONG_CONTEXT_OVERRIDES', {})))


def shell(args: list[str], python: str = '') -> str:
  """One shell line running `args` with `python` (default: this interpreter)."""
  return shlex.join([python or sys.executable] + list(args))
