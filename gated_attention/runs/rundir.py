"""The run directory, one file so that no other module knows a run's file name or rule: the
names of its files, their readers, its saved config and what may change on resume or evaluation.

    RUN/config.json          the run's config (check_or_write_config writes it; read_config)
    RUN/metrics.jsonl        one JSON row per log / eval / event (read_metrics)
    RUN/metrics/<n>.jsonl    the same rows on object storage (gs://): numbered chunk objects,
                             read back in order after metrics.jsonl (no append there)
    RUN/checkpoints/<step>/  orbax checkpoints (checkpoint.py, its CHECKPOINTS_DIR): {state, data}
    RUN/analysis/            --mode=analyze's report.json and figures (read_report)
    RUN/long_context/<tag>/  --mode=long_context's reports
    RUN/tensorboard/         the same metrics for TensorBoard
    RUN/logs/                the libraries' own log files during training
    RUN/trainer.lock         the one trainer writing the run (lock.py)
    RUN/grad_accum.json      train.grad_accum=auto's choice, the devices it was made on and its
                             attempts (training/grad_accum.py; read_grad_accum)

Several seeds trained as one program (--seeds, training/seeds.py) write one such directory per
seed (`seed_workdirs`): each is a run of its own, resumed or analysed like any other.

Every mode, the notebook and the experiment runner open runs through this module:

    run = load_run('runs/g1')                   # config, verified params, model, tokenizer, metrics
    run = load_run('runs/g1', step=400)         # checkpoint 400 (main.py's --step=400)
    run = load_run('runs/g1', overrides={'model.rope_scaling.type': 'yarn', ...})

Compatibility: a workdir whose saved config is incompatible with the current one (the model,
the tokenizer) is refused, never overwritten (`check_or_write_config`); so is a resumption that
changes what the data iterator's saved position depends on (seed, batch size, sequence length,
the source ...), with the list of differences and two ways forward. A workdir that is a file or
cannot be written is refused before any work (`check_workdir`). Evaluating a checkpoint
(`evaluation_config`) may change what no parameter depends on (the data, batch sizes, the
positions' encoding) and nothing else.

A run directory is a local folder or a prefix on object storage (`--workdir=gs://bucket/run`):
every file here goes through gated_attention/storage/, and docs/storage.md has the design.

Reading configs and metrics imports no JAX (--mode=compare stays fast); opening a run's
parameters goes through the model factory (factory.py), which verifies the checkpoint.
"""

import dataclasses
import functools
import json
import os

import ml_collections

from gated_attention import storage
from gated_attention.config import schema
from gated_attention.errors import CheckpointError, ConfigError, UserError
from gated_attention.model import config as model_config
from gated_attention.runs import upgrade

CONFIG_FILE = 'config.json'
METRICS_FILE = 'metrics.jsonl'
METRICS_DIR = 'metrics'          # object storage: metrics chunks <n>.jsonl (training/reporting.py)
ANALYSIS_DIR = 'analysis'
REPORT_FILE = 'report.json'
LOGS_DIR = 'logs'
LOCK_FILE = 'trainer.lock'       # lock.py's: the one trainer of the run
TENSORBOARD_DIR = 'tensorboard'
LONG_CONTEXT_DIR = 'long_context'
QUANTIZATION_DIR = 'quantization'  # --mode=quantization's report.json and quantization.md
GOODPUT_DIR = 'goodput'           # session-<n>.json: each session's time by cause (training/goodput.py)
PROFILE_DIR = 'profile'           # profiler traces (training/profile.py), for TensorBoard / XProf
GRAD_ACCUM_FILE = 'grad_accum.json'  # train.grad_accum=auto's choice and its devices (training/grad_accum.py)
# What may differ from a run's saved config is declared on the config's fields: the model's in
# their dataclass metadata (gated_attention/model/config.py), the rest in the schema's
# (gated_attention/config/schema.py).
# Model fields that may change between a run and its resumption (they do not change what the
# checkpoint holds); any other difference in config.model or CHECKPOINT_FIELDS is refused.
MODEL_FREE = model_config.free_fields('resume')
# Model fields that evaluating a checkpoint may change as well (analysis, sampling, long-context
# evaluation): the positions' encoding, which no parameter depends on (context extension with a
# raised RoPE base or YaRN, Qiu et al. 2025, Sec. 4.4).
EVAL_FREE = model_config.free_fields('evaluation')
# Fields outside config.model that the checkpoint depends on (the tokenizer).
CHECKPOINT_FIELDS = schema.fixed_fields(schema.CHECKPOINT)
# What the saved position of the data iterator depends on: a resumption may not change it (a
# warm start, which has no saved position, may).
ITERATOR_FIELDS = schema.fixed_fields(schema.ITERATOR)


