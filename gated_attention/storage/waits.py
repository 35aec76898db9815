"""Bounds on waiting for storage: a stalled endpoint ends a command with one paragraph and a
non-zero exit instead of keeping it alive for as long as the endpoint is down (issue 50: a
`kill -STOP` of the GCS server left a trainer silent in orbax's finalize for 410 s, until the
server came back; SIGTERM did not stop it).

Three kinds of wait, three bounds (module constants; the environment variables shorten them for
the tests, which stall a server for seconds):

  REQUEST_S           one storage request with all its retries (gcsfs, google-cloud-storage:
                      metrics chunks, the lock, config.json, listings), passed to the clients as
                      their own timeouts: a late request ends as the client's error, nothing is
                      left running. GATED_ATTENTION_STORAGE_REQUEST_S, default 300 s; a large
                      transfer gets `MIN_RATE` on top (a stall, not a slow link, is the target).
  CHECKPOINT_WAIT_S   orbax finishing a save (its background writes and finalize, which have no
                      timeout of their own): `call` waits that long in this thread and then
                      raises a StorageError, leaving orbax's threads behind.
                      GATED_ATTENTION_CHECKPOINT_WAIT_S, default 1800 s.
  a hard deadline     `deadline(...)` around a call that cannot be waited for from another thread
                      (orbax's synchronous part of a save): past it a watchdog prints the
                      paragraph and ends the process (exit status 1), when the command line
                      owns the process (`own_process`; a library caller just waits).

When a wait past its bound ends the run (`closing`: the metrics before a checkpoint, the lock's
heartbeat; or a wait given up: `abandoned()`), the run's closing steps (the last metrics, the
TensorBoard files, the lock's release) get CLOSING_REQUEST_S per request, so a SIGTERM during a
stall stops the process one bound after it, plus seconds. Threads left stuck on storage by a
wait given up would keep Python from exiting: the watchdog ends the process GRACE_S later if it
is still closing, and main.py ends it with os._exit after its paragraph. Committed checkpoints
are never touched; the same command resumes from the latest once the storage answers.
"""

import os
import sys
import threading
import time

from gated_attention.storage import scratch
from gated_attention.errors import StorageError


def _env(name: str, default: float) -> float:
  try:
    value = float(os.environ.get(name, default))
  except ValueError:
    return default
  return value if value > 0 else default


REQUEST_S = _env('GATED_ATTENTION_STORAGE_REQUEST_S', 300.0)
CHECKPOINT_WAIT_S = _env('GATED_ATTENTION_CHECKPOINT_WAIT_S', 1800.0)
# Once a storage wait ends the run (`closing`, or a wait given up), each closing request (the
# last metrics, the TensorBoard files, the lock's release) gets CLOSING_REQUEST_S, and closing
# altogether GRACE_S before the watchdog ends the process (when a wait was given up).
CLOSING_REQUEST_S = min(5.0, REQUEST_S / 5)
GRACE_S = 20 * CLOSING_REQUEST_S
MIN_RATE = 1 << 20            # bytes/s a large transfer is allowed on top of REQUEST_S
EXIT_STATUS = 1

_abandoned: list[str] = []    # what was given up on (threads left waiting on storage)
_closing: list[str] = []      # a storage wait that ends the run (its closing steps are short)
_deadlines: dict[int, tuple[float, str]] = {}
_lock = threading.Condition()
_watchdog: list[threading.Thread] = []


def abandoned() -> list[str]:
  return list(_abandoned)


def closing(what: str):
  """A wait on storage went past its bound and ends the run: the requests of its closing steps
  get CLOSING_REQUEST_S (the endpoint is not answering; SIGTERM's stop is not held up)."""
  _closing.append(what)


def closed():
  """The run that was closing on a stall has closed (training/loop.py, at its end): the next
  one in this process (a notebook's, a test's) waits with the full bounds again. Threads given
  up on are still recorded (`abandoned`): they may keep the process from exiting."""
  del _closing[:]


def _short() -> bool:
  """Whether waits are cut to CLOSING_REQUEST_S: a run is closing on a stall, or a wait was
  given up in a process the command line owns (it is about to end)."""
  return bool(_closing or (_abandoned and _owner))


