"""A storage endpoint that stops answering (issue 50): the session's fake-gcs-server is frozen
with SIGSTOP (and always thawed), and every wait on it must end within its bound
(gated_attention/storage/waits.py) with one paragraph: a request with its retries, orbax's
finalize of a checkpoint, the lock's heartbeat. The slow tests stall a real `main.py` trainer
mid-run, with and without a SIGTERM during the stall, then resume it bitwise.
"""

import contextlib
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from gated_attention import storage
from gated_attention.storage import waits as storage_waits
from gated_attention.errors import CheckpointError, StorageError

pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


@contextlib.contextmanager
def stalled(server):
  """The server's process stopped: connections are accepted by the kernel, nothing answers."""
  os.kill(server.proc.pid, signal.SIGSTOP)
  try:
    yield
  finally:
    os.kill(server.proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def _alarm(seconds):
  """A wait that has no bound (the code before issue 50) fails the test instead of hanging it."""
  def expired(*_):
    raise TimeoutError(f'still waiting after {seconds} s: the wait has no bound')
  old = signal.signal(signal.SIGALRM, expired)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def fresh_waits(monkeypatch):
  """storage_waits' process state (a wait given up, a run closing) for this test only."""
  monkeypatch.setattr(storage_waits, '_abandoned', [])
  monkeypatch.setattr(storage_waits, '_closing', [])
  return monkeypatch


def test_each_request_ends_within_its_bound(gcs, fresh_waits):
  """gcsfs (listings, whole-object writes and reads) and google-cloud-storage (the lock, the
  metrics chunks) against a frozen endpoint: a StorageError naming the bound after about one
  bound each (gcsfs would retry 6 times with aiohttp's 5-minute timeout, google-cloud-storage
  for 120 s); the same calls work once it answers again."""
  fresh_waits.setattr(storage_waits, 'REQUEST_S', 0.5)
  root = gcs.url('run')
  storage.write(storage.join(root, 'config.json'), '{}')
  lock = storage.Object(storage.join(root, 'trainer.lock'))
  generation = lock.write('held', if_generation=0)
  calls = {
      'listdir': lambda: storage.listdir(root),
      'exists': lambda: storage.exists(storage.join(root, 'config.json')),
      'read': lambda: storage.read_bytes(storage.join(root, 'config.json')),
      'write': lambda: storage.write(storage.join(root, 'tensorboard', 'events'), b'x' * 1000),
      'lock write': lambda: lock.write('beat', if_generation=generation),
      'metrics chunk': lambda: storage.create(storage.join(root, 'metrics', '00000001.jsonl'),
                                              '{"step": 1}\n'),
  }
  took = {}
  with stalled(gcs.server):
    for name, call in calls.items():
      start = time.monotonic()
      with pytest.raises(StorageError, match=r'no answer within 0\.5 s|Timeout of 0\.5s') as e,\
           _alarm(30):
        call()
      took[name] = time.monotonic() - start
      assert '\n' not in str(e.value) and 'cannot be reached' in str(e.value)
  assert max(took.values()) < 2.0, took
  # It answers again. A request the client gave up on may still be carried out by the server
  # once it wakes (the lock's owner allows for that: runs/lock.py); never a part of one.
  assert set(storage.listdir(root)) <= {'config.json', 'trainer.lock', 'tensorboard', 'metrics'}
  events = storage.join(root, 'tensorboard', 'events')
  assert not storage.exists(events) or storage.read_bytes(events) == b'x' * 1000
  assert lock.read().data in (b'held', b'beat')


def _tiny_state(n):
  rng = np.random.default_rng(n)
  return {'w': rng.standard_normal((256, 1024)).astype(np.float32), 'b': np.arange(n, n + 8.0)}


def test_a_checkpoint_finalize_that_stalls_ends_at_its_bound(gcs, fresh_waits):
  """orbax's asynchronous save on gs:// with the endpoint frozen just after the save started:
  Checkpointer.wait (and close) end with one paragraph after CHECKPOINT_WAIT_S instead of
  waiting for as long as the endpoint is down (orbax's wait has no timeout). Once it answers,
  the save finishes and the checkpoint is there: nothing saved is lost."""
  from gated_attention.runs import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  fresh_waits.setattr(storage_waits, 'CHECKPOINT_WAIT_S', 2.0)
  ckpt = ckpt_lib.Checkpointer(gcs.url('run'), every=1)
  try:
    for step in range(1, 6):   # until a save is still in flight when the endpoint stops
      ckpt.save_params(step, _tiny_state(step))
      with stalled(gcs.server):
        if not ckpt.manager.is_saving_in_progress():
          continue               # it finished first (a fast machine): another, right away
        start = time.monotonic()
        try:
          with _alarm(30):
            ckpt.wait()
          continue               # it needed the server no more: another, right away
        except StorageError as e:
          took, message = time.monotonic() - start, str(e)
        assert re.search('did not finish within 2 s: the storage stopped answering.*checkpoints '
                         'before it are intact', message), message
        assert '\n' not in message
        assert storage_waits.abandoned()
        start = time.monotonic()
        ckpt.close()             # its threads are stuck: closing does not join them again
        assert time.monotonic() - start < 1.0
      break
    else:
      pytest.fail('every save finished before the endpoint was stopped')
    assert 1.9 < took < 4.0, took
    storage_waits._abandoned.clear()  # pylint: disable=protected-access
    ckpt.wait()                  # the endpoint answers: orbax's save goes on and commits
    assert step in ckpt.all_steps()
  finally:
    storage_waits._abandoned.clear()  # pylint: disable=protected-access
    ckpt.close()


def test_a_lock_whose_heartbeat_cannot_be_written_refuses_to_save(gcs, fresh_waits):
  """Heartbeats that cannot be written (each bounded) for longer than the lock's staleness
  minus one beat: another trainer may take the run over, so the next save is refused in one
  paragraph; once a beat is written again, saving is allowed again."""
  from gated_attention.runs import lock as lock_lib  # pylint: disable=g-import-not-at-top
  fresh_waits.setattr(storage_waits, 'REQUEST_S', 0.5)
  lock = lock_lib.RunLock(gcs.url('run'), heartbeat_s=0.5, stale_s=2.5)
  lock.acquire()
  try:
    with stalled(gcs.server):
      time.sleep(2.5)
      start = time.monotonic()
      with pytest.raises(CheckpointError, match=r'could not write the heartbeat of its lock .* '
                         r'for \d s .*stops without saving.*checkpoints already written are '
                         'intact') as e, _alarm(30):
        lock.check()
      assert time.monotonic() - start < 3.0
      assert '\n' not in str(e.value)
    deadline = time.monotonic() + 10
    while time.monotonic() - lock._heard > 1.0:  # pylint: disable=protected-access
      assert time.monotonic() < deadline, 'no heartbeat written after the endpoint came back'
      time.sleep(0.1)
    lock.check()
    assert not lock.lost
  finally:
    lock.release()


# A real trainer on a stalled endpoint (slow: a reference run and two training commands) -------

from tests.test_faults import (REPO, assert_like_reference, env, main_cmd,  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
                               one_paragraph, reference, run_main)

BOUNDS = {'GATED_ATTENTION_STORAGE_REQUEST_S': '3', 'GATED_ATTENTION_CHECKPOINT_WAIT_S': '3'}


def _stall_training(workdir, env, server, tmp_path, *, at_step, term_after=None):
  """main.py trains on gs://; the endpoint freezes once step `at_step` is logged (a SIGTERM
  follows `term_after` s later, if given); thawed when the trainer ends. (exit status, stdout,
  stderr, seconds from the freeze to the end, seconds from the SIGTERM to the end)."""
  out, err = tmp_path / 'stdout', tmp_path / 'stderr'
  with open(out, 'w') as o, open(err, 'w') as e:
    proc = subprocess.Popen(main_cmd(workdir), cwd=REPO, env={**env, **BOUNDS}, stdout=o,
                            stderr=e)
  termed = None
  try:
    deadline = time.monotonic() + 300
    while f'step {at_step}/' not in out.read_text():
      assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
      time.sleep(0.01)
    with stalled(server):
      frozen = time.monotonic()
      if term_after is not None:
        time.sleep(term_after)
        proc.send_signal(signal.SIGTERM)
        termed = time.monotonic()
      try:
        proc.wait(timeout=120)
      except subprocess.TimeoutExpired:
        pytest.fail(f'the trainer still runs 120 s after the endpoint froze:\n'
                    f'{out.read_text()[-2000:]}\n{err.read_text()[-2000:]}')
      ended = time.monotonic()
  finally:
    proc.kill()
    proc.wait()
  return (proc.returncode, out.read_text(), err.read_text(), ended - frozen,
          None if termed is None else ended - termed)


@pytest.mark.slow   # ~60 s: the reference run, a stalled run, its resumption
@pytest.mark.parametrize('term', [False, True], ids=['stall', 'sigterm_during_stall'])
def test_a_trainer_on_a_stalled_endpoint_stops_in_one_paragraph_and_resumes(
    term, env, reference, gcs, tmp_path):
  """Issue 50: kill -STOP of the server at step 14 kept the trainer alive and silent for as
  long as it was stopped (410 s), in orbax's finalize. With 3-s bounds it ends within seconds,
  exit status 1, one paragraph naming the storage and the way on; a SIGTERM during the stall
  does not make it wait longer. Nothing saved is lost: the same command, once the endpoint
  answers, ends with the reference's per-step losses and parameters."""
  workdir = gcs.url('runs/stalled')
  code, _, err, after_stop, after_term = _stall_training(
      workdir, env, gcs.server, tmp_path, at_step=14, term_after=1.0 if term else None)
  assert code == 1, err[-3000:]
  one_paragraph(err)
  message = ' '.join(err.split())
  assert ('did not finish within' in message or 'no answer within' in message
          or 'Timeout of 3.0s' in message or 'could not write the heartbeat' in message), message
  assert 'run the same command again' in message, message
  print(f'ended {after_stop:.1f} s after the freeze'
        f'{"" if after_term is None else f", {after_term:.1f} s after the SIGTERM"}: {message}')
  assert after_stop < 45, after_stop
  if term:
    assert after_term < 45, after_term
  done = run_main(main_cmd(workdir), env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert_like_reference(workdir, reference)