def _flatten(d, prefix=''):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def config_differences(saved: dict, current: dict) -> list[str]:
  """Fields that make a saved run incompatible with the current config (compared as JSON holds
  them: a tuple read back from config.json, model.layer_types, equals the list it was saved as)."""
  saved, current = json.loads(json.dumps(saved)), json.loads(json.dumps(current))
  diffs = []
  def fixed(model):   # a tuple (model.layer_types) reads back from JSON as a list: the same value
    return {k: tuple(v) if isinstance(v, list) else v for k, v in _flatten(model).items()
            if k.split('.')[0] not in MODEL_FREE}
  saved_m, cur_m = fixed(saved.get('model', {})), fixed(current['model'])
  for k in sorted(set(saved_m) | set(cur_m)):
    if saved_m.get(k) != cur_m.get(k):
      diffs.append(f'model.{k}: saved {saved_m.get(k)!r}, now {cur_m.get(k)!r}')
  for k in CHECKPOINT_FIELDS:
    if _get(saved, k) != _get(current, k):
      diffs.append(f'{k}: saved {_get(saved, k)!r}, now {_get(current, k)!r}')
  return diffs


def _get(config: dict, path: str):
  node = config
  for part in path.split('.'):
    if not isinstance(node, dict) or part not in node:
      return None
    node = node[part]
  return node


def iterator_differences(saved: dict, current: dict) -> list[str]:
  """Settings the data iterator's saved position depends on that differ."""
  return [f'{k}: saved {_get(saved, k)!r}, now {_get(current, k)!r}'
          for k in ITERATOR_FIELDS if _get(saved, k) != _get(current, k)]


def _parse_saved(raw: bytes, path: str, error=CheckpointError):
  """A config.json's bytes as the dict of a run's config, or `error` naming what is wrong."""
  try:
    saved = json.loads(raw)
  except ValueError as e:
    raise error(f'{path} is unreadable: it is not valid JSON ({e}).') from e
  if not isinstance(saved, dict):
    raise error(f'{path} holds a JSON {type(saved).__name__}, not a run\'s config (an object '
                'with model, data, train ...).')
  errors = schema.type_errors(saved)
  if errors:
    raise error(f'{path} is not a config this code can read: {"; ".join(errors[:5])}. It was '
                'damaged or edited by hand; restore it (from a copy, or write it again from the '
                'command that trained the run, --config=... with the same overrides).')
  return saved


def _read_config_file(path: str, error) -> ml_collections.ConfigDict:
  """config.json at `path` as today's code reads it (runs/upgrade.py): `error` names a file that
  cannot be read or parsed, ConfigError a key this code does not know."""
  try:
    raw = storage.read_bytes(path)
  except OSError as e:
    raise error(f'{path} is unreadable ({e}).') from e
  return upgrade.from_saved(_parse_saved(raw, path, error), source=path)


def read_config_file(path: str) -> ml_collections.ConfigDict:
  """A run directory's config.json, or the config.json at `path` (configs/from_run.py)."""
  if storage.isdir(path):
    return read_config(path)
  if not storage.isfile(path):
    raise RunError(f'{path} does not exist (pass a run directory that holds {CONFIG_FILE}, or '
                   f'the path of a {CONFIG_FILE}).')
  return _read_config_file(path, RunError)


def read_saved_config(workdir: str) -> dict | None:
  """The run's config.json overlaid on today's defaults (None when there is none)."""
  path = storage.join(workdir, CONFIG_FILE)
  if not storage.exists(path):
    return None
  try:
    return _read_config_file(path, CheckpointError).to_dict()
  except (CheckpointError, ConfigError) as e:
    raise CheckpointError(f'{e} Or use a new --workdir.') from e


