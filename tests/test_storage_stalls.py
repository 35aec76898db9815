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
import types

import jax
import numpy as np
import pytest

from gated_attention import storage
from gated_attention.storage import waits as storage_waits
from gated_attention.errors import CheckpointError, StorageError

from tests.test_tokenized import corpus  # noqa: F401,E402  pylint: disable=unused-import,wrong-import-position

pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


@contextlib.contextmanager
def stalled(server):
  """The server's process stopped: connections are accepted by the kernel, nothing answers."""
  os.kill(server.proc.pid, signal.SIGSTOP)
  try:
    _wait_stopped(server.proc.pid)
    yield
  finally:
    os.kill(server.proc.pid, signal.SIGCONT)


def _wait_stopped(pid: int, bound: float = 5.0):
  """Until every thread of `pid` is stopped (state T in /proc): a signal is delivered
  asynchronously, and a request sent at once could still be answered (a README run's first
  request against the 'frozen' server returned in milliseconds: DID NOT RAISE)."""
  until = time.monotonic() + bound
  tasks = f'/proc/{pid}/task'
  while os.path.isdir(tasks) and time.monotonic() < until:
    states = []
    for tid in os.listdir(tasks):
      try:
        with open(f'{tasks}/{tid}/stat') as f:
          states.append(f.read().rsplit(')', 1)[1].split()[0])
      except OSError:   # a thread that ended
        continue
    if states and all(st in 'tT' for st in states):
      return
    time.sleep(0.01)


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


DEFAULT_REQUEST_S = storage_waits.REQUEST_S
DEFAULT_CHECKPOINT_WAIT_S = storage_waits.CHECKPOINT_WAIT_S


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
  root = gcs.url('run')
  storage.write(storage.join(root, 'config.json'), '{}')
  lock = storage.Object(storage.join(root, 'trainer.lock'))
  generation = lock.write('held', if_generation=0)
  # The bound from here on (not before: a loaded machine's first requests may take longer).
  fresh_waits.setattr(storage_waits, 'REQUEST_S', 0.5)
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
        print(f'{name}: answered by a frozen server?', flush=True)   # shown where it fails
      took[name] = time.monotonic() - start
      assert '\n' not in str(e.value) and 'cannot be reached' in str(e.value)
  assert max(took.values()) < 2.0, took
  fresh_waits.setattr(storage_waits, 'REQUEST_S', DEFAULT_REQUEST_S)
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
  ckpt = ckpt_lib.Checkpointer(gcs.url('run'), every=1)   # (its listing is bounded too)
  fresh_waits.setattr(storage_waits, 'CHECKPOINT_WAIT_S', 2.0)
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
    fresh_waits.setattr(storage_waits, 'CHECKPOINT_WAIT_S', DEFAULT_CHECKPOINT_WAIT_S)
    ckpt.wait()                  # the endpoint answers: orbax's save goes on and commits
    assert step in ckpt.all_steps()
  finally:
    storage_waits._abandoned.clear()  # pylint: disable=protected-access
    ckpt.close()


def test_the_per_step_check_of_a_save_ends_at_its_bound(tmp_path, fresh_waits):
  """The loop's check at every step (Checkpointer.check_for_errors) calls orbax's, which also
  waits, without a timeout, for the checkpoint's metadata writes. On a frozen endpoint (a
  slow-test trainer's stacks: check_for_errors -> metadata store wait_until_finished) that held
  the run until the save's hard deadline ended the process, so it never closed on the stall.
  Here orbax's check is made to hang as it did: the check ends after CHECKPOINT_WAIT_S with the
  save's paragraph."""
  import threading  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  ckpt = ckpt_lib.Checkpointer(str(tmp_path / 'run'), every=1)
  frozen = threading.Event()
  try:
    ckpt.save_params(1, _tiny_state(1))
    ckpt.check_for_errors()              # the real check: answers at once
    fresh_waits.setattr(ckpt.manager, 'check_for_errors', lambda: frozen.wait(60))
    fresh_waits.setattr(storage_waits, 'CHECKPOINT_WAIT_S', 1.0)
    start = time.monotonic()
    with pytest.raises(StorageError) as e, _alarm(30):
      ckpt.check_for_errors()
    took, message = time.monotonic() - start, str(e.value)
    assert 0.9 < took < 3.0, took
    assert re.search(r'^Saving a checkpoint to .* did not finish within 1 s: the storage stopped '
                     r'answering.*checkpoints before it are intact', message), message
    assert storage_waits.abandoned()
  finally:
    frozen.set()
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


