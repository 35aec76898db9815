"""Checkpoints with orbax: parameters, optimizer state, step and RNG (sharded, async), each
process's data-iterator state (grain), and the run's config beside them as JSON.

Layout: <workdir>/config.json and <workdir>/checkpoints/<step>/{state,data}.
A workdir whose saved config is incompatible with the current one is refused, never overwritten.
"""

import json
import os

import grain
import jax
import orbax.checkpoint as ocp

from configs import base as base_config

# Config fields that may change between a run and its resumption (they do not change what the
# checkpoint holds); any other difference in config.model or these data fields is refused.
_MODEL_FREE = ('remat', 'attention_impl', 'dtype')
_DATA_FIXED = ('tokenizer', 'seq_len')


class IncompatibleCheckpointError(ValueError):
  pass


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
  saved_m = {k: v for k, v in _flatten(saved.get('model', {})).items() if k not in _MODEL_FREE}
  cur_m = {k: v for k, v in _flatten(current['model']).items() if k not in _MODEL_FREE}
  for k in sorted(set(saved_m) | set(cur_m)):
    if saved_m.get(k) != cur_m.get(k):
      diffs.append(f'model.{k}: saved {saved_m.get(k)!r}, now {cur_m.get(k)!r}')
  for k in _DATA_FIXED:
    a, b = saved.get('data', {}).get(k), current['data'].get(k)
    if a != b:
      diffs.append(f'data.{k}: saved {a!r}, now {b!r}')
  return diffs


class Checkpointer:
  """Thin wrapper around an orbax CheckpointManager for one workdir."""

  def __init__(self, workdir: str, config, *, keep: int, every: int):
    self.workdir = os.path.abspath(workdir)
    self.config_path = os.path.join(self.workdir, 'config.json')
    self.every = every
    config_dict = json.loads(config.to_json())
    self._check_or_write_config(config_dict)
    self.manager = ocp.CheckpointManager(
        os.path.join(self.workdir, 'checkpoints'),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True),
        item_names=('state', 'data'))

  def _check_or_write_config(self, config_dict):
    if os.path.exists(self.config_path):
      try:
        with open(self.config_path) as f:
          saved = json.load(f)
      except (OSError, ValueError) as e:
        raise IncompatibleCheckpointError(
            f'{self.config_path} is unreadable ({e}); use a new --workdir.') from e
      diffs = config_differences(base_config.from_saved(saved).to_dict(), config_dict)
      if diffs:
        raise IncompatibleCheckpointError(
            f'--workdir={self.workdir} holds a run with an incompatible config:\n  '
            + '\n  '.join(diffs) + '\nUse a new --workdir, or the saved config '
            f'(--config={self.config_path} is JSON; pass matching overrides).')
    if jax.process_index() == 0:
      os.makedirs(self.workdir, exist_ok=True)
      with open(self.config_path + '.tmp', 'w') as f:
        json.dump(config_dict, f, indent=2)
      os.replace(self.config_path + '.tmp', self.config_path)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: dict, data_iter, *, force: bool = False) -> bool:
    """Starts an async save of `state` (a pytree) and the data iterator; returns if it saved."""
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iter)), force=force)

  def restore(self, step: int, abstract_state: dict, data_iter) -> dict:
    """Restores onto the shardings of `abstract_state` (ShapeDtypeStructs with .sharding)."""
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          data=grain.checkpoint.CheckpointRestore(data_iter)))
    except Exception as e:  # orbax raises many types; name the checkpoint and the fix
      raise IncompatibleCheckpointError(
          f'Could not restore checkpoint step {step} from {self.manager.directory}: {e}\n'
          'If it is corrupt, move that step directory away to resume from an earlier one.') from e
    return out['state']

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
