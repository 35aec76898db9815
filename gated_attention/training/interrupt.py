"""Stop signals for the training loop: SIGTERM and Ctrl-C save a checkpoint and stop, and in a
multi-process run every process stops after the same step.

    interrupt = Interrupt(stop_timeout=config.train.stop_timeout)
    while run.step < steps and not interrupt.stop_now():   # once per loop turn, every process
      ...interrupt.step(setup, ...) where interrupt.agreeing, else setup.train_step(...)...
    if interrupt.stopped: save, say `interrupt.describe()`
    interrupt.restore()

One process: the first signal stops the loop before its next step (as it always did).

Several processes: a signal reaches each host on its own, and a process that stopped alone would
leave the others in a collective it never joins. Every step then carries each process's signal
to every process (the stop agreement, cluster/stop.py), and all of them stop after the same step
and save.

Bounds, for every process count: a second signal exits at once (status 128 + signal), and a
process still running `stop_timeout` seconds after its first signal exits with status 124 and one
paragraph (a peer or the storage that stopped answering must not keep a stopping job alive).
Both work while the main thread is blocked in C++ (a collective, a storage call), where Python
runs no signal handler: a thread reads the signals from `signal.set_wakeup_fd`'s pipe.

Until the process exits (issue 57). Where the command line owns the process (`own_process`,
main.py), `restore()` keeps the handlers: a signal that lands while the run closes (its save,
the goodput write, jax.distributed's shutdown at exit) neither kills the process with the
default action (it died with -15 and no message, and its peer waited for it in the shutdown) nor
stops the close; it only starts the stop timeout's clock. A run closing on an error says which
(`failing`): a second signal then prints that error's paragraph before it exits, and frees the
run's lock (a bounded second at most), so neither is lost.
"""

import os
import signal
import sys
import threading
import time

import jax

from gated_attention import cluster
from gated_attention import console

EXIT_STOP_TIMEOUT = 124   # as timeout(1)
DEFAULT_STOP_TIMEOUT = 300
SIGNALS = (signal.SIGTERM, signal.SIGINT)
LOCK_RELEASE_S = 2.0      # a second signal frees the run's lock for at most this long

_owned = []               # the command line owns the process: handlers are kept until it exits


def own_process():
  """The command line owns this process (main.py): an Interrupt's handlers stay until the process
  exits, so a signal during the close or the exit is handled, not fatal."""
  _owned.append(True)


def owned() -> bool:
  return bool(_owned)


def bound_exit(seconds: float):
  """The command's work has ended (done or failed): the process must be gone within `seconds`
  (issue 57: a process whose peer died in its close waited in jax.distributed's shutdown for
  good). Past it, one paragraph and exit status 124. Only where the command line owns the
  process (a library caller's process is its own)."""
  if not _owned:
    return
  me, count = jax.process_index(), jax.process_count()   # JAX may be torn down by then

  def watch():
    time.sleep(seconds)
    _say(f'\nProcess {me} of {count}: its work ended {seconds:g} s ago and it has not exited '
         'yet (jax.distributed\'s shutdown waits for another process that is gone or stuck, or '
         'the storage does not answer): exiting now. Checkpoints already written are intact; if '
         'a process failed, run the same command again on every host to resume from the '
         'latest.\n')
    os._exit(EXIT_STOP_TIMEOUT)  # pylint: disable=protected-access
  threading.Thread(target=watch, name='exit_deadline', daemon=True).start()


def _say(text: str):
  console.write_before_exit(text)


def _paragraph(text: str) -> str:
  """An error as main.py prints it (cli._fail): wrapped at 100 columns."""
  import textwrap  # pylint: disable=g-import-not-at-top
  return '\n'.join(textwrap.fill(line, 100) for line in text.splitlines())


def _release_locks():
  """The run's lock freed (runs/lock.py's release_all) within LOCK_RELEASE_S: a local file at
  once; on object storage one request, which a stalled endpoint may not answer."""
  lock = sys.modules.get('gated_attention.runs.lock')
  if lock is None:
    return
  thread = threading.Thread(target=lock.release_all, name='release-lock', daemon=True)
  thread.start()
  thread.join(LOCK_RELEASE_S)


