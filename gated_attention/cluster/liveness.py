"""A lost process stops the others of a multi-process run, in one paragraph, within a bound.

When a host dies, is preempted or is killed, the other processes of the run are blocked in a
collective that will never finish. JAX's coordination service notices after its heartbeat
timeout and aborts them with a C++ check failure and a dump of every thread (some 100 lines, the
cause in the middle); its hook for acting first (the client's missed-heartbeat callback) is not
reachable from Python (jaxlib cannot pass the status to a Python function: std::bad_cast).

So each process runs a thread of its own here: every `interval` seconds it writes a heartbeat
to jax.distributed's key-value store and reads everyone's. A process whose heartbeat has not
changed for `timeout` seconds (config.distributed.heartbeat_timeout) is lost: the process that
sees it first publishes what it saw, and every process prints

    Process 0 of 2 stops: process 1 sent no heartbeat for 10 s (...). Checkpoints already
    written are intact; run the same command on every host again and it resumes from step 40.

and exits with status 75 (EX_TEMPFAIL), within timeout + 2 x interval of the loss. Process 0
holds the store, so it lingers two intervals for the others to read the news before it exits.
jax.distributed's own timeout is set to 2 x timeout + 10 s (startup.py), the backstop.

Not covered: the loss of process 0 itself. The others' JAX clients lose the coordinator the
moment its connection drops and abort at once (docs/faults.md: which lines to look for).
A process that ends its work normally says so (`finish`) and is no longer watched.
"""

import os
import threading
import time

import jax

from gated_attention import console

EXIT_LOST_PROCESS = 75   # EX_TEMPFAIL: nothing is wrong with the run; run it again
PREFIX = 'gated_attention/liveness/'

# () -> what running the command again does ('it resumes from step 40'); the training loop sets
# it while a run trains.
hint = None

_watcher = None
_identity = (0, 1)   # (process index, process count), recorded by start()


def _resume_hint() -> str:
  try:
    return hint() if hint is not None else 'it resumes from its latest checkpoint'
  except Exception:  # pylint: disable=broad-except  # never let the hint stop the message
    return 'it resumes from its latest checkpoint'


# Words in the errors of a collective or an RPC whose peer is gone (gloo, gRPC, NCCL).
_TRANSPORT = ('connection reset', 'connection refused', 'connection closed', 'broken pipe',
              'socket closed', 'unavailable', 'deadline_exceeded', 'gloo', 'nccl',
              'end of file', 'failed to connect')


def stop_now(what: str):
  """One paragraph on stderr, then exit at once (the main thread may be blocked in C++). It
  names the process from what start() recorded: at exit JAX may have torn its backends down."""
  me, count = _identity
  message = (f'\nProcess {me} of {count} stops: {what}. '
             'Checkpoints already written are intact; run the same command on every host again '
             f'and {_resume_hint()}.\n')
  try:
    console.write_before_exit(message)
  finally:
    os._exit(EXIT_LOST_PROCESS)  # pylint: disable=protected-access


class _Watcher(threading.Thread):
  """The heartbeat of this process and the watch over the others' (see the module doc)."""

  def __init__(self, client, timeout: float, interval: float):
    super().__init__(name='liveness', daemon=True)
    self.client, self.timeout, self.interval = client, timeout, interval
    self.me, self.count = jax.process_index(), jax.process_count()
    self.finished = threading.Event()

  def _beat_and_read(self, beat: int) -> dict:
    self.client.key_value_set(f'{PREFIX}beat/{self.me}', str(beat), allow_overwrite=True)
    return dict(self.client.key_value_dir_get(PREFIX))

  def run(self):
    start = time.monotonic()
    last = {}      # process -> (its beat value, when it last changed, by this clock)
    beat = 0
    while not self.finished.is_set():
      beat += 1
      try:
        entries = self._beat_and_read(beat)
      except Exception as e:  # pylint: disable=broad-except
        if self.finished.is_set():
          return
        stop_now('the coordinator (process 0) does not answer: it stopped, or the network to it '
                 f'did ({type(e).__name__}: {" ".join(str(e).split())[:200]})')
      if self.finished.is_set():
        return
      now = time.monotonic()
      news = entries.get(f'{PREFIX}lost')
      if news:
        self._linger()
        stop_now(news)
      done = {int(k.rsplit('/', 1)[1]) for k in entries if k.startswith(f'{PREFIX}done/')}
      for p in range(self.count):
        value = entries.get(f'{PREFIX}beat/{p}')
        if value is not None and last.get(p, (None,))[0] != value:
          last[p] = (value, now)
      silent = [p for p in range(self.count) if p != self.me and p not in done
                and now - last.get(p, (None, start))[1] > self.timeout]
      if silent:
        names = ', '.join(map(str, silent))
        what = (f'process{"es" if len(silent) > 1 else ""} {names} sent no heartbeat for '
                f'{self.timeout:g} s (the host died, was preempted or was killed, or the '
                'process exited: its own log says which; reported by process '
                f'{self.me})')
        try:
          self.client.key_value_set(f'{PREFIX}lost', what, allow_overwrite=True)
        except Exception:  # pylint: disable=broad-except
          pass
        self._linger()
        stop_now(what)
      self.finished.wait(self.interval)

  def _linger(self):
    """Process 0 holds the store: it lets the others read the news before it goes (they would
    otherwise lose the coordinator first, and JAX aborts them with its own lines)."""
    if self.me == 0:
      self.finished.wait(2 * self.interval + 1)


def start(client, timeout: float):
  """Starts this process's heartbeat and watch (once; multi-process runs only)."""
  global _watcher, _identity
  if _watcher is not None or client is None:
    return
  _identity = (jax.process_index(), jax.process_count())
  _watcher = _Watcher(client, float(timeout), max(0.5, min(10.0, timeout / 5)))
  _watcher.start()


def finish():
  """This process's work ended normally: it is no longer watched, and no longer watches."""
  global _watcher
  if _watcher is None:
    return
  _watcher.finished.set()
  try:
    _watcher.client.key_value_set(f'{PREFIX}done/{_watcher.me}', '1', allow_overwrite=True)
  except Exception:  # pylint: disable=broad-except  # the store is gone: nobody is watching
    pass
  _watcher = None
_identity = (0, 1)   # (process index, process count), recorded by start()


def await_verdict(error: BaseException):
  """The main thread's error in a multi-process run: where it is a collective or an RPC that
  lost its peer (a connection reset in gloo, say), the watcher's paragraph says more than the
  error does, and it comes within its bound: wait for it (the watcher exits the process). Any
  other error, or no verdict in time, returns at once / then, and the error is reported."""
  watcher = _watcher
  if watcher is None:
    return
  text, seen = '', set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text += f' {type(error).__name__}: {error}'.lower()
    error = error.__cause__ or error.__context__
  if any(word in text for word in _TRANSPORT):
    watcher.finished.wait(watcher.timeout + 3 * watcher.interval + 1)
