"""The command line of main.py and of the `gated-attention` console command (pyproject.toml).

Flags, one-paragraph errors, and the dispatch from the mode table (modes/__init__.py): the
command line is parsed once into `modes.Args`, then `MODES[--mode].load().main(args)`. The
config files are found relative to the working directory first, then to the project's own
`configs/` (in the repository, or gated_attention/configs in an installed package), so
`gated-attention --config=configs/baseline.py` works from anywhere once the package is installed
(`pip install .`).
"""

import os
import sys
import textwrap

from absl import app, flags, logging
from ml_collections import config_flags

import gated_attention
from gated_attention import modes
from gated_attention.config import scales, schema
from gated_attention.runs import rundir
from gated_attention.errors import UserError


def _fail(message: str):
  print('\n'.join(textwrap.fill(line, 100) for line in message.splitlines()), file=sys.stderr)
  print('(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)', file=sys.stderr)
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  if storage.waits.abandoned():   # threads stuck on a stalled storage: Python would join them
    storage.waits.exit_now(status=1)
  sys.exit(1)


def _bad_override(e: Exception):
  if os.environ.get('GATED_ATTENTION_TRACEBACK'):
    raise e
  given = [a for a in sys.argv[1:] if a.startswith('--config.')]
  _fail(f'Error in a --config override ({", ".join(given)}): {type(e).__name__}: {e}. Overrides '
        'must name fields of the config (gated_attention/config/schema.py lists them) and give values of their '
        'type.')


# configs/ of this installation: --config=configs/<variant>.py is found in the repository's root
# or, installed, in the package (gated_attention/configs), when the working directory has no such
# file (the console command run outside the repository).
PACKAGE_DIR = os.path.dirname(os.path.abspath(gated_attention.__file__))
PROJECT_ROOT = os.path.dirname(PACKAGE_DIR)
DEFAULT_CONFIG = 'configs/g1_elementwise.py'


def resolve_config_path(value: str) -> str:
  """`--config`'s file (before the ':' of its argument) relative to the working directory if it
  is there, else to the project's root or the installed package, where configs/ is."""
  path, sep, arg = value.partition(':')
  if path and not os.path.isabs(path) and not os.path.exists(path):
    for root in (PROJECT_ROOT, PACKAGE_DIR):
      candidate = os.path.join(root, path)
      if os.path.exists(candidate):
        return candidate + sep + arg
  return value


try:  # the override flags (--config.x.y=...) are typed against the default config right here
  config_flags.DEFINE_config_file('config', resolve_config_path(DEFAULT_CONFIG),
                                  'A config file, with the scale after a colon: '
                                  'configs/<variant>.py:<scale>.', lock_config=True)
except (AttributeError, KeyError, TypeError, ValueError) as error:
  _bad_override(error)
flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, metrics, analysis.')
flags.DEFINE_enum('mode', 'train', list(modes.MODES),
                  'What to do: ' + '; '.join(f'{m.name}: {m.help}' for m in modes.MODES.values()))


def _define(flag: modes.Flag):
  """absl's flag of a mode flag (modes.FLAGS), its help naming the modes that take it."""
  help_ = f'--mode={", ".join(modes.modes_taking(flag.name))}: {flag.help}'
  if flag.kind == 'enum':
    flags.DEFINE_enum(flag.name, flag.default, list(flag.enum_values), help_)
  else:
    getattr(flags, f'DEFINE_{flag.kind}')(flag.name, flag.default, help_)


for _flag in modes.FLAGS.values():
  _define(_flag)
FLAGS = flags.FLAGS


def _parse_flags(argv):
  """absl's parsing, with a bad config file or override as one message, not a traceback."""
  try:
    argv = FLAGS(argv)
    FLAGS.config.get('model')  # a config file that failed to load raises here
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
  except Exception as e:  # pylint: disable=broad-except  # the config file's get_config raised
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    import traceback  # pylint: disable=g-import-not-at-top
    frames = traceback.extract_tb(e.__traceback__)
    last = frames[-1] if frames else None
    where = f' (at {last.filename}, line {last.lineno}: {last.line})' if last else ''
    _fail(f'Error in the command line: --config: the config file raised {type(e).__name__}: '
          f'{e}{where}.')
  try:  # a key the file added that is no field (c.train.stepz = 10), a value of the wrong kind
    given = [a for a in sys.argv[1:] if a.startswith('--config=')]
    schema.check(FLAGS.config, where=given[-1] if given else f'--config={DEFAULT_CONFIG}')
  except UserError as e:
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _fail(f'Error in the command line: {e}')
  return argv


