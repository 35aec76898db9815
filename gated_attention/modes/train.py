"""--mode=train (the default): trains in --workdir, resuming from its latest checkpoint.

Without --config, a workdir that holds a run continues with its saved config (plus the command
line's --config.x overrides).
"""

import os

from gated_attention.runs import rundir
from gated_attention.training import loop


def train_config(args):
  """The --config given; without one, the saved config of a workdir that holds a run, with the
  command line's overrides."""
  saved = os.path.join(args.workdir, rundir.CONFIG_FILE)
  if args.config_given or not os.path.isfile(saved):
    return args.config
  resumed = rundir.read_config(args.workdir)
  resumed.update_from_flattened_dict(dict(args.overrides))
  overrides = args.overrides
  print(f'No --config given: continuing with the saved config of {args.workdir} '
        f'({resumed.variant}:{resumed.scale}{", with overrides " if overrides else ""}'
        f'{", ".join(f"{k}={v}" for k, v in overrides.items())}).', flush=True)
  return resumed


def main(args):
  loop.run(train_config(args), args.workdir)
