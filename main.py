"""Train, inspect and compare gated-attention models.

  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1             # train (tiny)
  python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=params       # parameter counts
  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1 --mode=analyze
  python main.py --mode=compare runs/baseline runs/g1                             # paper-style table
  python main.py --config=configs/baseline.py:moe_15a2b --mode=memory             # per-device bytes
  python main.py --config=configs/baseline.py:moe_15a2b --mode=compile --topology=v5p:4x4x4
Any config field can be overridden: --config.train.steps=100 --config.model.num_layers=2.
"""

import json
import os
import sys
import textwrap

from absl import app, flags, logging
from ml_collections import config_flags

from gated_attention.errors import UserError

config_flags.DEFINE_config_file('config', 'configs/g1_elementwise.py',
                                'A config file, with the scale after a colon: '
                                'configs/<variant>.py:<scale>.', lock_config=True)
flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, metrics, analysis.')
flags.DEFINE_enum('mode', 'train', ['train', 'params', 'analyze', 'compare', 'memory', 'compile'],
                  'What to do.')
flags.DEFINE_string('topology', None, '--mode=compile: a TPU topology name, e.g. v5p:4x4x4.')
flags.DEFINE_string('out', None, '--mode=compare: output directory (default: compare/).')
FLAGS = flags.FLAGS


def main(argv):
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO; -v 0 shows it again
    logging.set_verbosity(logging.WARNING)
  try:
    dispatch(FLAGS.config, argv[1:])
  except UserError as e:  # a setting, file or run directory that cannot work: one paragraph
    if FLAGS.verbosity >= 1 or os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    print('\n'.join(textwrap.fill(line, 100) for line in
                    f'Error ({type(e).__name__}): {e}'.splitlines()), file=sys.stderr)
    print('(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)', file=sys.stderr)
    sys.exit(1)


def dispatch(config, rest):
  if rest and FLAGS.mode != 'compare':
    sys.exit(f'Unexpected arguments {rest}; only --mode=compare takes run directories.')
  if FLAGS.mode == 'params':
    from gated_attention import model  # pylint: disable=g-import-not-at-top
    from gated_attention.config import ModelConfig  # pylint: disable=g-import-not-at-top
    print(json.dumps(model.param_report(ModelConfig.from_config(config.model))))
  elif FLAGS.mode == 'memory':
    from gated_attention import memory  # pylint: disable=g-import-not-at-top
    print(json.dumps(memory.report(config), indent=2))
  elif FLAGS.mode == 'compile':
    from gated_attention import aot  # pylint: disable=g-import-not-at-top
    print(json.dumps(aot.report(config, FLAGS.topology), indent=2))
  elif FLAGS.mode == 'compare':
    from gated_attention.analysis import compare  # pylint: disable=g-import-not-at-top
    if not rest:
      sys.exit('--mode=compare needs run directories: main.py --mode=compare RUN1 RUN2 ...')
    print(compare.compare(rest, FLAGS.out or 'compare'))
  else:
    if not FLAGS.workdir:
      sys.exit(f'--workdir is required for --mode={FLAGS.mode} (for example --workdir=runs/g1).')
    from gated_attention import distributed  # pylint: disable=g-import-not-at-top
    distributed.initialize(config.distributed)
    if FLAGS.mode == 'train':
      from gated_attention import loop  # pylint: disable=g-import-not-at-top
      loop.run(config, FLAGS.workdir)
    else:
      from gated_attention.analysis import analyze  # pylint: disable=g-import-not-at-top
      analyze.run(config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main)
