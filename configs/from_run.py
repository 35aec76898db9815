"""The saved config of a run: `--config=configs/from_run.py:runs/NAME` (or a config.json path).

Continue a run with exactly its own settings, or start a new run from them with a few overrides
(`--workdir=runs/NEW --config=configs/from_run.py:runs/NAME --config.seed=1`). Fields added to
the schema since the run was saved take their defaults; keys this code does not know are refused
by name, except those retired since (gated_attention/runs/upgrade.py RETIRED_KEYS).
"""

from gated_attention.runs import rundir


def get_config(run: str = ''):
  if not run:
    raise ValueError('configs/from_run.py needs a run directory or a config.json after a colon: '
                     '--config=configs/from_run.py:runs/NAME')
  return rundir.read_config_file(run)