def request_timeout(nbytes: int = 0) -> float:
  """The bound for one request moving `nbytes`; short once the run is closing on a stall."""
  if _short():
    return CLOSING_REQUEST_S
  return REQUEST_S + nbytes / MIN_RATE


_owner = []                   # set by main.py's command line: the process may be ended here


def own_process():
  """The command line owns this process: a wait given up on, or a hard deadline passed, may end
  it (library use, a notebook or a test, only gets the StorageError)."""
  _owner.append(True)


def _give_up(what: str, paragraph: str):
  """Records a wait given up on; the process must end within GRACE_S from now."""
  _abandoned.append(what)
  if _owner:
    _arm(time.monotonic() + GRACE_S, paragraph)


def give_up(paragraph: str) -> StorageError:
  """A wait given up by its caller (a future waited for with a timeout): recorded as `call`
  records one (the thread left waiting keeps Python from exiting); the StorageError to raise."""
  _give_up(paragraph.split(':', 1)[0], paragraph)
  return StorageError(paragraph)


def call(fn, seconds: float, paragraph: str, progress: threading.Event | None = None):
  """fn() waited for at most `seconds` (in a daemon thread); past it a StorageError with
  `paragraph` (the thread is left behind: see the module docstring). fn's own error is
  raised as it is. With `progress`, an Event fn sets as it gets on (a batch read), the bound is
  on the time without progress: `seconds` more from each time it was set."""
  if _short():                  # the run is ending on a stalled storage: do not wait it out
    seconds = min(seconds, CLOSING_REQUEST_S)
  box = {}

  def target():
    try:
      box['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except  # raised in the caller's thread
      box['error'] = e
  thread = threading.Thread(target=target, name='bounded-storage-wait', daemon=True)
  thread.start()
  while True:
    thread.join(seconds)        # a signal's handler runs meanwhile (the loop's SIGTERM flag)
    if not thread.is_alive() or progress is None or not progress.is_set():
      break
    progress.clear()
  if thread.is_alive():
    _give_up(paragraph.split(':', 1)[0], paragraph)
    raise StorageError(paragraph)
  if 'error' in box:
    raise box['error']
  return box.get('value')


class deadline:  # pylint: disable=invalid-name
  """`with deadline(seconds, paragraph): ...`: if the block is still running after `seconds`,
  the watchdog writes `paragraph` and ends the process (the block may be stuck where no thread
  can interrupt it)."""

  def __init__(self, seconds: float, paragraph: str):
    self.seconds, self.paragraph = seconds, paragraph

  def __enter__(self):
    self.key = _arm(time.monotonic() + self.seconds, self.paragraph) if _owner else None
    return self

  def __exit__(self, *exc):
    with _lock:
      _deadlines.pop(self.key, None)
    return False


_keys = iter(range(1, 1 << 62))


def _arm(when: float, paragraph: str) -> int:
  with _lock:
    key = next(_keys)
    _deadlines[key] = (when, paragraph)
    if not _watchdog:
      thread = threading.Thread(target=_watch, name='storage-watchdog', daemon=True)
      thread.start()
      _watchdog.append(thread)
    _lock.notify()
  return key


def _watch():
  with _lock:
    while True:
      now = time.monotonic()
      due = [(when, text) for when, text in _deadlines.values() if when <= now]
      if due:
        break
      nearest = min((when for when, _ in _deadlines.values()), default=now + 3600)
      _lock.wait(max(0.05, nearest - now))
  exit_now(due[0][1])


def exit_now(paragraph: str | None = None, status: int = EXIT_STATUS):
  """Ends the process at once (threads stuck on storage would keep it alive): `paragraph` on
  stderr if given, this process's local temporary folders removed, the streams flushed."""
  try:
    if paragraph:           # as main.py prints a UserError
      import textwrap  # pylint: disable=g-import-not-at-top
      sys.stderr.write('\n' + textwrap.fill(f'Error (StorageError): {paragraph}', 100) + '\n'
                       '(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)\n')
    scratch.remove_all()
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(status)  # pylint: disable=protected-access