SEED_FIELD = '{seed}'             # in --workdir with --seeds: where each seed's number goes


def seed_workdirs(workdir: str, seeds) -> dict[int, str]:
  """Each seed's run directory for `--workdir=workdir --seeds=...` (training/seeds.py): workdir
  with {seed} replaced by the seed, or without {seed} workdir/s<seed>."""
  seeds = [int(s) for s in seeds]
  if not seeds or len(set(seeds)) != len(seeds):
    raise ConfigError(f'--seeds={",".join(map(str, seeds))}: give one or more distinct integer '
                      'seeds, e.g. --seeds=0,1,2 (each is a run directory of its own).')
  if SEED_FIELD in workdir:
    return {s: workdir.replace(SEED_FIELD, str(s)) for s in seeds}
  return {s: storage.join(workdir, f's{s}') for s in seeds}


def check_workdir(workdir: str):
  """A workdir that is a file, or a directory we cannot write, is refused before any work. On
  object storage: a missing bucket, missing credentials or an unreachable endpoint, found by
  writing (and deleting) a probe object there."""
  if storage.is_remote(workdir):
    storage.check_reachable(workdir, write=True)
    if storage.isfile(workdir):
      raise CheckpointError(f'--workdir={workdir} is an object, not a folder; pass a prefix '
                            'under which the run\'s files go (e.g. gs://bucket/runs/g1).')
    return
  workdir = os.path.abspath(workdir)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise CheckpointError(f'--workdir={workdir} is a file, not a directory; pass a directory '
                          '(it is created if missing).')
  probe = workdir
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.access(probe, os.W_OK | os.X_OK):
    raise CheckpointError(f'--workdir={workdir}: {probe} is not writable; pass a directory you '
                          'can write to.')
  # The run's own names taken by the wrong kind of entry (issue 37: a file `checkpoints` made
  # the run start over from step 0 and then time out in orbax).
  from gated_attention.runs import checkpoint  # pylint: disable=g-import-not-at-top
  for name, want_dir in ((checkpoint.CHECKPOINTS_DIR, True), (METRICS_FILE, False),
                         (LOCK_FILE, False), (CONFIG_FILE, False)):
    path = os.path.join(workdir, name)
    if os.path.lexists(path) and os.path.isdir(path) != want_dir:
      what = 'a folder' if want_dir else 'a file'
      raise CheckpointError(
          f'{path} should be {what} and is not: this run directory is damaged or holds something '
          f'else. Move {path} out of the way if it is not the run\'s (nothing of the run was '
          'changed), or pass another --workdir.')


def check_or_write_config(workdir: str, config, *, resuming_data: bool = False):
  """Refuses a workdir holding an incompatible run; writes config.json (process 0). With
  `resuming_data` (the latest checkpoint holds the data iterator's position), a change of
  what that position depends on is refused too."""
  workdir = storage.abspath(workdir)
  check_workdir(workdir)
  config_dict = json.loads(config.to_json())
  saved = read_saved_config(workdir)
  if saved is not None:
    diffs = config_differences(saved, config_dict)
    what = 'an incompatible config'
    if not diffs and resuming_data:
      diffs, what = iterator_differences(saved, config_dict), 'other data settings'
    if diffs:
      raise CheckpointError(
          f'--workdir={workdir} holds a run with {what}:\n  ' + '\n  '.join(diffs) +
          f'\nTo continue that run, use its saved config: --config=configs/from_run.py:{workdir}'
          ' (overrides that keep these values are fine). To train with the new settings from its '
          f'weights, use a new --workdir and --config.train.init_from={workdir}.')
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    storage.makedirs(workdir)
    storage.write(storage.join(workdir, CONFIG_FILE), json.dumps(config_dict, indent=2))