def main(argv):
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO; -v 0 shows it again
    logging.set_verbosity(logging.WARNING)
  from gated_attention import console  # pylint: disable=g-import-not-at-top
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  storage.waits.own_process()      # a stalled storage may end this process (storage/waits.py)
  from gated_attention.training import interrupt  # pylint: disable=g-import-not-at-top
  interrupt.own_process()          # a run's signal handlers stay until the process exits
  try:
    with console.without_event_loop_noise():
      dispatch(_args(argv[1:]), keep_logs_on_console=FLAGS['verbosity'].present)
  except UserError as e:  # a setting, file or run directory that cannot work: one paragraph
    if FLAGS.verbosity >= 1 or os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _fail(f'Error ({type(e).__name__}): {e}')
  except KeyboardInterrupt:  # Ctrl-C during start-up, or a second one while the loop saves
    if FLAGS.verbosity >= 1 or os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _interrupted()
  finally:
    # Python's last garbage collection at exit walked every object of JAX, Flax and orbax for
    # seconds (4.4 s of a 54-s tiny run here, after the run had ended): the objects still alive
    # are left to the process's end instead.
    import gc  # pylint: disable=g-import-not-at-top
    gc.freeze()


def _stop_now(signum, frame):  # pylint: disable=unused-argument
  """Ctrl-C before training starts (main.py installs the same before its imports); a run's lock
  taken while it starts is freed first."""
  lock = sys.modules.get('gated_attention.runs.lock')   # loaded: a lock may be held
  if lock is not None:
    lock.release_all()
  os.write(1, b'\nInterrupted: stopped at once. Checkpoints already written are intact; run the '
           b'same command again to resume from the latest.\n')
  os._exit(130)  # pylint: disable=protected-access


def _interrupted():
  print('\nInterrupted: stopped at once. Checkpoints already written are intact (a save that '
        'was under way is not used); run the same command again to resume from the latest.',
        file=sys.stderr)
  sys.exit(130)


def _libraries_log_to(log_dir: str):
  """The libraries' own log records (orbax's warnings, an asynchronous save's error logs with
  their tracebacks) go to files in `log_dir`, not the console: the console keeps the progress and
  our one-paragraph errors. --verbosity=... keeps everything on the console."""
  import atexit  # pylint: disable=g-import-not-at-top
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  if storage.is_remote(log_dir):     # object storage: written here, copied there at the exit
    local = storage.scratch.make('gated_attention_logs_')   # a killed command's are removed here

    def upload():
      try:
        logging.get_absl_handler().flush()
        for name in storage.scratch.files(local):
          path = os.path.join(local, name)
          if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path):
            with open(path, 'rb') as f:
              storage.write(storage.join(log_dir, name), f.read())
      except Exception:  # pylint: disable=broad-except  # logs are a convenience; never fail on them
        pass
      storage.scratch.remove(local)
    atexit.register(upload)
    logging.get_absl_handler().use_absl_log_file('main', local)
    std_logging.raiseExceptions = False
    return
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


def _args(rest) -> modes.Args:
  """The command line, parsed once, as the modes' explicit arguments: a flag of another mode
  than --mode's is refused, naming the modes that take it."""
  mode = modes.MODES[FLAGS.mode]
  for name in modes.FLAGS:
    if FLAGS[name].present and name not in mode.flags:
      takers = ' / --mode='.join(modes.modes_taking(name))
      _fail(f'Error in the command line: --{name} belongs to --mode={takers}; '
            f'--mode={mode.name} does not take it.')
  options = {modes.FLAGS[name].key: FLAGS[name].value for name in mode.flags}
  if 'seeds' in options:
    options['seeds'] = _seeds(options['seeds'])
  flag = FLAGS['config']
  return modes.Args(
      config=FLAGS.config, mode=mode.name, config_given=bool(flag.present),
      overrides=dict(getattr(flag, 'override_values', None) or {}), workdir=FLAGS.workdir,
      runs=tuple(rest), options=options)


