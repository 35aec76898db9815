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
"""

import os
import signal
import threading

import jax

from gated_attention import cluster
from gated_attention import console

EXIT_STOP_TIMEOUT = 124   # as timeout(1)
DEFAULT_STOP_TIMEOUT = 300
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _say(text: str):
  console.write_before_exit(text)


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
        else:   # a second signal: give up at once
          _say('\nInterrupted again: stopped at once. Checkpoints already written are intact; '
               'run the same command again to resume from the latest.\n')
          os._exit(128 + signum)  # pylint: disable=protected-access

  def _deadline(self, signum: int):
    if self._done.wait(self.stop_timeout):
      return
    _say(f'\nProcess {self._me} of {self._count}: still running {self.stop_timeout:g} s after '
         f'signal {signum} (train.stop_timeout): a collective or the storage does not answer. '
         'Stopping without a final checkpoint; checkpoints already written are intact: run the '
         'same command again to resume from the latest.\n')
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

  def restore(self):
    """The handlers and the wakeup fd as they were; the reader and the deadline stand down."""
    self._done.set()
    signal.set_wakeup_fd(self._old_wakeup)
    for s, h in self._old.items():
      signal.signal(s, h)
    os.write(self._fds[1], b'\0')   # wakes the reader, which closes its end and returns
    os.close(self._fds[1])


def _forget_in_child():
  """A forked child (grain's workers) must not write its signals into the parent's pipe."""
  try:
    signal.set_wakeup_fd(-1)
  except (ValueError, OSError):
    pass


os.register_at_fork(after_in_child=_forget_in_child)
