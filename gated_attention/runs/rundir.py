"""The run directory: its config.json, and whether a config may run in it.

A workdir whose saved config is incompatible with the current one (the model, the tokenizer) is
refused, never overwritten (`check_or_write_config`); so is a resumption that changes what the
data iterator's saved position depends on (seed, batch size, sequence length, the source ...),
with the list of differences and two ways forward. A workdir that is a file or cannot be
written is refused before any work (`check_workdir`).
"""

import json
import os

import jax

from configs import base as base_config
from gated_attention.errors import CheckpointError, ConfigError
from gated_attention.model import config as model_config

CONFIG_FILE = 'config.json'
# What may differ from a run's saved config is declared on the config's fields: the model's in
# their dataclass metadata (gated_attention/model/config.py), the rest in configs/base.py.
# Model fields that may change between a run and its resumption (they do not change what the
# checkpoint holds); any other difference in config.model or CHECKPOINT_FIELDS is refused.
MODEL_FREE = model_config.free_fields('resume')
# Model fields that evaluating a checkpoint may change as well (analysis, sampling, long-context
# evaluation): the positions' encoding, which no parameter depends on (context extension with a
# raised RoPE base or YaRN, Qiu et al. 2025, Sec. 4.4).
EVAL_FREE = model_config.free_fields('evaluation')
# Fields outside config.model that the checkpoint depends on (the tokenizer).
CHECKPOINT_FIELDS = base_config.fixed_fields(base_config.CHECKPOINT)
# What the saved position of the data iterator depends on: a resumption may not change it (a
# warm start, which has no saved position, may).
ITERATOR_FIELDS = base_config.fixed_fields(base_config.ITERATOR)


def _flatten(d, prefix=''):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def config_differences(saved: dict, current: dict) -> list[str]:
  """Fields that make a saved run incompatible with the current config."""
  diffs = []
  def fixed(model):
    return {k: v for k, v in _flatten(model).items() if k.split('.')[0] not in MODEL_FREE}
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


def read_saved_config(workdir: str) -> dict | None:
  """The run's config.json overlaid on today's defaults (None when there is none)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path} is unreadable ({e}); use a new --workdir.') from e
  try:
    return base_config.from_saved(saved, source=path).to_dict()
  except ConfigError as e:
    raise CheckpointError(f'{e} Or use a new --workdir.') from e


def check_workdir(workdir: str):
  """A workdir that is a file, or a directory we cannot write, is refused before any work."""
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


def check_or_write_config(workdir: str, config, *, resuming_data: bool = False):
  """Refuses a workdir holding an incompatible run; writes config.json (process 0). With
  `resuming_data` (the latest checkpoint holds the data iterator's position), a change of
  what that position depends on is refused too."""
  workdir = os.path.abspath(workdir)
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
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, CONFIG_FILE)
    with open(path + '.tmp', 'w') as f:
      json.dump(config_dict, f, indent=2)
    os.replace(path + '.tmp', path)