def _seeds(values) -> tuple:
  """--seeds as integers (a one-paragraph error for anything else)."""
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    _fail(f'Error in the command line: --seeds={",".join(values)}: give integer seeds separated '
          'by commas, e.g. --seeds=0,1,2.')


def dispatch(args: modes.Args, *, keep_logs_on_console: bool = False):
  """Runs the mode of `args` (modes.MODES, one module each)."""
  mode = modes.MODES[args.mode]
  if args.runs and not mode.takes_runs:
    sys.exit(f'Unexpected arguments {list(args.runs)}; only --mode=compare takes run '
             'directories.')
  if mode.needs_workdir and not args.workdir:
    sys.exit(f'--workdir is required for --mode={mode.name} (for example --workdir=runs/g1).')
  if mode.distributed:
    from gated_attention import cluster  # pylint: disable=g-import-not-at-top
    cluster.initialize(args.config.distributed)
  module = mode.load()
  if hasattr(module, 'check'):   # the mode's own checks of its arguments, before any work
    module.check(args)
  from gated_attention import compilation_cache  # pylint: disable=g-import-not-at-top
  compilation_cache.enable(args.config.get('compilation_cache', ''))
  if mode.writes_run and not keep_logs_on_console:
    seeds = args.options.get('seeds')
    first = (next(iter(rundir.seed_workdirs(args.workdir, seeds).values())) if seeds
             else args.workdir)    # several seeds: the libraries' logs go to the first's logs/
    _libraries_log_to(_join(first, rundir.LOGS_DIR))
  try:
    module.main(args)
  except Exception as e:
    if mode.distributed:   # a lost process: its paragraph (cluster/liveness.py), not this error
      cluster.await_verdict(e)
    raise
  finally:
    if mode.distributed:   # the exit (jax.distributed's shutdown) is bounded too (issue 57)
      from gated_attention.training import interrupt  # pylint: disable=g-import-not-at-top
      interrupt.bound_exit(args.config.train.get('stop_timeout', interrupt.DEFAULT_STOP_TIMEOUT))
  if mode.distributed:
    cluster.finish()   # a multi-process run: the others stop watching this one's heartbeat


def _join(workdir: str, name: str) -> str:
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  return storage.join(workdir, name)


def _resolved_argv(argv: list[str]) -> list[str]:
  """argv with --config=FILE[:ARG] (or --config FILE[:ARG]) found by resolve_config_path."""
  out = []
  for a in argv:
    if a.startswith('--config='):
      a = '--config=' + resolve_config_path(a[len('--config='):])
    elif out and out[-1] == '--config':
      a = resolve_config_path(a)
    out.append(a)
  return out


# ----------------------------------------------------------------------------------------------
# --help: the modes, one line each, and the common flags (absl's own list is --helpfull)

EXAMPLES = (
    ('train the default (G1 elementwise, tiny, CPU)',
     'main.py --config=configs/g1_elementwise.py --workdir=runs/g1'),
    ('another variant and scale, with overrides',
     'main.py --config=configs/baseline.py:moe_tiny --workdir=runs/b --config.train.steps=2000'),
    ('the resolved config of that command',
     'main.py --mode=config --config=configs/baseline.py:moe_tiny --config.train.steps=2000'),
    ('three seeds as one program', 'main.py --config=configs/g1_headwise.py '
     '--workdir=runs/hw_s{seed} --seeds=0,1,2'),
    ('analyse a run, then compare runs', 'main.py --mode=analyze --workdir=runs/g1 && '
     'python main.py --mode=compare runs/baseline runs/g1'),
    ('a weighted mixture of two text corpora', 'main.py --workdir=runs/mix '
     '--config.data.mixture="{\'a\': {\'weight\': 0.7, \'source\': \'text\', \'path\': '
     '\'a/*.txt\'}, \'b\': {\'weight\': 0.3, \'source\': \'text\', \'path\': \'b/*.txt\'}}"'),
    ('tokenize once for data.source=tokenized', 'main.py --mode=tokenize '
     '--config.data.source=jsonl --config.data.path="data/*.jsonl" --out=tokens/corpus'),
    ('a pod: the grad_accum that fits, found on the devices',
     'main.py --config=configs/g1_elementwise.py:dense_1p7b_28l --workdir=gs://B/runs/g1 '
     '--config.train.grad_accum=auto ...'),
    ('import a released model, continue a text', 'main.py --mode=import --hf=/data/1B_gate_headwise '
     '--workdir=runs/hf_hw && python main.py --mode=sample --workdir=runs/hf_hw --prompt="The"'),
)
COMMON_FLAGS = (
    ('--mode=MODE', 'what to do (above; default train)'),
    ('--config=FILE[:SCALE]', f'a variant file and its scale (default {DEFAULT_CONFIG}:tiny); '
     f'the variants are configs/*.py, the scales {", ".join(scales.SCALES)}'),
    ('--config.SECTION.FIELD=V', 'override any field of the config (gated_attention/config/'
     'schema.py lists them; --mode=config prints the result)'),
    ('--workdir=DIR', 'the run directory, local or gs:// (train, analyze, export, sample, '
     'long_context, import; config: a run\'s own config)'),
    ('--verbosity=1', 'the libraries\' logs on the console, and tracebacks with errors'),
)


