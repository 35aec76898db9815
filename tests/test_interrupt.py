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


def test_a_second_signal_exits_at_once_while_the_main_thread_is_stuck():
  proc = _stuck(timeout=60)
  proc.send_signal(signal.SIGINT)
  time.sleep(0.3)
  start = time.time()
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 128 + signal.SIGINT, err
  assert time.time() - start < 5
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