# Issue 57: the waits left, one test per path -----------------------------------------------------

def _abstract(state):
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def test_a_restore_that_stalls_ends_at_its_bound(gcs, fresh_waits):
  """A run restoring at start-up from a stopped endpoint waited for as long as it was stopped
  (308 s in the issue; 123 s inside orbax's restore), in orbax's listing and reads through
  gcsfs and tensorstore, which no bound reached. Each is a StorageError naming what stalled after
  CHECKPOINT_WAIT_S: the listing when the checkpointer opens, the restore of the latest, the
  read-only restore of its parameters (analysis, sampling, export). Once the endpoint answers,
  the same restore gives the saved arrays: nothing was changed."""
  from gated_attention.runs import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  state = {'params': _tiny_state(3)}
  ckpt = ckpt_lib.Checkpointer(gcs.url('run'), every=1)
  ckpt.save_params(3, state['params'])
  ckpt.close()
  abstract = {'params': _abstract(state['params'])}
  opened = ckpt_lib.Checkpointer(gcs.url('run'), every=1)     # listed while it answers
  reader = ckpt_lib.Checkpointer(gcs.url('run'), read_only=True)
  calls = {
      'listing the checkpoints': lambda: ckpt_lib.Checkpointer(gcs.url('run'), every=1),
      'restoring the latest checkpoint': lambda: opened.restore_latest(abstract, None),
      "reading the latest checkpoint's parameters":
          lambda: reader.restore_latest_params(abstract['params']),
  }
  took = {}
  fresh_waits.setattr(storage_waits, 'CHECKPOINT_WAIT_S', 1.5)   # (a loaded machine's opening
  with stalled(gcs.server):                                      # above may take longer)
    for what, call in calls.items():
      start = time.monotonic()
      with pytest.raises(StorageError) as e, _alarm(30):
        call()
      took[what] = time.monotonic() - start
      message = str(e.value)
      assert message.startswith(f'{what[0].upper()}{what[1:]} in {gcs.url("run")}/checkpoints '
                                'did not finish within 2 s: the storage stopped answering'), message
      assert 'checkpoints are intact' in message and 'run the same command again' in message
      assert '\n' not in message
  assert all(1.4 < t < 4.0 for t in took.values()), took
  storage_waits._abandoned.clear()  # pylint: disable=protected-access
  fresh_waits.setattr(storage_waits, 'CHECKPOINT_WAIT_S', DEFAULT_CHECKPOINT_WAIT_S)
  restored = ckpt_lib.Checkpointer(gcs.url('run'), every=1).restore_latest(abstract, None)
  assert restored.step == 3 and restored.warm
  jax.tree.map(np.testing.assert_array_equal, restored.state['params'], state['params'])


def _tokenized_run(gcs, corpus):
  """A tokenized folder on gs:// and what the training loop reads from it: its Data, its
  training batches through DevicePrefetch with the loop's bound, a stand-in for the Run."""
  from gated_attention import input_pipeline  # pylint: disable=g-import-not-at-top
  from gated_attention.input_pipeline import tokenized  # pylint: disable=g-import-not-at-top
  from gated_attention.training import prefetch, session  # pylint: disable=g-import-not-at-top
  from tests.test_tokenized import _cfg  # pylint: disable=g-import-not-at-top
  out = gcs.url('tokens')
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  config = types.SimpleNamespace(data=_cfg(corpus, source='tokenized', path=out))
  data = input_pipeline.build_data(config.data, global_batch_size=4, seed=0)
  data.train_iter = prefetch.DevicePrefetch(data.train_iter, lambda batch: batch, 2,
                                            bound=session.data_bound(config, 'training data'))
  return out, types.SimpleNamespace(config=config, data=data)


@pytest.fixture
def left_behind():
  """The reading threads a stalled endpoint leaves stuck are not joined when this test process
  exits: array_record's GCS client does not return from a read the server got while stopped
  (main.py ends its process with os._exit: storage/waits.py), and concurrent.futures joins the
  threads of every pool (grain's) at exit."""
  import concurrent.futures.thread as pool_threads  # pylint: disable=g-import-not-at-top
  before = set(pool_threads._threads_queues)  # pylint: disable=protected-access
  yield
  for thread in set(pool_threads._threads_queues) - before:  # pylint: disable=protected-access
    pool_threads._threads_queues.pop(thread, None)  # pylint: disable=protected-access