def usage(mode_name: str | None = None) -> str:
  """`--help`: the modes with one line each, the common flags and examples; with --mode=NAME,
  that mode's own flags in full."""
  width = 100
  fill = lambda text, indent: textwrap.fill(text, width, initial_indent=indent,  # noqa: E731
                                            subsequent_indent=' ' * len(indent))
  out = ['Train, inspect and compare gated-attention models (Qiu et al., NeurIPS 2025).', '',
         'usage: python main.py [--mode=MODE] [--config=configs/<variant>.py[:<scale>]] '
         '[--workdir=DIR]', '                      [--config.<section>.<field>=VALUE ...] '
         '[flags of the mode]', '', 'Modes (--mode=):']
  for m in modes.MODES.values():
    out.append(f'  {m.name:<13}{m.help}')
  out += ['', 'Common flags:']
  for flag, text in COMMON_FLAGS:
    out.append(fill(text, f'  {flag:<27}'))
  chosen = modes.MODES.get(mode_name) if mode_name else None
  if chosen is not None:
    out += ['', f'Flags of --mode={chosen.name}:' if chosen.flags else
            f'--mode={chosen.name} takes no flags of its own.']
    for name in chosen.flags:
      f = modes.FLAGS[name]
      default = '' if f.default in (None, [], False, '') else f' (default {f.default})'
      out.append(fill(f'{f.help}{default}', f'  --{name:<25}'))
  else:
    out += ['', 'Flags of the modes (python main.py --mode=MODE --help explains each):']
    for name in modes.FLAGS:
      out.append(fill(', '.join(modes.modes_taking(name)), f'  --{name:<25}'))
  out += ['', 'Examples:']
  for what, command in EXAMPLES:
    out += [f'  # {what}', f'  python {command}']
  out += ['', 'More: README.md (the modes, the guides by task), docs/training.md; every flag '
          'with absl\'s: --helpfull.']
  return '\n'.join(out)


def _help_wanted(argv: list[str]) -> str | None:
  """'help' for --help / -h / --helpshort, 'full' for --helpfull, else None."""
  for a in argv:
    if a in ('--help', '-h', '--helpshort', '-?'):
      return 'help'
    if a == '--helpfull':
      return 'full'
  return None


def _mode_in(argv: list[str]) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith('--mode='):
      return a[len('--mode='):]
    if a == '--mode' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def run():
  """The entry point: `python main.py ...` and the `gated-attention` console command."""
  sys.argv = _resolved_argv(sys.argv)
  wanted = _help_wanted(sys.argv[1:])
  if wanted == 'help':
    print(usage(_mode_in(sys.argv[1:])))
    sys.exit(0)
  if wanted == 'full':                 # absl's list of every flag (its own exits with status 1)
    print(usage(_mode_in(sys.argv[1:])) + '\n\nEvery flag (absl):\n' + FLAGS.get_help())
    sys.exit(0)
  import signal  # pylint: disable=g-import-not-at-top
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # the console command
    signal.signal(signal.SIGINT, _stop_now)
  try:
    app.run(main, flags_parser=_parse_flags)
  except KeyboardInterrupt:   # while the flags and the config file are read
    if os.environ.get('GATED_ATTENTION_TRACEBACK'):
      raise
    _interrupted()
