"""training/interrupt.py in one process: the flag the loop reads, the bounds that hold while the
main thread never looks at it (a second signal exits at once, the stop timeout exits with one
paragraph), and forked children that keep their signals to themselves. The agreement between
processes is tests/test_multihost_faults.py's."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gated_attention.training.interrupt import EXIT_STOP_TIMEOUT, Interrupt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The main thread sits in C (libc's sleep through ctypes) and never reads the flag: only the
# reader thread can end the process.
STUCK = textwrap.dedent('''
    import ctypes, sys
    sys.path.insert(0, {repo!r})
    from gated_attention.training.interrupt import Interrupt
    interrupt = Interrupt(stop_timeout={timeout})
    print('ready', flush=True)
    libc = ctypes.CDLL(None)
    while True:
      libc.sleep(100)
''')


def _stuck(timeout: float) -> subprocess.Popen:
  proc = subprocess.Popen([sys.executable, '-c', STUCK.format(repo=REPO, timeout=timeout)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == 'ready'
  return proc


def test_a_signal_sets_the_flag_and_restore_puts_the_handlers_back():
  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  interrupt = Interrupt(stop_timeout=60)
  try:
    assert not interrupt.stop_now() and not interrupt.stopped
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.time() + 5
    while interrupt.signal is None and time.time() < deadline:
      time.sleep(0.01)
    assert interrupt.stop_now() and interrupt.stopped
    assert interrupt.describe() == 'signal 15'
  finally:
    interrupt.restore()
  assert {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} == before


def test_the_stop_timeout_ends_a_process_whose_main_thread_is_stuck():
  proc = _stuck(timeout=1.5)
  start = time.time()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=30)
  took = time.time() - start
  assert proc.returncode == EXIT_STOP_TIMEOUT, err
  assert 1.4 < took < 10, took
  assert 'still running 1.5 s after signal 15 (train.stop_timeout)' in err, err
  assert 'Traceback' not in err


def _signalled_twice(proc, sig) -> str:
  """`sig` twice, 0.3 s apart: the process exits 128 + sig within 5 s of the second. Its stderr."""
  proc.send_signal(sig)
  time.sleep(0.3)
  start = time.time()
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 128 + sig, err
  assert time.time() - start < 5
  return err


def test_a_second_signal_exits_at_once_while_the_main_thread_is_stuck():
  err = _signalled_twice(_stuck(timeout=60), signal.SIGINT)
  assert 'Interrupted again: stopped at once' in err and 'Traceback' not in err


@pytest.mark.filterwarnings('ignore:os.fork')   # the child only signals itself and exits
def test_a_forked_child_does_not_signal_its_parent():
  interrupt = Interrupt(stop_timeout=60)
  try:
    pid = os.fork()
    if pid == 0:   # the child: the Python handler is inherited, the wakeup fd is not
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.2)
      os._exit(0)  # pylint: disable=protected-access
    _, status = os.waitpid(pid, 0)
    assert status == 0
    time.sleep(0.3)
    assert interrupt.signal is None and interrupt._received == 0  # pylint: disable=protected-access
  finally:
    interrupt.restore()


# Owned by the command line (issue 57): the handlers stay until the process exits -------------

CLOSING = textwrap.dedent('''
    import ctypes, sys, time
    sys.path.insert(0, {repo!r})
    from gated_attention.errors import StorageError
    from gated_attention.runs import lock as lock_lib
    from gated_attention.training import interrupt as interrupt_lib
    interrupt_lib.own_process()                       # as main.py
    lock = lock_lib.RunLock({workdir!r})
    lock.acquire()
    interrupt = interrupt_lib.Interrupt(stop_timeout={timeout})
    interrupt.failing(StorageError('Storing the metrics rows failed: Cannot write gs://b/run/m: '
                                   'no answer within 3 s. Run the same command again.'))
    interrupt.restore()                               # the loop has closed: kept, not restored
    print('ready', flush=True)
    libc = ctypes.CDLL(None)
    end = time.time() + 6                             # the close and the exit, in C (a signal
    while time.time() < end:                          # cuts libc's sleep short)
      libc.sleep(1)
    print('exited normally', flush=True)
''')


def _closing(tmp_path, timeout: float = 60) -> subprocess.Popen:
  proc = subprocess.Popen(
      [sys.executable, '-c', CLOSING.format(repo=REPO, workdir=str(tmp_path), timeout=timeout)],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == 'ready'
  return proc


def test_a_signal_after_the_loop_closed_is_handled_until_the_exit(tmp_path):
  """Before: loop.run restored the default handlers as it ended, and a signal during the rest
  of the close or the exit (jax.distributed's shutdown) killed the process (-15, no message).
  Now one signal is handled (the stop timeout's clock starts) and the process ends its close."""
  proc = _closing(tmp_path)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=30)
  assert proc.returncode == 0, (out, err)
  assert 'exited normally' in out and 'Traceback' not in err


def test_a_second_signal_keeps_the_paragraph_of_the_error_being_closed_on(tmp_path):
  """Before: two signals while a run closed on a storage error exited 143 with "Interrupted
  again" only, the storage paragraph lost (main.py prints it once the close is over) and the
  lock left for the next run to take over."""
  err = _signalled_twice(_closing(tmp_path), signal.SIGTERM)
  assert err.index('Error (StorageError): Storing the metrics rows failed') < err.index(
      'Interrupted again: stopped at once'), err
  assert not os.path.exists(tmp_path / 'trainer.lock'), os.listdir(tmp_path)


def test_the_stop_timeout_after_the_close_names_the_exit(tmp_path):
  """A process whose exit waits (a peer gone from jax.distributed's shutdown) past the stop
  timeout: exit 124, one paragraph saying the run has closed and its exit is what waits, the
  error it closed on kept."""
  proc = _closing(tmp_path, timeout=1.0)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == EXIT_STOP_TIMEOUT, err
  message = ' '.join(err.split())
  assert 'Error (StorageError): Storing the metrics rows failed' in message, message
  assert 'its run has closed (its checkpoint saved), but its exit waits' in message, message