def test_the_data_reads_of_training_and_evaluation_end_at_their_bound(gcs, corpus, fresh_waits,
                                                                       left_behind):
  """The issue: with the endpoint stopped, the evaluation's reads of a gs:// tokenized folder
  waited 186 s, until it answered (training's own batches were in memory). The training batches
  (read ahead in DevicePrefetch's thread) and the validation batches (read at the first
  evaluation) are each given up after REQUEST_S without a batch, in one paragraph naming the
  data; the thread left reading does not hold the prefetch's shutdown. Once it answers, the same
  data reads."""
  from gated_attention.training import loop, session  # pylint: disable=g-import-not-at-top
  out, run = _tokenized_run(gcs, corpus)
  fresh_waits.setattr(storage_waits, 'REQUEST_S', 1.0)
  run.data.train_iter._bound = session.data_bound(run.config, 'training data')  # pylint: disable=protected-access
  took = {}
  with stalled(gcs.server):
    for what, call in (('training data', lambda: next(run.data.train_iter)),
                       ('validation data', lambda: loop._read_validation(run))):  # pylint: disable=protected-access
      start = time.monotonic()
      with pytest.raises(StorageError, match=f'Reading the {what} from {out} gave no batch '
                         r'within 1 s: the storage stopped answering.*checkpoints already written '
                         'are intact.*run the same command again') as e, _alarm(30):
        call()
      took[what] = time.monotonic() - start
      assert '\n' not in str(e.value)
    start = time.monotonic()
    run.data.train_iter.shutdown()
    assert time.monotonic() - start < 1.0
  assert all(0.9 < t < 4.0 for t in took.values()), took
  storage_waits._abandoned.clear()  # pylint: disable=protected-access
  fresh_waits.setattr(storage_waits, 'REQUEST_S', DEFAULT_REQUEST_S)
  _, run = _tokenized_run(gcs, corpus)
  next(run.data.train_iter)
  loop._read_validation(run)  # pylint: disable=protected-access
  assert len(run.data.val_batches()) == 2