class Interrupt:
  """SIGTERM / SIGINT handlers of a training run (see the module doc); `restore()` at the end."""

  def __init__(self, stop_timeout: float = DEFAULT_STOP_TIMEOUT, *, lag: int = cluster.LAG):
    self.signal = None          # this process's first signal
    self.agreed = None          # (signal, processes that received one): every process stops
    self.stop_timeout = float(stop_timeout)
    self._me, self._count = jax.process_index(), jax.process_count()
    self._agreement = cluster.StopAgreement(lag) if self._count > 1 else None
    self._received = 0
    self._done = threading.Event()
    self._failing = None        # the error the run closes on (a second signal prints it)
    self._held = False          # restored while the command line owns the process: kept
    self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    self._fds = (read_fd, write_fd)
    self._old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    self._reader = threading.Thread(target=self._read_signals, name='signals', daemon=True)
    self._reader.start()

  def _handle(self, signum, _):
    """Python's handler (the main thread, when it runs Python): the flag the loop reads. The
    counting and the bounds are the reader thread's, which sees every signal, stuck or not."""
    if self.signal is None:
      self.signal = signum

  def _read_signals(self):
    try:
      self._read_until_done()
    finally:
      os.close(self._fds[0])

  def _read_until_done(self):
    while not self._done.is_set():
      try:
        data = os.read(self._fds[0], 16)
      except OSError:
        return
      if not data or self._done.is_set():
        return
      for signum in data:
        if signum not in SIGNALS:
          continue
        self._received += 1
        if self._received == 1:
          threading.Thread(target=self._deadline, args=(signum,), name='stop_deadline',
                           daemon=True).start()
        else:   # a second signal: give up at once (the error being closed on said first)
          earlier = (f'\n{_paragraph(self._failing)}\n' if self._failing else '')
          _release_locks()
          _say(f'{earlier}\nInterrupted again: stopped at once. Checkpoints already written are '
               'intact; run the same command again to resume from the latest.\n')
          os._exit(128 + signum)  # pylint: disable=protected-access

  def _deadline(self, signum: int):
    if self._done.wait(self.stop_timeout):
      return
    if self._held:   # the run has closed; its exit is what waits
      what = ('its run has closed (its checkpoint saved), but its exit waits on another process '
              '(jax.distributed\'s shutdown) or the storage. Exiting now')
    else:
      what = ('a collective or the storage does not answer. Stopping without a final '
              'checkpoint')
    earlier = f'{_paragraph(self._failing)}\n' if self._failing else ''
    _say(f'\n{earlier}Process {self._me} of {self._count}: still running {self.stop_timeout:g} s '
         f'after signal {signum} (train.stop_timeout): {what}; checkpoints already written are '
         'intact: run the same command again to resume from the latest.\n')
    os._exit(EXIT_STOP_TIMEOUT)  # pylint: disable=protected-access

  @property
  def agreeing(self) -> bool:
    """Whether the steps carry the stop flags (several processes): `step` then runs
    Setup.train_step_with_flags instead of train_step."""
    return self._agreement is not None

  def step(self, setup, params, opt_state, batch, lr_scale: float):
    """One training step that carries this process's stop flag to every process."""
    params, opt_state, metrics = setup.train_step_with_flags(
        params, opt_state, batch, self._agreement.flags(self.signal, setup), lr_scale)
    self._agreement.push(metrics.pop('stop_flags'), setup)
    return params, opt_state, metrics

  def stop_now(self) -> bool:
    """Whether the loop stops before its next step: at once on one process; on several, once
    the flags of the step `lag` steps back hold a signal (the same step everywhere)."""
    if self.agreed is not None:
      return True
    if self._agreement is None:
      if self.signal is not None:
        self.agreed = (self.signal, [self._me])
    else:
      self.agreed = self._agreement.decided()
    return self.agreed is not None

  @property
  def stopped(self) -> bool:
    return self.agreed is not None

  def describe(self) -> str:
    """'signal 15' / 'signal 15, received by process 1': what stopped the run."""
    signum, processes = self.agreed
    if self._count == 1:
      return f'signal {signum}'
    names = ', '.join(map(str, processes))
    return f'signal {signum}, received by process{"es" if len(processes) > 1 else ""} {names}'

  def failing(self, error: BaseException | None):
    """The run closes on `error` (None: it does not): a second signal prints its paragraph
    (as main.py would have, once the close was over) before it stops the process."""
    self._failing = None if error is None else (
        f'Error ({type(error).__name__}): {error}' if isinstance(error, _user_errors())
        else f'{type(error).__name__}: {error}')

  def restore(self):
    """The handlers and the wakeup fd as they were; the reader and the deadline stand down.
    Where the command line owns the process (`own_process`), the handlers stay until it exits:
    a signal in the close or the exit counts as any other (issue 57)."""
    if _owned:
      self._held = True
      return
    self._done.set()
    signal.set_wakeup_fd(self._old_wakeup)
    for s, h in self._old.items():
      signal.signal(s, h)
    try:
      os.write(self._fds[1], b'\0')   # wakes the reader, which closes its end and returns
    except OSError:   # the reader has gone already (its end closed under it: EPIPE)
      pass
    os.close(self._fds[1])


def _user_errors():
  from gated_attention.errors import UserError  # pylint: disable=g-import-not-at-top
  return UserError


def _forget_in_child():
  """A forked child (grain's workers) must not write its signals into the parent's pipe."""
  try:
    signal.set_wakeup_fd(-1)
  except (ValueError, OSError):
    pass


os.register_at_fork(after_in_child=_forget_in_child)
