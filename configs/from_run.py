"""The saved config of a run: `--config=configs/from_run.py:runs/NAME` (or a config.json path).

Continue a run with exactly its own settings, or start a new run from them with a few overrides
(`--workdir=runs/NEW --config=configs/from_run.py:runs/NAME --config.seed=1`). Fields added to
configs/base.py since the run was saved take their defaults; keys this code does not know are
refused by name, except those retired since (configs/base.py RETIRED_KEYS).
"""

import json

from configs import base
from gated_attention import storage


def get_config(run: str = ''):
  if not run:
    raise ValueError('configs/from_run.py needs a run directory or a config.json after a colon: '
                     '--config=configs/from_run.py:runs/NAME')
  path = storage.join(run, 'config.json') if storage.isdir(run) else run
  if not storage.isfile(path):
    raise ValueError(f'configs/from_run.py:{run}: {path} does not exist (pass a run directory '
                     'that holds config.json, or the path of a config.json).')
  try:
    saved = json.loads(storage.read_bytes(path))
  except ValueError as e:   # (ml_collections cannot re-raise a JSONDecodeError with its message)
    raise ValueError(f'configs/from_run.py:{run}: {path} is not valid JSON ({e}).') from None
  if not isinstance(saved, dict):
    raise ValueError(f'configs/from_run.py:{run}: {path} holds a JSON {type(saved).__name__}, '
                     'not a run\'s config.')
  return base.from_saved(saved, source=path)
