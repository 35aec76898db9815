"""A saved run config (RUN/config.json) as today's code reads it: the upgrade rules.

    config = upgrade.from_saved(json.loads(raw), source=path)   # runs/rundir.py does this

Fields added to the schema (gated_attention/config/schema.py) since the run was saved take their
defaults for its scale; keys retired since (RETIRED_KEYS) are renamed or dropped; any other key
this code does not know is refused by name, so that no setting is silently ignored.
"""

import copy

import ml_collections
from absl import logging

from gated_attention.config import scales, schema
from gated_attention.errors import ConfigError

# Keys that earlier versions of this code wrote to config.json and this version no longer has,
# with what opening such a run does: ('rename', 'new.path') moves the value there (unless the
# saved config has the new key too), ('drop', 'why'[, former default]) forgets it (with a
# warning unless it held its former default). A change that renames or removes a field adds its
# row here, so the run directories saved before it still open (configs/base.py's git history up
# to the packages reorganisation, then gated_attention/config/schema.py's, has every field).
RETIRED_KEYS: dict[str, tuple] = {
    # issue 38: which checkpoint an evaluation opens is --step, for every mode
    'analysis.step': ('drop', 'which checkpoint --mode=analyze opens is --step=N', -1),
    'long_context.step': ('drop', 'which checkpoint --mode=long_context opens is --step=N', -1),
}


def _overlay(defaults: dict, saved: dict) -> dict:
  """`saved` over `defaults`; a list where the default is a tuple (JSON has no tuples:
  model.layer_types) is read back as a tuple, as the config holds it."""
  out = dict(defaults)
  for k, v in saved.items():
    if isinstance(v, dict) and isinstance(defaults.get(k), dict):
      out[k] = _overlay(defaults[k], v)
    elif isinstance(v, list) and isinstance(defaults.get(k), tuple):
      out[k] = tuple(v)
    else:
      out[k] = v
  return out


def _upgrade(saved: dict, source: str) -> dict:
  """`saved` with the RETIRED_KEYS it holds renamed or dropped."""
  saved = copy.deepcopy(saved)

  def parent(path, create=False):
    node = saved
    for part in path.split('.')[:-1]:
      if create and isinstance(node, dict):
        node.setdefault(part, {})
      if not isinstance(node, dict) or part not in node:
        return None
      node = node[part]
    return node if isinstance(node, dict) else None

  for path, (action, arg, *former) in RETIRED_KEYS.items():
    node, key = parent(path), path.split('.')[-1]
    if node is None or key not in node:
      continue
    value = node.pop(key)
    if action == 'rename':
      new_parent, new_key = parent(arg, create=True), arg.split('.')[-1]
      if new_parent is not None:
        new_parent.setdefault(new_key, value)
      logging.info('%s: the retired key %s is now %s.', source, path, arg)
    elif action == 'drop':
      log = logging.info if former and value == former[0] else logging.warning
      log('%s: the retired key %s (= %r) is ignored: %s', source, path, value, arg)
    else:
      raise ValueError(f'gated_attention/runs/upgrade.py RETIRED_KEYS[{path!r}]: unknown action '
                       f'{action!r} (rename | drop).')
  return saved


def from_saved(saved: dict, source: str = 'the saved config.json') -> ml_collections.ConfigDict:
  """A run's saved config (config.json), with fields added since then set to their defaults
  (the saved scale's) and the keys retired since then (RETIRED_KEYS) upgraded, so runs written
  by an older version of the code still open. A key that this code does not know otherwise is
  refused by name (ConfigError): a config written by a newer version or edited by hand would
  run with some of its settings ignored. `source` names the file in messages."""
  saved = _upgrade(saved, source)
  scale = saved.get('scale', 'tiny')
  defaults = scales.get_config(scale if scale in scales.SCALES else 'tiny').to_dict()
  unknown = schema.unknown_keys(saved, defaults)
  if unknown:
    raise ConfigError(
        f'{source} has key(s) that this version of the code does not know: '
        f'{", ".join(unknown)}. It was written by other code (a newer version, or edited by '
        'hand); open it with that code, or remove those keys from the file. (A key that this '
        'code renamed or removed belongs in gated_attention/runs/upgrade.py RETIRED_KEYS, so '
        'that older runs still open.)')
  return schema.allow_auto(ml_collections.ConfigDict(_overlay(defaults, saved)))