class RunError(UserError, ValueError):
  """A run directory that cannot be opened; the message names the directory and the fix."""


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's saved config (config.json) as a ConfigDict, fields added since it was saved
  at their defaults."""
  path = storage.join(workdir, CONFIG_FILE)
  storage.check_folder(workdir)        # orbax would read the arrays of another folder
  if not storage.isdir(workdir):
    raise RunError(f'{workdir!r} is not a directory; pass the --workdir of a training run.')
  if not storage.isfile(path):
    raise RunError(f'{workdir!r} has no {CONFIG_FILE}: it is not a training run directory (or the '
                   'run never started). Train first: python main.py --config=configs/<variant>.py '
                   f'--workdir={workdir}')
  return _read_config_file(path, RunError)


def read_metrics(workdir: str, *, every_row: bool = False) -> list[dict]:
  """The rows of metrics.jsonl (each has 'step' and 'split'); [] when there is none.

  A run resumed after a crash (or rolled back) repeats steps: a later row for the same (split,
  step) replaces the earlier one, so curves have one point per step; with `every_row`, all rows
  in file order (events such as loss spikes happened in every attempt). Unparseable (e.g.
  truncated) lines are skipped. The rows are metrics.jsonl's, then those of the chunks in
  metrics/ (a run on object storage) in their numbered order.
  """
  rows = []
  for path in metrics_files(workdir):
    try:
      raw = storage.read_bytes(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:  # gone meanwhile
      _warn(f'Warning: {path} cannot be read ({type(e).__name__}); its rows are skipped.')
      continue
    for line in raw.splitlines():
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if _well_typed(row):
        rows.append(row)
  if every_row:
    return rows
  latest = {(r['split'], r['step']): r for r in rows}
  return sorted(latest.values(), key=lambda r: (r['step'], r['split']))


_TEXT_FIELDS = ('split', 'event', 'why')     # the rows' only fields that hold text


def _well_typed(row) -> bool:
  """A metrics row as the loop writes it: an integer step, a split, numbers (or lists of them,
  or null) in every other field but the event's text. Rows damaged or edited otherwise are
  skipped like unparseable lines (a string loss broke analyze and compare)."""
  if not (isinstance(row, dict) and isinstance(row.get('step'), int)
          and not isinstance(row['step'], bool) and isinstance(row.get('split'), str)):
    return False
  return all(isinstance(v, (int, float, list, type(None))) or k in _TEXT_FIELDS
             for k, v in row.items())


def _numbered(name: str, prefix: str, suffix: str) -> int | None:
  """N of a name `<prefix>N<suffix>` (N in ASCII digits), else None."""
  if not (name.startswith(prefix) and name.endswith(suffix)):
    return None
  stem = name[len(prefix):len(name) - len(suffix)]
  return int(stem) if stem.isdigit() and stem.isascii() else None


def _chunk_number(name: str) -> int | None:
  return _numbered(name, '', '.jsonl')


def metrics_chunk_numbers(workdir: str) -> list[int]:
  """The numbers taken in RUN/metrics/ (object storage), ascending: every name of the chunks'
  form, a folder under one included (the next chunk gets a number none of them has)."""
  names = storage.listdir(storage.join(workdir, METRICS_DIR))
  return sorted(n for n in map(_chunk_number, names) if n is not None)


def metrics_chunk(workdir: str, number: int) -> str:
  return storage.join(workdir, METRICS_DIR, f'{number:08d}.jsonl')


_warned = set()


def _warn(text: str):
  """A warning on stderr, once per process (the readers read a run's metrics several times)."""
  if text not in _warned:
    _warned.add(text)
    import sys  # pylint: disable=g-import-not-at-top
    print(text, file=sys.stderr, flush=True)


def metrics_files(workdir: str) -> list[str]:
  """The files holding the run's metrics rows, in the order they were written: metrics.jsonl,
  then the chunk files of RUN/metrics/ by number, under the names they have (`50.jsonl` as
  well). Anything else of those names, a folder under a chunk's name (an object
  RUN/metrics/00000050.jsonl/inner on gs://) or a file where the folder should be, is skipped
  with a warning (issue 50: a FileNotFoundError traceback in analyze and compare)."""
  single = storage.join(workdir, METRICS_FILE)
  first = [single] if storage.isfile(single) else []
  if not first and storage.exists(single):
    _warn(f'Warning: {single} is a folder, not the metrics file; skipped.')
  folder = storage.join(workdir, METRICS_DIR)
  found = storage.entries(folder)
  if not found and storage.isfile(folder):
    _warn(f'Warning: {folder} is a file, not the folder of metrics chunks; skipped.')
  chunks = []
  for name, is_file in sorted(found.items()):
    number = _chunk_number(name)
    if number is None:
      continue
    if not is_file:
      _warn(f'Warning: {storage.join(folder, name)} is a folder, not a metrics chunk (something '
            'else wrote objects under its name); skipped.')
      continue
    chunks.append((number, name))
  return first + [storage.join(folder, name) for _, name in sorted(chunks)]


def analysis_dir(workdir: str) -> str:
  return storage.join(workdir, ANALYSIS_DIR)


def report_path(workdir: str) -> str:
  """RUN/analysis/report.json: --mode=analyze's report."""
  return storage.join(analysis_dir(workdir), REPORT_FILE)


def quantization_dir(workdir: str) -> str:
  """RUN/quantization/: --mode=quantization's report (inference/quantized.py)."""
  return storage.join(workdir, QUANTIZATION_DIR)


def long_context_dir(workdir: str, tag: str) -> str:
  """RUN/long_context/<tag>/: one --mode=long_context evaluation's report and figures."""
  return storage.join(workdir, LONG_CONTEXT_DIR, tag)


def _read_report(path: str, what: str, command: str) -> dict | None:
  if not storage.isfile(path):
    return None
  try:
    report = json.loads(storage.read_bytes(path))
  except ValueError as e:
    raise RunError(f'{path} is unreadable ({e}): {what} was cut short or the file damaged. '
                   f'Run {what} again: {command}') from e
  if not isinstance(report, dict):
    raise RunError(f'{path} holds a JSON {type(report).__name__}, not a report. Run {what} '
                   f'again: {command}')
  return report


def read_report(workdir: str) -> dict | None:
  """RUN/analysis/report.json, if the analysis has been run."""
  return _read_report(report_path(workdir), 'the analysis',
                      f'python main.py --mode=analyze --workdir={workdir}')


def read_long_context(workdir: str, tag: str) -> dict | None:
  """RUN/long_context/<tag>/report.json, if that evaluation has been run."""
  return _read_report(storage.join(long_context_dir(workdir, tag), REPORT_FILE),
                      'the evaluation', f'python main.py --mode=long_context --workdir={workdir} '
                      f'--config.long_context.tag={tag}')


def grad_accum_path(workdir: str) -> str:
  return storage.join(workdir, GRAD_ACCUM_FILE)


def read_grad_accum(workdir: str) -> dict | None:
  """train.grad_accum=auto's recorded choice ({'grad_accum': N, 'devices': {...}, ...}), or None
  when the run has none (or an unreadable one: the choice is then made again)."""
  path = grad_accum_path(workdir)
  if not storage.isfile(path):
    return None
  try:
    record = json.loads(storage.read_bytes(path))
  except (OSError, ValueError):
    _warn(f'{path} is unreadable; grad_accum=auto chooses again.')
    return None
  if not isinstance(record, dict) or not isinstance(record.get('grad_accum'), int):
    _warn(f'{path} holds no grad_accum; grad_accum=auto chooses again.')
    return None
  return record


def write_grad_accum(workdir: str, record: dict):
  """Records train.grad_accum=auto's choice (process 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    storage.write(grad_accum_path(workdir), json.dumps(record, indent=2))


def goodput_session(workdir: str, number: int) -> str:
  return storage.join(workdir, GOODPUT_DIR, f'session-{number:05d}.json')


def _session_number(name: str) -> int | None:
  return _numbered(name, 'session-', '.json')


def goodput_session_numbers(workdir: str) -> list[int]:
  """The session numbers taken in RUN/goodput/, ascending."""
  names = storage.listdir(storage.join(workdir, GOODPUT_DIR))
  return sorted(n for n in map(_session_number, names) if n is not None)


def read_goodput(workdir: str) -> list[dict]:
  """The sessions' time accounts (RUN/goodput/session-<n>.json), in order; [] for a run that
  has none (trained before they were kept). An unreadable one is skipped with a warning."""
  sessions = []
  for number in goodput_session_numbers(workdir):
    path = goodput_session(workdir, number)
    try:
      record = json.loads(storage.read_bytes(path))
    except (OSError, ValueError) as e:   # a folder under its name, a write cut short
      _warn(f'Warning: {path} cannot be read ({type(e).__name__}); that session is left out '
            'of the goodput account.')
      continue
    if isinstance(record, dict) and isinstance(record.get('seconds'), dict):
      sessions.append(record)
    else:
      _warn(f'Warning: {path} is not a session account; left out of the goodput account.')
  return sessions


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the finished checkpoints (unfinished orbax temporaries are ignored)."""
  from gated_attention.runs import checkpoint  # pylint: disable=g-import-not-at-top
  storage.check_folder(workdir)
  if not storage.isdir(storage.join(workdir, checkpoint.CHECKPOINTS_DIR)):
    return []
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  try:
    return ckpt.all_steps()
  finally:
    ckpt.close()


def latest_step(workdir: str) -> int | None:
  steps = checkpoint_steps(workdir)
  return steps[-1] if steps else None


def pick_step(workdir: str, step: int | None, steps: list[int] | None = None) -> int:
  """`step`, or the latest when None, among `steps` (default: the run's finished
  checkpoints); a RunError naming the steps there are otherwise."""
  steps = checkpoint_steps(workdir) if steps is None else steps
  if not steps:
    raise RunError(f'{workdir!r} has no finished checkpoint under checkpoints/: nothing to '
                   'open. Train first (checkpoints are written every '
                   'config.train.checkpoint_every steps and at the end) or pick another --workdir.')
  if step is None:
    return steps[-1]
  if step not in steps:
    raise RunError(f'{workdir!r} has no checkpoint at step {step}; it has {steps}.')
  return step


# --- evaluating a saved run -------------------------------------------------------------------

def fixed_by_checkpoint(path: str) -> bool:
  """Whether the checkpoint fixes this config field (the model's structure, the tokenizer)."""
  parts = path.split('.')
  return ((parts[0] == 'model' and parts[1] not in EVAL_FREE)
          or path in CHECKPOINT_FIELDS)


def _saved_value(saved, path: str):
  node = saved
  for part in path.split('.'):
    node = node[part]
  return node


def _saved_value_or_none(saved, path):
  try:
    return _saved_value(saved, path)
  except (KeyError, AttributeError):
    return None


def evaluation_config(saved, overrides: dict) -> ml_collections.ConfigDict:
  """The saved config with `overrides` ({'data.val_batches': 8, ...}) applied, for evaluating
  its checkpoints (analysis, sampling, long context). Overrides of what the checkpoint fixes
  must equal the saved values (every one that differs is listed), except a tokenizer where the
  run saved none (an import of a directory without tokenizer.json): there the user names the
  tokenizer the model was trained with. `analysis.*` options are not config fields here."""
  cfg = schema.allow_auto(ml_collections.ConfigDict(saved.to_dict()))
  flat, diffs = {}, []
  for path, value in overrides.items():
    if path.split('.')[0] == 'analysis':
      continue
    if fixed_by_checkpoint(path):
      saved_value = _saved_value_or_none(saved, path)
      if path in CHECKPOINT_FIELDS and saved_value == '':   # not saved: the user names it
        flat[path] = value
      elif saved_value != value:
        diffs.append(path)
      continue
    flat[path] = value
  if diffs:
    raise RunError(
        'These overrides change what the checkpoint fixes (the model, or the tokenizer it was '
        'trained on): ' + ', '.join(f'--config.{p}={overrides[p]!r} (saved: '
                                    f'{_saved_value_or_none(saved, p)!r})' for p in diffs) +
        f'. Drop them; only model.{", model.".join(EVAL_FREE)} and the data / batch '
        'settings may differ from the run\'s saved config.')
  try:
    cfg.update_from_flattened_dict(flat)
  except (KeyError, AttributeError, TypeError) as e:
    raise RunError(f'Cannot apply the overrides {flat} to the run\'s config: {e}') from e
  return cfg


def build_mesh(config):
  """The run's mesh; if it does not fit the devices here, plain data parallelism over them."""
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  try:
    return sharding.build_mesh(config.mesh)
  except ValueError as e:
    print(f'Note: the run\'s mesh does not fit here ({e}); using data parallelism over '
          f'{jax.device_count()} device(s).')
    return sharding.build_mesh(ml_collections.ConfigDict(
        dict(data=-1, fsdp=1, tensor=1, expert=1)))


@dataclasses.dataclass
class Run:
  """An opened run: its config (saved, with the evaluation overrides), the model factory, the
  parameters of checkpoint `step` (a pure dict on the factory's shardings), tokenizer and
  metrics rows. `workdir` is None for `init_run`."""
  workdir: str | None
  config: ml_collections.ConfigDict
  factory: object               # factory.ModelFactory
  step: int | None
  params: dict
  tokenizer: object
  metrics: list[dict]

  @property
  def model_cfg(self):
    return self.factory.model_cfg

  @property
  def graphdef(self):
    return self.factory.graphdef

  @property
  def mesh(self):
    return self.factory.mesh

  @functools.cached_property
  def model(self):
    """A Transformer (nnx) holding the parameters (the same object on every access)."""
    return self.factory.merge(self.params)

  @property
  def analysis_dir(self) -> str | None:
    return None if self.workdir is None else analysis_dir(self.workdir)

  def report(self) -> dict | None:
    """RUN/analysis/report.json, if the analysis has been run."""
    return None if self.workdir is None else read_report(self.workdir)


def _no_tokenizer(config) -> bool:
  """A run that records no tokenizer (imported from a Hugging Face folder without
  tokenizer.json; the synthetic tasks bring their own)."""
  return config.data.get('source') != 'synthetic' and not config.data.get('tokenizer')


def _tokenizer(config):
  """The run's tokenizer; None for a run that records none: its parameters still open (export,
  the notebook)."""
  if _no_tokenizer(config):
    return None
  from gated_attention import input_pipeline  # pylint: disable=g-import-not-at-top
  return input_pipeline.data_tokenizer(config.data)


def check_tokenizer(workdir: str, config, what: str):
  """Refuses `what` (text in, text out) for a run that records no tokenizer, naming the fix."""
  if _no_tokenizer(config):
    raise RunError(
        f'The run in {workdir} records no tokenizer (it was imported from a Hugging Face folder '
        f'without tokenizer.json), so {what} cannot turn text into tokens. Name the one the model '
        'was trained with: --config.data.tokenizer=byte, or a tokenizer.json / .model path.')


def model_factory(config):
  """The model factory of `config` on the mesh that fits here (`build_mesh`)."""
  from gated_attention.runs import factory  # pylint: disable=g-import-not-at-top
  return factory.ModelFactory(config, build_mesh(config))


def eval_config(workdir: str, overrides: dict | None = None, *, generation: bool = False):
  """The run's saved config with the evaluation `overrides` (`evaluation_config`); with
  `generation`, MoE routing every token (dispatch dropless: no parameter changes, no token
  dropped), as sampling and the long-context evaluation need."""
  cfg = evaluation_config(read_config(workdir), overrides or {})
  return for_generation(cfg) if generation else cfg


def for_generation(cfg):
  """`cfg` with MoE routing every token (dispatch dropless), as generation needs (in place)."""
  if cfg.model.moe.num_experts and cfg.model.moe.dispatch != 'dropless':
    cfg.model.moe.dispatch = 'dropless'
    print('Note: generation routes every token (moe.dispatch=dropless).')
  return cfg


def load_run(workdir: str, step: int | None = None, *, overrides: dict | None = None,
             config=None) -> Run:
  """Opens `workdir` read-only: saved config (with the evaluation `overrides`, see
  `evaluation_config`), metrics rows, tokenizer and the verified parameters of checkpoint
  `step` (default: the latest). `config`: a config already made by evaluation_config, instead
  of the saved one with `overrides`."""
  if config is None:
    config = evaluation_config(read_config(workdir), overrides or {})
  pick_step(workdir, step)              # a RunError naming the steps there are, before any work
  factory = model_factory(config)
  step, params = factory.restore(workdir, step)
  return Run(workdir=workdir, config=config, factory=factory, step=step, params=params,
             tokenizer=_tokenizer(config), metrics=read_metrics(workdir))


def init_run(config, seed: int | None = None) -> Run:
  """A Run for a freshly initialised (untrained) model of `config`: no workdir, no metrics."""
  factory = model_factory(config)
  params = factory.init_params(config.seed if seed is None else seed)
  return Run(workdir=None, config=config, factory=factory, step=0, params=params,
             tokenizer=_tokenizer(config), metrics=[])
