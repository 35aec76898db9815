"""--mode=config: the resolved run config, as JSON on stdout (what RUN/config.json would hold).

  python main.py --mode=config --config=configs/g1_headwise.py:moe_tiny --config.train.steps=50
  python main.py --mode=config --workdir=runs/g1                  # the run's own, as it resumes
  python main.py --mode=config --workdir=runs/g1 --config.train.steps=2000

A new run: the --config file with every --config.x.y override applied. With --workdir naming a
run and no --config: the run's saved config with the overrides, as `--mode=train` would continue
it (modes/train.py `train_config`); with --config too, the given one, and any difference the run
would refuse is named. Checked, as a run checks it before any work: the schema (every key a
field, every value of its kind: cli.py), the model (model/config.py), the loop's and the
stability guard's settings, and the batch against the data-parallel shards of the devices here.
Notes go to stderr, so `> config.json` keeps the JSON alone. `train.grad_accum='auto'` is shown
as given: --mode=train chooses the number on its devices (training/grad_accum.py).
"""

import json
import sys

from gated_attention import sharding
from gated_attention import storage
from gated_attention.config import schema
from gated_attention.model.config import ModelConfig
from gated_attention.runs import rundir


def _note(text: str):
  print(text, file=sys.stderr, flush=True)


def resolved(args):
  """The config `--mode=train` would run with: the --config given, or a run's saved one."""
  from gated_attention.modes import train  # pylint: disable=g-import-not-at-top
  if args.workdir:
    return train.train_config(args, say=_note)
  return args.config


def check_config(config, where: str):
  """What a run checks before any work (ConfigError / UserError naming the field)."""
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention.training import fit, session  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train as train_lib  # pylint: disable=g-import-not-at-top
  schema.check(config, where=where)
  ModelConfig.from_config(config.model)
  sharding.get_rules(config.mesh.rules)
  session.check_loop_config(config)
  if not schema.is_auto(config.train.grad_accum):
    mesh = sharding.mesh_shape(config.mesh, jax.device_count())
    train_lib.check_train_config(config, fit.batch_shards(config, jax.device_count()), mesh)


def main(args):
  config = resolved(args)
  saved = rundir.read_saved_config(args.workdir) if args.workdir else None
  given = [a for a in sys.argv[1:] if a.startswith('--config=')]
  check_config(config, where=given[-1] if given else (f'the saved config of {args.workdir}' if saved
                                                 else '--config'))
  if saved is not None and args.config_given:
    diffs = rundir.config_differences(saved, json.loads(config.to_json()))
    if diffs:
      _note(f'Note: {args.workdir} holds a run with another config; --mode=train would refuse '
            'to continue it with this one:\n  ' + '\n  '.join(diffs))
  elif args.workdir and saved is None and storage.exists(args.workdir):
    _note(f'Note: {args.workdir} holds no run ({rundir.CONFIG_FILE}): a new run would start '
          'there with this config.')
  if args.overrides:
    _note('Overrides applied: ' + ', '.join(f'{k}={v!r}' for k, v in args.overrides.items()))
  try:
    print(config.to_json(indent=2), flush=True)
  except BrokenPipeError:            # `| head`: the reader has what it wanted
    import os  # pylint: disable=g-import-not-at-top
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return
  _note(f'Checked: the schema, the model, the loop and the batch on the devices here '
        f'({config.variant}:{config.scale}).')
