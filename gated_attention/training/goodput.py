"""This session's time account (analysis/goodput.py defines the causes and reads the run's).

    account = Account()                 # at the session's start: its clock starts at the
                                        # process's own start
    account.lap('startup')              # the time since the last lap goes to 'startup', less
    ...                                 # the compilation inside it, which goes to 'compile'
    account.begin(workdir, start_step)  # process 0 writes RUN/goodput/session-<n>.json
    account.publish(step)               # a snapshot, written by a background thread
    account.finish(step, 'finished')    # the last lap ('closing') and the last write

The loop marks a lap at each boundary between causes, so the laps partition the session's wall
time. Compilation is counted by jax.monitoring's compile events (tracing, lowering, backend
compile), which JAX reports from the thread that compiles; a lap subtracts the compile seconds
reported since the lap before. A lap costs two clock reads: nothing a step would notice
(benchmarks/goodput.py measures it). Writing is off the step's path: `publish` hands the
snapshot to a thread, which writes at most every `every_s` seconds.
"""

import json
import os
import socket
import threading
import time

import jax
from jax import monitoring

from gated_attention import storage
from gated_attention.analysis.goodput import CAUSES
from gated_attention.runs import rundir

_COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                   '/jax/core/compile/jaxpr_to_mlir_module_duration',
                   '/jax/core/compile/backend_compile_duration')
_compiled = [0.0]     # seconds of compilation reported in this process so far


def _on_duration(event: str, seconds: float, **_):
  if event in _COMPILE_EVENTS:
    _compiled[0] += seconds


monitoring.register_event_duration_secs_listener(_on_duration)


def compile_seconds() -> float:
  """Seconds this process has spent compiling (tracing, lowering, backend compile) so far."""
  return _compiled[0]


def process_age() -> float:
  """Seconds since this process started (Linux: /proc; elsewhere since this module loaded)."""
  try:
    with open('/proc/self/stat', encoding='ascii') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    started = int(fields[19]) / os.sysconf('SC_CLK_TCK')     # field 22: start, ticks since boot
    return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
  except (OSError, ValueError, IndexError, AttributeError):
    return time.perf_counter() - _LOADED


_LOADED = time.perf_counter()
_ended = [None, 0.0]  # this process's previous session's end (a notebook's): perf_counter, and
                      # the compile seconds by then


class Account:
  """Wall time by cause since the session started (analysis/goodput.py's CAUSES): the process's
  start, or in a process that trained before (a notebook, the tests) the end of its previous
  session, so that a session's start-up is its own."""

  def __init__(self):
    now = time.perf_counter()
    self._origin, self._compiled = now - process_age(), 0.0  # the process start (perf_counter)
    if _ended[0] is not None and _ended[0] > self._origin:
      self._origin, self._compiled = _ended
    self.started = time.time() - (now - self._origin)     # wall clock, for the record
    self._last = self._origin                              # the first lap starts there
    self.seconds = dict.fromkeys(CAUSES, 0.0)
    self._path, self._record, self._writer = None, None, None

  def lap(self, cause: str):
    """The time since the last lap is `cause`'s, the compilation reported in it excepted."""
    now, compiled = time.perf_counter(), _compiled[0]
    spent, compiling = now - self._last, compiled - self._compiled
    self.seconds['compile'] += compiling
    self.seconds[cause] += max(spent - compiling, 0.0)
    self._last, self._compiled = now, compiled

  @property
  def wall(self) -> float:
    """Seconds from the process start to the last lap."""
    return self._last - self._origin

  def begin(self, workdir: str, start_step: int, every_s: float | None = None):
    """Records this session in `workdir` from now on (process 0; the others keep time only)."""
    if jax.process_index() != 0:
      return
    folder = storage.join(workdir, rundir.GOODPUT_DIR)
    try:
      storage.makedirs(folder)
      number = max(rundir.goodput_session_numbers(workdir), default=0) + 1
      while True:                    # a number of its own (another process cannot hold the lock)
        self._path = rundir.goodput_session(workdir, number)
        self._record = {'session': number, 'host': socket.gethostname(), 'pid': os.getpid(),
                        'processes': jax.process_count(), 'devices': jax.device_count(),
                        'started': self.started, 'start_step': start_step, 'step': start_step,
                        'state': 'running'}
        if storage.create(self._path, json.dumps(self._snapshot(start_step, 'running'))):
          break
        number += 1
    except storage.StorageError as e:   # each request is bounded (a stalled endpoint)
      raise _stalled(f'Recording this session\'s goodput account in {folder} failed: {e}') from e
    if every_s is None:
      every_s = 15.0 if storage.is_remote(workdir) else 0.25
    self._writer = _Writer(self._path, every_s)

  def _snapshot(self, step: int, state: str) -> dict:
    return {**self._record, 'step': step, 'state': state, 'updated': self._origin_wall(),
            'wall_s': self.wall, 'seconds': dict(self.seconds)}

  def _origin_wall(self) -> float:
    return self.started + self.wall

  def publish(self, step: int):
    """Hands the account as of the last lap to the writer (no I/O here)."""
    if self._writer is not None:
      self._writer.put(self._snapshot(step, 'running'))

  def finish(self, step: int, state: str, *, raise_errors: bool = True, **extra):
    """The last lap ('closing'), then the last write, waited for (`state`: finished,
    interrupted, failed; `extra`: more fields, the devices' peak memory). Returns the session's
    record (None on processes that do not write). A last write that failed or stalled is a
    StorageError of one paragraph (issue 57: the storage stopped answering as a run ended), or
    with `raise_errors` False (a run already failing) a warning."""
    self.lap('closing')
    _ended[:] = [self._last, self._compiled]
    if self._writer is None:
      return None
    record = {**self._snapshot(step, state), **extra}
    error = self._writer.close(record)
    if error is not None:
      if not raise_errors:
        print(f'Warning: {error}; the run itself is unaffected.', flush=True)
      else:
        raise _stalled(f'{error}. Training stopped at step {step} ({state})')
    return record


