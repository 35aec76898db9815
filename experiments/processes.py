"""The commands the runner starts: main.py in a process forked from a preloaded server (or a
fresh interpreter), its log, SIGTERM passed on to them, and the checkout's git commit.
"""

import contextlib
import datetime
import os
import subprocess
import sys
import tempfile
import threading
import time

from experiments import spec
from gated_attention import storage


_PRINT_LOCK = threading.Lock()


def log(message: str):
  with _PRINT_LOCK:
    print(message, flush=True)


# The modules every main.py command imports (JAX, Flax, orbax, grain, matplotlib: ~2-3 s per
# process on a 2-core CPU), imported once by a fork server that starts each command. Not
# gated_attention.cli: it defines the --config.* override flags from sys.argv when imported, so
# each command imports it itself.
_PRELOAD = ['gated_attention.modes.train', 'gated_attention.modes.analyze',
            'gated_attention.modes.long_context', 'gated_attention.training.loop',
            'gated_attention.analysis.plots']


_FORKSERVER = []


def _forkserver():
  """A multiprocessing context whose processes fork from a server that has imported _PRELOAD
  (single-threaded: nothing is initialised, no devices, no compiled programs); None where the
  platform has no fork server."""
  if not _FORKSERVER:
    import multiprocessing  # pylint: disable=g-import-not-at-top
    try:
      ctx = multiprocessing.get_context('forkserver')
      ctx.set_forkserver_preload(_PRELOAD)
    except ValueError:
      ctx = None
    _FORKSERVER.append(ctx)
  return _FORKSERVER[0]


def _main_py(args: list[str], log_path: str):
  """In a forked process: `python args...` (main.py's command line), output to log_path."""
  import atexit  # pylint: disable=g-import-not-at-top
  fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  os.dup2(fd, 1)
  os.dup2(fd, 2)
  os.chdir(spec.REPO)
  sys.argv = list(args)
  from gated_attention import cli  # pylint: disable=g-import-not-at-top
  try:
    cli.run()
  finally:  # multiprocessing ends the process with os._exit: the exit handlers run here
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()


class Stopped(Exception):
  """The runner got SIGTERM: no further command starts."""


_CHILDREN = {}        # id -> the running commands' processes (Popen or multiprocessing.Process)


_CHILDREN_LOCK = threading.RLock()  # the handler may run while the main thread holds it


STOPPING = threading.Event()


def on_sigterm(signum, frame):  # pylint: disable=unused-argument
  """SIGTERM to the runner (a scheduler's time limit, `kill`): the commands it started are
  forked from a server, not in its process group, so it passes the signal on (a training saves a
  checkpoint and stops, training/loop.py), waits for them and starts nothing more."""
  STOPPING.set()
  with _CHILDREN_LOCK:
    children = list(_CHILDREN.values())
  for child in children:
    try:
      child.terminate()
    except (OSError, ValueError, AttributeError):
      pass


def call(args: list[str], log_path: str) -> tuple[int, float]:
  """Runs `python args...` (a main.py command) in the repository root, output to log_path;
  (exit code, seconds). The process forks from the preloaded server (as if started afresh,
  without the imports), or is a new interpreter where there is none. Raises Stopped once the
  runner got SIGTERM."""
  with _local_log(log_path) as local:
    return _call_logged(args, local)


@contextlib.contextmanager
def _local_log(log_path: str):
  """A local file to append a command's output to: `log_path` itself, or for a log on object
  storage (no append there) a local copy of it, uploaded whole when the command ends."""
  if not storage.is_remote(log_path):
    yield log_path
    return
  fd, local = tempfile.mkstemp(prefix='gated_attention_runner_', suffix='.log')
  try:
    with os.fdopen(fd, 'wb') as f:
      if storage.isfile(log_path):
        f.write(storage.read_bytes(log_path))
    yield local
  finally:
    try:
      with open(local, 'rb') as f:
        storage.write(log_path, f.read())
    finally:
      os.remove(local)


def _call_logged(args: list[str], log_path: str) -> tuple[int, float]:
  t0 = time.time()
  with open(log_path, 'a') as log:
    log.write(f'\n$ {spec.shell(args)}\n')
    log.flush()
    ctx = _forkserver() if args and args[0] == 'main.py' else None
    with _CHILDREN_LOCK:
      if STOPPING.is_set():
        raise Stopped()
      if ctx is None:
        child = subprocess.Popen([sys.executable] + args, cwd=spec.REPO, stdout=log,
                                 stderr=subprocess.STDOUT,
                                 env=dict(os.environ, PYTHONUNBUFFERED='1'))
      else:
        child = ctx.Process(target=_main_py, args=(args, log_path))
        child.start()
      _CHILDREN[id(child)] = child
    try:
      if ctx is None:
        return child.wait(), time.time() - t0
      child.join()
    finally:
      with _CHILDREN_LOCK:
        _CHILDREN.pop(id(child), None)
  rc = child.exitcode
  return (rc if rc >= 0 else 128 - rc), time.time() - t0


def failure(log_path: str, rc: int) -> str:
  text = storage.read_text(log_path)
  stopped = 'Training stopped at step' in text or 'training diverged' in text
  return 'diverged' if stopped else f'failed (exit {rc})'


def now() -> str:
  return datetime.datetime.now().isoformat(timespec='seconds')


def git_commit() -> str:
  """The checkout's commit, marked when the working tree has uncommitted changes.

  docs/ is left out: the runner writes results.md and the figures there itself.
  """
  def git(*a):
    return subprocess.run(['git', *a], cwd=spec.REPO, capture_output=True, text=True).stdout
  commit = git('rev-parse', '--short', 'HEAD').strip() or 'unknown'
  changed = git('status', '--porcelain', '--', '.', ':(exclude)docs').strip()
  return commit + (' (with uncommitted changes)' if changed else '')
