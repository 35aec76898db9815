"""--mode=train (the default): trains in --workdir, resuming from its latest checkpoint.

Without --config, a workdir that holds a run continues with its saved config (plus the command
line's --config.x overrides). With --analyze, a run that trains to its last step is analysed in
the same process (modes/analyze.py `after_training`: RUN/analysis/ as --mode=analyze writes
it). With --seeds=0,1,2 the seeds train as one program (training/seeds.py), each in its own run
directory (runs/rundir.py seed_workdirs); without --config they continue with the saved config
of the first seed's directory.
"""

from gated_attention import storage
from gated_attention.errors import ConfigError
from gated_attention.runs import rundir
from gated_attention.training import loop
from gated_attention.training import seeds


def train_config(args, workdir: str | None = None, say=None):
  """The --config given; without one, the saved config of a workdir that holds a run (`workdir`,
  default --workdir), with the command line's overrides (`say` tells which: print)."""
  workdir = workdir or args.workdir
  saved = storage.join(workdir, rundir.CONFIG_FILE)
  if args.config_given or not storage.isfile(saved):
    return args.config
  resumed = rundir.read_config(workdir)
  resumed.update_from_flattened_dict(dict(args.overrides))
  overrides = args.overrides
  (say or print)(f'No --config given: continuing with the saved config of {workdir} '
                 f'({resumed.variant}:{resumed.scale}{", with overrides " if overrides else ""}'
                 f'{", ".join(f"{k}={v}" for k, v in overrides.items())}).')
  return resumed


def check(args):
  """Refuses what this mode's flags cannot do together (cli.dispatch calls it before any
  work, and before main)."""
  if args.seeds and args.analyze:
    raise ConfigError('--analyze analyses a run after --mode=train of one seed; analyse each '
                      'seed\'s run with --mode=analyze --workdir=RUN.')


def main(args):
  if args.seeds:
    workdirs = rundir.seed_workdirs(args.workdir, args.seeds)
    seeds.run(train_config(args, next(iter(workdirs.values()))), workdirs)
  else:
    on_finish = None
    if args.analyze:
      from gated_attention.modes import analyze  # pylint: disable=g-import-not-at-top
      on_finish = analyze.after_training
    loop.run(train_config(args), args.workdir, on_finish=on_finish)