def _stalled(what: str) -> storage.StorageError:
  """The paragraph of a goodput write or read that failed (each request bounded: a stalled
  endpoint); the run's closing steps get short bounds from here on (storage/waits.py)."""
  storage.waits.closing('goodput')
  return storage.StorageError(
      f'{what}. The checkpoints already written are intact; once the storage answers, run the '
      'same command again to resume from the latest one.')


def summary(workdir: str) -> dict:
  """The run's goodput over every session recorded (analysis/goodput.py's summary), read
  from storage; a read that stalls is one paragraph."""
  from gated_attention.analysis import goodput as goodput_lib  # pylint: disable=g-import-not-at-top
  try:
    return goodput_lib.summarize(rundir.read_goodput(workdir))
  except storage.StorageError as e:
    raise _stalled(f'Reading the goodput accounts of {workdir} failed: {e}') from e


class _Writer:
  """Writes the newest snapshot it was given, at most every `every_s` seconds, in a thread; a
  failed write (a storage stall) is retried with the next snapshot, never raised into training.
  The last snapshot is written by the thread too, waited for `CLOSE_WAIT_S` at most: a stalled
  endpoint must not hold a stopping run for a request's whole bound; `close` says what went
  wrong (Account.finish makes it one paragraph)."""

  CLOSE_WAIT_S = 20.0

  def __init__(self, path: str, every_s: float):
    self.path, self.every_s = path, every_s
    self.latest, self.error, self.last = None, None, None
    self.wake, self.closing = threading.Event(), threading.Event()
    self.thread = threading.Thread(target=self._loop, name='goodput-writer', daemon=True)
    self.thread.start()

  def put(self, snapshot: dict):
    self.latest = snapshot
    self.wake.set()

  def _write(self, snapshot: dict):
    try:
      storage.write(self.path, json.dumps(snapshot))
      self.error = None
    except Exception as e:  # pylint: disable=broad-except
      self.error = e

  def _loop(self):
    while True:
      self.wake.wait()
      self.wake.clear()
      if self.closing.is_set():
        self._write(self.last)
        return
      snapshot, self.latest = self.latest, None
      if snapshot is not None:
        self._write(snapshot)
      self.closing.wait(self.every_s)

  def close(self, final: dict) -> str | None:
    """Writes `final`, waited for CLOSE_WAIT_S at most; what went wrong (None: written)."""
    self.last = final
    self.closing.set()
    self.wake.set()
    self.thread.join(timeout=self.CLOSE_WAIT_S)
    if self.thread.is_alive():       # a write hangs on a stalled endpoint
      return (f'The goodput account of this session was not written to {self.path} within '
              f'{self.CLOSE_WAIT_S:g} s: the storage stopped answering')
    if self.error is not None:
      return (f'The goodput account of this session could not be written to {self.path} '
              f'({type(self.error).__name__}: {self.error})')
    return None
