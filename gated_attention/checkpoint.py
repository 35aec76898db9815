"""Checkpoints with orbax: parameters and optimizer state (sharded, async), each process's
data-iterator state (grain), and the run's config beside them as JSON.

Layout: <workdir>/config.json and <workdir>/checkpoints/<step>/{state,data}. The training loop,
the analysis and the notebooks all go through `Checkpointer` (the analysis opens it read-only
and restores the parameters alone). The save cadence is orbax's: every `every` steps, plus the
last step and preemption (PreemptionCheckpointingPolicy: a TPU/GPU cluster's preemption notice
seen by JAX's multi-host sync). A workdir whose saved config is incompatible with the current
one is refused, never overwritten (`check_or_write_config`).
"""

import contextlib
import json
import os

from absl import logging as absl_logging
import grain
import jax
import orbax.checkpoint as ocp

from configs import base as base_config
from gated_attention.errors import UserError

CONFIG_FILE = 'config.json'
CHECKPOINTS_DIR = 'checkpoints'
# Config fields that may change between a run and its resumption (they do not change what the
# checkpoint holds); any other difference in config.model or these data fields is refused.
MODEL_FREE = ('remat', 'attention_impl', 'dtype')
DATA_FIXED = ('tokenizer', 'seq_len')


class CheckpointError(UserError, ValueError):
  """A run directory or checkpoint that cannot be used; the message says what to do."""


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
  saved_m = {k: v for k, v in _flatten(saved.get('model', {})).items() if k not in MODEL_FREE}
  cur_m = {k: v for k, v in _flatten(current['model']).items() if k not in MODEL_FREE}
  for k in sorted(set(saved_m) | set(cur_m)):
    if saved_m.get(k) != cur_m.get(k):
      diffs.append(f'model.{k}: saved {saved_m.get(k)!r}, now {cur_m.get(k)!r}')
  for k in DATA_FIXED:
    a, b = saved.get('data', {}).get(k), current['data'].get(k)
    if a != b:
      diffs.append(f'data.{k}: saved {a!r}, now {b!r}')
  return diffs


def read_saved_config(workdir: str) -> dict | None:
  """The run's config.json overlaid on today's defaults (None when there is none)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return base_config.from_saved(json.load(f)).to_dict()
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path} is unreadable ({e}); use a new --workdir.') from e


def check_or_write_config(workdir: str, config):
  """Refuses a workdir holding an incompatible run; writes config.json (process 0)."""
  workdir = os.path.abspath(workdir)
  config_dict = json.loads(config.to_json())
  saved = read_saved_config(workdir)
  if saved is not None:
    diffs = config_differences(saved, config_dict)
    if diffs:
      raise CheckpointError(
          f'--workdir={workdir} holds a run with an incompatible config:\n  '
          + '\n  '.join(diffs) + '\nUse a new --workdir, or the saved config '
          f'(--config={os.path.join(workdir, CONFIG_FILE)} is JSON; pass matching overrides).')
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, CONFIG_FILE)
    with open(path + '.tmp', 'w') as f:
      json.dump(config_dict, f, indent=2)
    os.replace(path + '.tmp', path)


@contextlib.contextmanager
def _quiet_orbax():
  """orbax logs a WARNING for every option a read-only manager overrides."""
  old = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    yield
  finally:
    absl_logging.set_verbosity(old)


class Checkpointer:
  """The orbax CheckpointManager of one workdir: `save`, `restore`, `restore_params`."""

  def __init__(self, workdir: str, *, every: int = 1, keep: int | None = None,
               read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), CHECKPOINTS_DIR)
    policy = ocp.checkpoint_managers
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=not read_only,
        save_decision_policy=policy.AnySavePolicy([
            policy.FixedIntervalPolicy(every), policy.PreemptionCheckpointingPolicy()]))
    with _quiet_orbax() if read_only else contextlib.nullcontext():
      self.manager = ocp.CheckpointManager(self.directory, options=options,
                                           item_names=('state', 'data'))

  def all_steps(self) -> list[int]:
    """Steps of the finished checkpoints (unfinished temporaries are not listed)."""
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def should_save(self, step: int) -> bool:
    """Every `every` steps, or when the cluster signals a preemption."""
    return self.manager.should_save(step)

  def save(self, step: int, state: dict, data_iter):
    """Starts an async save of `state` (a pytree) and the data iterator's state."""
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iter)), force=True)

  def restore(self, step: int, abstract_state: dict, data_iter) -> dict:
    """Restores `state` onto the shardings of `abstract_state` (ShapeDtypeStructs with
    .sharding), and the data iterator in place."""
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          data=grain.checkpoint.CheckpointRestore(data_iter)))
    except Exception as e:  # orbax raises many types; name the checkpoint and the fix
      raise CheckpointError(
          f'Could not restore checkpoint step {step} from {self.directory}: {e}\n'
          'If it is corrupt, move that step directory away to resume from an earlier one.') from e
    return out['state']

  def restore_params(self, step: int, abstract_params: dict) -> dict:
    """The parameters of checkpoint `step` alone (the optimizer state is not read)."""
    item = {'params': abstract_params}
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
          partial_restore=True)))
    except Exception as e:  # orbax raises many types; name the checkpoint and the likely cause
      raise CheckpointError(
          f'Could not restore the parameters of checkpoint {step} in {self.directory}: {e}\n'
          'Is the saved config.json the one this checkpoint was trained with?') from e
    return out['state']['params']

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
