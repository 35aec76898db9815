"""Train, inspect and compare gated-attention models.

  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1             # train (tiny)
  python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=params       # parameter counts
  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1 --mode=analyze
  python main.py --mode=compare runs/baseline runs/g1                             # paper-style table
  python main.py --config=configs/baseline.py:moe_15a2b --mode=memory             # per-device bytes
  python main.py --config=configs/baseline.py:moe_15a2b --mode=compile --topology=v5p:4x4x4
  python main.py --mode=import --hf=/data/1B_gate_headwise --workdir=runs/hf_headwise
  python main.py --mode=export --workdir=runs/g1_headwise --out=out/g1_headwise_hf
  python main.py --mode=sample --workdir=runs/g1 --prompt="The cat" --max_new_tokens=100
  python main.py --config=configs/extend_context.py:runs/g1 --workdir=runs/g1_1k   # longer context
  python main.py --mode=long_context --workdir=runs/g1_1k      # loss by position, RULER-style tasks
Any config field can be overridden: --config.train.steps=100 --config.model.num_layers=2.
"""

import json
import os
import sys
import textwrap

from absl import app, flags, logging
from ml_collections import config_flags

from gated_attention.errors import UserError



def _fail(message: str):
  print('\n'.join(textwrap.fill(line, 100) for line in message.splitlines()), file=sys.stderr)
  print('(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)', file=sys.stderr)
  sys.exit(1)


def _bad_override(e: Exception):
  if os.environ.get('GATED_ATTENTION_TRACEBACK'):
    raise e
  given = [a for a in sys.argv[1:] if a.startswith('--config.')]
  _fail(f'Error in a --config override ({", ".join(given)}): {type(e).__name__}: {e}. Overrides '
        'must name fields of the config (configs/base.py lists them) and give values of their '
        'type.')


try:  # the override flags (--config.x.y=...) are typed against the default config right here
  config_flags.DEFINE_config_file('config', 'configs/g1_elementwise.py',
                                  'A config file, with the scale after a colon: '
                                  'configs/<variant>.py:<scale>.', lock_config=True)
except (AttributeError, KeyError, TypeError, ValueError) as error:
  _bad_override(error)
flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, metrics, analysis.')
flags.DEFINE_enum('mode', 'train', ['train', 'params', 'analyze', 'compare', 'memory', 'compile',
                                     'import', 'export', 'sample', 'long_context'],
                  'What to do.')
flags.DEFINE_string('topology', None, '--mode=compile: a TPU topology name, e.g. v5p:4x4x4.')
flags.DEFINE_string('out', None, '--mode=compare: output directory (default: compare/); '
                    '--mode=export: the Hugging Face directory to write.')
flags.DEFINE_string('hf', None, '--mode=import: a local Hugging Face model directory.')
flags.DEFINE_enum('export_dtype', 'float32', ['float32', 'bfloat16'],
                  '--mode=export: the dtype of the written weights.')
flags.DEFINE_string('remote_code_dir', None, '--mode=export of a G1 gate: a directory holding the '
                    "authors' modeling_qwen3.py / configuration_qwen3.py to copy beside it.")
flags.DEFINE_multi_string('prompt', [], '--mode=sample: a prompt (repeat for a batch).')
flags.DEFINE_integer('max_new_tokens', 128, '--mode=sample: tokens to generate per prompt.')
flags.DEFINE_float('temperature', 0.0, '--mode=sample: 0 is greedy; above 0 samples.')
flags.DEFINE_float('top_p', 1.0, '--mode=sample: nucleus sampling keeps this probability mass.')
flags.DEFINE_integer('sample_seed', 0, '--mode=sample: the seed of the samples.')
flags.DEFINE_integer('step', None, '--mode=sample: the checkpoint step (default: the latest).')
FLAGS = flags.FLAGS


def _parse_flags(argv):
  """absl's parsing, with a bad config file or override as one message, not a traceback."""
  try:
    argv = FLAGS(argv)
    FLAGS.config.get('model')  # a config file that failed to load raises here
    return argv
  except OSError as e:
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _fail(f'Error in the command line: --config: {e}')
  except SyntaxError as e:  # the config file does not parse (IndentationError too)
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    text = f': {e.text.strip()}' if e.text else ''
    _fail(f'Error in the command line: --config: {e.filename} does not parse: {e.msg} at line '
          f'{e.lineno}{text}')
  except (ImportError, NameError) as e:  # the config file imports or names what is not there
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _fail(f'Error in the command line: --config: loading the config file raised '
          f'{type(e).__name__}: {e}')
  except flags.Error as e:  # the config file raised (ml_collections puts its traceback inside)
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    last = [l.strip() for l in str(e).splitlines() if l.strip()]
    _fail(f'Error in the command line: {last[0]}\n{last[-1]}' if len(last) > 1 else
          f'Error in the command line: {e}')
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # --config.<unknown field>
    _bad_override(e)


def main(argv):
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO; -v 0 shows it again
    logging.set_verbosity(logging.WARNING)
  from gated_attention import console  # pylint: disable=g-import-not-at-top
  try:
    with console.without_event_loop_noise():
      dispatch(FLAGS.config, argv[1:])
  except UserError as e:  # a setting, file or run directory that cannot work: one paragraph
    if FLAGS.verbosity >= 1 or os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _fail(f'Error ({type(e).__name__}): {e}')