def test_the_profile_and_goodput_uploads_end_at_their_bound(gcs, fresh_waits, tmp_path,
                                                             monkeypatch):
  """A trace's upload (each file one bounded request) and the goodput account's writes (the
  session's first record, the last one at the end, the summary's read) against a stopped
  endpoint: each one paragraph naming what stalled and that the same command resumes (before,
  `Cannot upload ...: no answer within 5 s ... check the network`, and at the end of a finished
  run a warning and then `Cannot list .../goodput`), within its bound; the closing steps after it
  get short bounds."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from gated_attention.training import goodput, profile  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax.profiler, 'stop_trace', lambda: None)
  run = gcs.url('run')
  tracer = profile.Profiler(ml_collections.ConfigDict({'profile_steps': 2}), run, 0)
  tracer.local, tracer.tracing = str(tmp_path / 'trace'), True
  os.makedirs(os.path.join(tracer.local, 'plugins', 'profile', 'x'))
  with open(os.path.join(tracer.local, 'plugins', 'profile', 'x', 'h.xplane.pb'), 'wb') as f:
    f.write(os.urandom(1000))
  account = goodput.Account()
  account.begin(run, 0)
  fresh_waits.setattr(storage_waits, 'REQUEST_S', 0.5)
  calls = {
      'Uploading the profiler trace of steps 3-4 failed: Cannot upload': lambda: tracer.close(4),
      'The goodput account of this session could not be written to': (
          lambda: account.finish(4, 'finished')),
      "Recording this session's goodput account in": lambda: goodput.Account().begin(run, 4),
      'Reading the goodput accounts of': lambda: goodput.summary(run),
  }
  took = {}
  with stalled(gcs.server):
    for what, call in calls.items():
      storage_waits._closing.clear()  # pylint: disable=protected-access
      start = time.monotonic()
      with pytest.raises(StorageError) as e, _alarm(30):
        call()
      took[what] = time.monotonic() - start
      message = str(e.value)
      assert message.startswith(what) and 'no answer within 0.5 s' in message, message
      assert message.endswith('The checkpoints already written are intact; once the storage '
                              'answers, run the same command again to resume from the latest '
                              'one.'), message
      assert storage_waits.request_timeout() == storage_waits.CLOSING_REQUEST_S   # closing
  assert max(took.values()) < 4.0, took


# A real trainer on a stalled endpoint (slow: a reference run and two training commands) -------

from tests.test_faults import (REPO, assert_like_reference, env, main_cmd,  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
                               one_paragraph, reference, run_main)

BOUNDS = {'GATED_ATTENTION_STORAGE_REQUEST_S': '3', 'GATED_ATTENTION_CHECKPOINT_WAIT_S': '3'}


def _wait_for(text: str, log, proc, deadline: float, err):
  """Until `text` stands in the file `log`; fails (the end of the stderr file `err`) if the
  process ends first or `deadline` (time.monotonic) passes."""
  while text not in log.read_text():
    assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
    time.sleep(0.01)


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
    _wait_for(f'step {at_step}/', out, proc, time.monotonic() + 300, err)
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


# The stalled commands' bounds (the issue's); the commands before and after them keep the
# defaults, so that a loaded machine's slow answers are not taken for a stall.
HELD_BOUNDS = {'GATED_ATTENTION_STORAGE_REQUEST_S': '5', 'GATED_ATTENTION_CHECKPOINT_WAIT_S': '10'}


def _start_held(cmd, env, tmp_path, point: str):
  """main.py (`cmd`) with `point` (MODULE:QUALNAME) held at its first call until the file `go`
  exists (tests/stall_point.py), with HELD_BOUNDS. (process, go, stdout file, stderr file)."""
  go, out_path, err_path = tmp_path / 'go', tmp_path / 'stdout', tmp_path / 'stderr'
  with open(out_path, 'w') as out, open(err_path, 'w') as err:
    proc = subprocess.Popen([cmd[0], '-m', 'tests.stall_point', point, str(go), *cmd[1:]],
                            cwd=REPO, env={**env, **HELD_BOUNDS}, stdout=out, stderr=err)
  return proc, go, out_path, err_path


def _held_stall(cmd, env, server, tmp_path, point: str) -> tuple[int, str, float]:
  """main.py with `point` (MODULE:QUALNAME) held at its first call (tests/stall_point.py), with
  HELD_BOUNDS; the server is stopped there, then the command goes on. (exit status, stderr,
  seconds from the stop to the exit); the server is thawed after."""
  proc, go, _, err_path = _start_held(cmd, env, tmp_path, point)
  try:
    _wait_for('stall point:', err_path, proc, time.monotonic() + 300, err_path)
    with stalled(server):
      stopped = time.monotonic()
      go.touch()
      try:
        proc.wait(timeout=120)
      except subprocess.TimeoutExpired:
        pytest.fail(f'still running 120 s after the storage stopped at {point}:\n'
                    f'{err_path.read_text()[-2000:]}')
      took = time.monotonic() - stopped
  finally:
    proc.kill()
    proc.wait()
  return proc.returncode, err_path.read_text(), took


def _restore_case(env, server, bucket, tmp_path):
  """A run with checkpoint 10 on gs://; the same command stalls as it restores."""
  workdir = f'gs://{bucket}/run'
  first = run_main(main_cmd(workdir, **{'train.steps': 10}), env)
  assert first.returncode == 0, first.stderr[-3000:]
  cmd = main_cmd(workdir)
  code, err, took = _held_stall(cmd, env, server, tmp_path,
                                'gated_attention.runs.checkpoint:Checkpointer.restore_latest')
  return workdir, cmd, code, err, took, 'Restoring the latest checkpoint in'