def _train_config(config, workdir: str):
  """The --config given; without one, a workdir that holds a run continues with its saved
  config (plus the command line's --config.x overrides)."""
  saved = os.path.join(workdir, 'config.json')
  if FLAGS['config'].present or not os.path.isfile(saved):
    return config
  from configs import from_run  # pylint: disable=g-import-not-at-top
  resumed = from_run.get_config(saved)
  overrides = dict(getattr(FLAGS['config'], 'override_values', None) or {})
  resumed.update_from_flattened_dict(overrides)
  print(f'No --config given: continuing with the saved config of {workdir} '
        f'({resumed.variant}:{resumed.scale}{", with overrides " if overrides else ""}'
        f'{", ".join(f"{k}={v}" for k, v in overrides.items())}).', flush=True)
  return resumed


def _libraries_log_to(log_dir: str):
  """The libraries' own log records (orbax's warnings, an asynchronous save's error logs with
  their tracebacks) go to files in `log_dir`, not the console: the console keeps the progress and
  our one-paragraph errors. --verbosity=... keeps everything on the console."""
  import atexit  # pylint: disable=g-import-not-at-top
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  workdir = os.path.dirname(os.path.abspath(log_dir))
  created = not os.path.exists(workdir)
  try:
    os.makedirs(log_dir, exist_ok=True)
  except OSError:
    return  # an unwritable workdir: the run refuses it with a clear message of its own

  def remove_if_unused():
    """A workdir this command created and then wrote nothing else into (it failed first: a bad
    setting, missing data) is not left behind holding only logs/."""
    try:
      if os.listdir(workdir) == [os.path.basename(log_dir)]:
        logging.get_absl_handler().flush()
        shutil.rmtree(workdir, ignore_errors=True)
    except OSError:
      pass
  if created:
    atexit.register(remove_if_unused)
  logging.get_absl_handler().use_absl_log_file('main', log_dir)
  std_logging.raiseExceptions = False  # a full disk: no "--- Logging error ---" on the console


def _interop():
  from gated_attention.runs.hf import interop as rundir  # pylint: disable=g-import-not-at-top
  if FLAGS.mode == 'import':
    if not FLAGS.hf:
      sys.exit('--mode=import needs --hf=DIR, a local Hugging Face model directory.')
    overrides = dict(getattr(FLAGS['config'], 'override_values', None) or {})
    print(json.dumps(rundir.import_run(FLAGS.hf, FLAGS.workdir, overrides=overrides), indent=1))
  else:
    if not FLAGS.out:
      sys.exit('--mode=export needs --out=DIR, the Hugging Face directory to write.')
    print(json.dumps(rundir.export_run(FLAGS.workdir, FLAGS.out, dtype=FLAGS.export_dtype,
                                       remote_code_dir=FLAGS.remote_code_dir), indent=1))


def dispatch(config, rest):
  if rest and FLAGS.mode != 'compare':
    sys.exit(f'Unexpected arguments {rest}; only --mode=compare takes run directories.')
  if FLAGS.mode == 'params':
    from gated_attention.model import transformer as model  # pylint: disable=g-import-not-at-top
    from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
    print(json.dumps(model.param_report(ModelConfig.from_config(config.model))))
  elif FLAGS.mode == 'memory':
    from gated_attention.compile import memory  # pylint: disable=g-import-not-at-top
    print(json.dumps(memory.report(config), indent=2))
  elif FLAGS.mode == 'compile':
    from gated_attention.compile import aot  # pylint: disable=g-import-not-at-top
    print(json.dumps(aot.report(config, FLAGS.topology), indent=2))
  elif FLAGS.mode == 'compare':
    from gated_attention.analysis import compare  # pylint: disable=g-import-not-at-top
    if not rest:
      sys.exit('--mode=compare needs run directories: main.py --mode=compare RUN1 RUN2 ...')
    print(compare.compare(rest, FLAGS.out or 'compare'))
  else:
    if not FLAGS.workdir:
      sys.exit(f'--workdir is required for --mode={FLAGS.mode} (for example --workdir=runs/g1).')
    if FLAGS.mode in ('import', 'export'):
      return _interop()
    from gated_attention import distributed  # pylint: disable=g-import-not-at-top
    distributed.initialize(config.distributed)
    if FLAGS.mode == 'train' and not FLAGS['verbosity'].present:
      _libraries_log_to(os.path.join(FLAGS.workdir, 'logs'))
    if FLAGS.mode == 'train':
      from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
      loop.run(_train_config(config, FLAGS.workdir), FLAGS.workdir)
    elif FLAGS.mode == 'sample':
      from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
      generate.sample_command(
          FLAGS.workdir, FLAGS.prompt, max_new_tokens=FLAGS.max_new_tokens,
          temperature=FLAGS.temperature, top_p=FLAGS.top_p, seed=FLAGS.sample_seed,
          overrides=dict(getattr(FLAGS['config'], 'override_values', None) or {}), step=FLAGS.step)
    elif FLAGS.mode == 'long_context':
      from gated_attention.inference import long_context  # pylint: disable=g-import-not-at-top
      long_context.run(FLAGS.workdir, overrides=dict(
          getattr(FLAGS['config'], 'override_values', None) or {}))
    else:
      from gated_attention.analysis import analyze  # pylint: disable=g-import-not-at-top
      analyze.run(config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main, flags_parser=_parse_flags)