def _evaluation_case(env, server, bucket, tmp_path):
  """A run from a tokenized folder on gs://; the storage stalls as the first evaluation reads
  its held-out batches (the training batches were read ahead)."""
  from gated_attention.input_pipeline import tokenized  # pylint: disable=g-import-not-at-top
  from tests.test_tokenized import _cfg  # pylint: disable=g-import-not-at-top
  corpus_glob = str(tmp_path / 'corpus' / '*.jsonl')
  os.makedirs(tmp_path / 'corpus')
  rng = np.random.default_rng(0)
  with open(tmp_path / 'corpus' / '0.jsonl', 'w') as f:
    for i in range(60):
      f.write('{"text": "doc%d %s"}\n' % (i, ' '.join(rng.choice(['a', 'bc', 'def'], 40))))
  tokens = f'gs://{bucket}/tokens'
  tokenizing = subprocess.run(
      [main_cmd('')[0], '-c', 'import sys; from gated_attention.input_pipeline import tokenized; '
       'from tests.test_tokenized import _cfg; '
       'tokenized.tokenize(_cfg(sys.argv[1]), sys.argv[2], workers=1, progress=False)',
       corpus_glob, tokens], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert tokenizing.returncode == 0, tokenizing.stderr[-3000:]
  del tokenized, _cfg
  workdir = f'gs://{bucket}/run'
  cmd = main_cmd(workdir, **{'data.source': 'tokenized', 'data.path': tokens,
                             'data.val_fraction': 0.1, 'train.eval_every': 10})
  code, err, took = _held_stall(cmd, env, server, tmp_path,
                                'gated_attention.training.loop:_evaluate_and_log')
  return workdir, cmd, code, err, took, f'Reading the validation data from {tokens} gave no batch'


def _two_signals_case(env, server, bucket, tmp_path):
  """Issue 57: two SIGTERMs while a run closes after a storage stall exited 143 with
  "Interrupted again", the storage paragraph lost and the lock left for the next run to take
  over. The run is held as it starts closing (tests/stall_point.py); the storage answers again,
  then both signals come. (exit status, stderr, the lock object's JSON after it, seconds from
  the first signal to the exit)."""
  import json  # pylint: disable=g-import-not-at-top
  workdir = f'gs://{bucket}/run'
  cmd = main_cmd(workdir)
  proc, _, out_path, err_path = _start_held(cmd, env, tmp_path,
                                            'gated_attention.training.session:close_run')
  try:
    deadline = time.monotonic() + 300
    _wait_for('step 14/', out_path, proc, deadline, err_path)
    with stalled(server):            # the run stops on it and starts closing: held there
      _wait_for('stall point:', err_path, proc, deadline, err_path)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    took = time.monotonic() - signalled
  finally:
    proc.kill()
    proc.wait()
  # Read on this case's server: this process's storage clients talk to the session's server
  # (STORAGE_EMULATOR_HOST), where the bucket does not exist (CI: a 404 on run/trainer.lock).
  data = server.read(bucket, 'run/trainer.lock')
  assert data is not None, f'no lock object on the run\'s server: {workdir}'
  lock = json.loads(data)
  return proc.returncode, err_path.read_text(), lock, took


@pytest.mark.slow   # three cases side by side, each up to three main.py commands (~90 s)
def test_a_trainer_that_stalls_restoring_or_evaluating_stops_and_resumes(env, tmp_path):
  """Issue 57: the storage stopped as a run restored its checkpoint at start-up (still waiting
  308 s later) or as its first evaluation read held-out batches from a gs:// tokenized folder
  (186 s, until it answered). With the issue's bounds (5 s a request, 10 s a checkpoint) each
  ends within seconds, exit status 1, one paragraph naming what stalled and the way on; once the
  storage answers, the same command resumes and trains to the end. Beside them, two SIGTERMs while a run closes on a stall
  (`_two_signals_case`). Each case on a fake-gcs-server of its own, side by side."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  from tests import gcs_server  # pylint: disable=g-import-not-at-top

  def case(make, name):
    port = gcs_server.free_port()
    server = gcs_server.Server(port)
    try:
      env_case = {**env, **gcs_server.environment(port)}
      (tmp_path / name).mkdir()
      workdir, cmd, code, err, took, what = make(env_case, server, server.bucket(),
                                                 tmp_path / name)
      resumed = run_main(cmd, env_case)
      return name, workdir, code, err, took, what, resumed
    finally:
      server.stop()
  def signals():
    port = gcs_server.free_port()
    server = gcs_server.Server(port)
    try:
      (tmp_path / 'signals').mkdir()
      env_case = {**env, **gcs_server.environment(port)}
      return _two_signals_case(env_case, server, server.bucket(), tmp_path / 'signals')
    finally:
      server.stop()
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    twice = pool.submit(signals)
    results = list(pool.map(lambda a: case(*a), [(_restore_case, 'restore'),
                                                 (_evaluation_case, 'evaluation')]))
    code, err, lock, took = twice.result()
  # Two signals while it closes on the stall: at once, the stall's paragraph kept, the lock freed.
  message = ' '.join(err.split())
  print(f'[two signals] exit {code} {took:.1f} s after the first: {message[-700:]}')
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert took < 10, took
  assert re.search(r'Error \(StorageError\): .*(no answer within 5|did not finish within 10|'
                   r'Timeout of 5\.0s).*run the same command again', message), message
  assert message.index('Error (StorageError)') < message.index('Interrupted again'), message
  assert lock.get('released'), lock
  for name, _, code, err, took, what, resumed in results:
    message = ' '.join(err.split())
    print(f'[{name}] exit {code} {took:.1f} s after the storage stopped: {message[-600:]}')
    assert code == 1, err[-3000:]
    one_paragraph(err)
    assert what in message and 'did not finish within 10 s' in message or (
        'gave no batch within 5 s' in message), message
    assert 'run the same command again' in message, message
    assert took < 30, took
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'step 30/30' in resumed.stdout
