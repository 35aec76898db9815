"""Fault injection (issue 11): kill -9, damaged checkpoints, NaN steps, divergence, a full disk,
a failing asynchronous save, changed data settings and bad inputs. Each case asserts what the run
did; docs/faults.md tabulates the results of `pytest -q -m slow tests/test_faults.py`.

Every run here is the same tiny model for 30 steps (checkpoints every 10), compared bitwise with
one uninterrupted reference run. One persistent XLA compilation cache, in this process and in the
`main.py` subprocesses, keeps each run to seconds (the compiled programs are the same ones).
"""

import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache
from orbax.checkpoint._src.checkpointers import async_checkpointer

from gated_attention.runs import checkpoint as ckpt_lib
from gated_attention.training import loop
from gated_attention.analysis import metrics as metrics_lib
from gated_attention.runs import rundir as runs_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 30
OVERRIDES = {
    'model.num_layers': 2, 'model.hidden_size': 64, 'model.head_dim': 16, 'model.ffn_size': 128,
    'data.seq_len': 32, 'data.val_batches': 2, 'train.batch_size': 8, 'train.warmup_steps': 4,
    'train.steps': STEPS, 'train.log_every': 1, 'train.eval_every': STEPS,
    'train.checkpoint_every': 10,
}
EVENTS = ('skip', 'spike', 'diverged', 'failure', 'rollback')
# A failed restore (a damaged checkpoint) leaves orbax reads in flight whose coroutines and
# callbacks end after their event loop closed; Python reports them as unraisable.
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


def config(**extra):
  from configs import g1_elementwise  # pylint: disable=g-import-not-at-top
  c = g1_elementwise.get_config('tiny')
  c.update_from_flattened_dict({**OVERRIDES, **extra})
  return c


def main_cmd(workdir, **extra):
  """The `main.py` command line of `config(**extra)` in `workdir`."""
  return ([sys.executable, 'main.py', '--config=configs/g1_elementwise.py', f'--workdir={workdir}']
          + [f'--config.{k}={v}' for k, v in {**OVERRIDES, **extra}.items()])


def run_main(cmd, env, timeout=300) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def rows(workdir, split='train') -> dict:
  """{step: row} of one split of metrics.jsonl, the last row of a step winning (a resumed run
  repeats the steps after its checkpoint)."""
  return {r['step']: r for r in runs_lib.read_metrics(workdir) if r['split'] == split}


def events(workdir) -> list[dict]:
  return [r for r in runs_lib.read_metrics(workdir, every_row=True) if r['split'] in EVENTS]


def losses(workdir) -> dict:
  return {step: row['loss'] for step, row in rows(workdir).items()}


def steps_of(workdir) -> list[int]:
  """The finished checkpoints (as orbax sees them)."""
  ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    return ckpt.all_steps()
  finally:
    ckpt.close()


def params_of(workdir, step=None) -> dict:
  return jax.device_get(runs_lib.load_run(workdir, step).params)


def assert_bitwise(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    assert x.dtype == y.dtype and np.array_equal(x, y), 'parameters differ'


def assert_finite(tree):
  for x in jax.tree.leaves(tree):
    assert np.all(np.isfinite(x))


def copy_run(src, tmp_path, name='run') -> str:
  dst = str(tmp_path / name)
  shutil.copytree(src, dst)
  return dst


def one_paragraph(stderr: str):
  """main.py's way of failing on a user error: no traceback, the message and the hint line."""
  assert 'Traceback' not in stderr, stderr
  assert '(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)' in stderr, stderr


@pytest.fixture(scope='module')
def env(tmp_path_factory):
  """A persistent compilation cache for this module (this process and its subprocesses); the
  process's JAX settings are restored afterwards."""
  cache = str(tmp_path_factory.mktemp('xla_cache'))
  names = {'jax_compilation_cache_dir': cache, 'jax_persistent_cache_min_compile_time_secs': 0}
  old = {name: getattr(jax.config, name) for name in names}
  for name, value in names.items():
    jax.config.update(name, value)
  yield {**os.environ, 'JAX_COMPILATION_CACHE_DIR': cache,
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0', 'JAX_PLATFORMS': 'cpu'}
  for name, value in old.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


@pytest.fixture(scope='module')
def reference(env, tmp_path_factory):
  """The uninterrupted run every faulty one is compared with: (workdir, losses, final params)."""
  del env
  workdir = str(tmp_path_factory.mktemp('reference') / 'run')
  loop.run(config(), workdir)
  assert steps_of(workdir) == [10, 20, 30]
  assert sorted(losses(workdir)) == list(range(1, STEPS + 1))
  return types.SimpleNamespace(workdir=workdir, losses=losses(workdir),
                               params=params_of(workdir))


def assert_like_reference(workdir, reference):
  """The run finished with the reference's per-step train losses and parameters, bitwise."""
  assert losses(workdir) == reference.losses
  assert steps_of(workdir)[-1] == STEPS
  assert_bitwise(params_of(workdir), reference.params)


# kill -9 ----------------------------------------------------------------------------------------

def _saving(workdir, step):
  """While orbax writes checkpoint `step` (its temporary directory exists)."""
  def ready():
    d = os.path.join(workdir, 'checkpoints')
    return os.path.isdir(d) and any(n.startswith(f'{step}.orbax-checkpoint-tmp')
                                    for n in os.listdir(d))
  ready.what = f'mid-save of checkpoint {step}'
  return ready


def _logged(workdir, step):
  """Once this attempt has written the train row of `step` (rows already there do not count)."""
  path = os.path.join(workdir, 'metrics.jsonl')
  offset = os.path.getsize(path) if os.path.exists(path) else 0
  def ready():
    if not os.path.exists(path):
      return False
    with open(path) as f:
      f.seek(offset)
      whole = f.read().split('\n')[:-1]           # a line being written has no newline yet
    return any(r['split'] == 'train' and r['step'] >= step for r in map(json.loads, whole))
  ready.what = f'after the train row of step {step}'
  return ready


def _after(seconds):
  start = time.time()
  def ready():
    return time.time() - start >= seconds
  ready.what = f'{seconds:.1f} s after launch (start-up)'
  return ready


def kill_when(cmd, env, ready, log, timeout=300):
  """Starts `cmd`, SIGKILLs it as soon as `ready()` holds; fails if it ends first."""
  with open(log, 'a') as out:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    try:
      while not ready():
        assert proc.poll() is None, f'the run ended before the kill point ({ready.what})'
        assert time.time() < deadline, 'timed out waiting for the kill point'
        time.sleep(0.002)
      proc.send_signal(signal.SIGKILL)
    finally:
      proc.kill()
      proc.wait()
  assert proc.returncode == -signal.SIGKILL


@pytest.mark.slow  # the default run has it on gs:// (test_storage_runs.py) and SIGTERM mid-save
def test_kill9_mid_save_resumes_bitwise(env, reference, tmp_path):
  """One kill while checkpoint 20 is written; the same command again finishes the run."""
  workdir = str(tmp_path / 'run')
  cmd = main_cmd(workdir)
  kill_when(cmd, env, _saving(workdir, 20), str(tmp_path / 'log'))
  assert steps_of(workdir) in ([10], [10, 20])      # 20 is unfinished unless its commit won
  done = run_main(cmd, env)
  assert done.returncode == 0, done.stderr
  assert_like_reference(workdir, reference)


@pytest.mark.slow
def test_kill9_at_random_points_resume_bitwise(env, reference, tmp_path):
  """Six kills of one run, one after the other (each attempt resumes and is killed further on):
  at start-up, mid-save of 10, after a random step, mid-save of 20, after the last train row
  (mid-eval), mid-save of the last checkpoint; then one attempt runs to the end."""
  rng = random.Random(11)
  workdir = str(tmp_path / 'run')
  cmd, log = main_cmd(workdir), str(tmp_path / 'log')
  points = [lambda: _after(rng.uniform(0.5, 4.0)), lambda: _saving(workdir, 10),
            lambda: _logged(workdir, rng.randint(11, 19)), lambda: _saving(workdir, 20),
            lambda: _logged(workdir, STEPS), lambda: _saving(workdir, STEPS)]
  for point in points:
    ready = point()
    kill_when(cmd, env, ready, log)
    print(f'killed {ready.what}: finished checkpoints {steps_of(workdir)}')
  done = run_main(cmd, env)
  assert done.returncode == 0, done.stderr
  assert_like_reference(workdir, reference)


# Damaged checkpoints ----------------------------------------------------------------------------

def _largest_data_file(step_dir):
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(step_dir, 'state')) for f in fs
           if os.sep + 'd' + os.sep in os.path.join(d, f)]
  return max(files, key=os.path.getsize)


def _flip_bytes(step_dir, _):
  path = _largest_data_file(step_dir)
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    old = f.read(4)
    f.seek(-4, os.SEEK_CUR)
    f.write(bytes(b ^ 0x5A for b in old))
  return os.path.relpath(path, step_dir)


def _truncate(step_dir, _):
  path = _largest_data_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)
  return os.path.relpath(path, step_dir)


def _empty(step_dir, _):
  shutil.rmtree(step_dir)
  os.mkdir(step_dir)


def _wrong_checksums(step_dir, _):
  """Intact orbax files; one recorded checksum off by one."""
  path = os.path.join(step_dir, '_CHECKPOINT_METADATA')
  with open(path) as f:
    meta = json.load(f)
  sums = meta['custom_metadata']['checksums']
  key = next(k for k in sorted(sums) if k.startswith("['params']"))
  sums[key] = (sums[key] + 1) % 2**32
  with open(path, 'w') as f:
    json.dump(meta, f)
  return key


def _other_arrays(step_dir, prev_dir):
  """The state item replaced by another checkpoint's: valid arrays, not this step's."""
  shutil.rmtree(os.path.join(step_dir, 'state'))
  shutil.copytree(os.path.join(prev_dir, 'state'), os.path.join(step_dir, 'state'))


# damage: (how, what the warning gives as the reason)
DAMAGE = {
    'flipped_bytes': (_flip_bytes, r'checksum mismatch in |non-finite values in |error while '
                                   'reading'),
    'truncated_file': (_truncate, r'error while reading|checksum mismatch in '),
    'empty_step_dir': (_empty, r'empty or partial: it holds no state'),
    'wrong_checksum': (_wrong_checksums, r'checksum mismatch in \["\[\'params\'\]'),
    'other_valid_arrays': (_other_arrays, r'checksum mismatch in '),
}


def _files(top) -> list:
  """(path relative to `top`, size) of every file under `top`."""
  return sorted((os.path.relpath(os.path.join(d, f), top), os.path.getsize(os.path.join(d, f)))
                for d, _, fs in os.walk(top) for f in fs)


@pytest.mark.parametrize('damage', list(DAMAGE))
def test_unusable_newest_checkpoint_is_set_aside(reference, tmp_path, capsys, damage):
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  how, reason = DAMAGE[damage]
  how(os.path.join(ckpts, '30'), os.path.join(ckpts, '20'))
  damaged = _files(os.path.join(ckpts, '30'))

  loop.run(config(), workdir)
  out = capsys.readouterr().out
  aside = os.path.join(ckpts, '30.unusable')
  warning = next((l for l in out.splitlines() if l.startswith('Warning: checkpoint 30')), out)
  print(warning)
  assert warning.startswith('Warning: checkpoint 30 is unusable (') and (
      f'set aside as {aside} (not deleted); trying the previous one.') in warning, out
  assert re.search(reason, warning), warning
  assert 'resuming at step 20' in out, out
  assert _files(aside) == damaged                  # kept as it was, for inspection
  assert_like_reference(workdir, reference)         # resumed from 20: steps 21-30 bitwise


@pytest.mark.slow
def test_two_damaged_newest_checkpoints_fall_back_twice(reference, tmp_path, capsys):
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  _flip_bytes(os.path.join(ckpts, '30'), None)
  _truncate(os.path.join(ckpts, '20'), None)
  loop.run(config(), workdir)
  out = capsys.readouterr().out
  for step in (30, 20):
    assert f'Warning: checkpoint {step} is unusable' in out, out
    assert os.path.isdir(os.path.join(ckpts, f'{step}.unusable'))
  assert 'resuming at step 10' in out
  assert_like_reference(workdir, reference)


def test_a_rejected_checkpoint_leaves_the_data_iterator_where_it_was(reference, tmp_path):
  """Issue 50 (2): the state is verified before anything is restored in place. A checkpoint
  whose arrays fail their checksums used to move the data iterator (restored with the arrays)
  before it was rejected, so a run whose every checkpoint was unusable "started" from step 0
  with another run's data position."""
  from gated_attention import input_pipeline, sharding  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train  # pylint: disable=g-import-not-at-top
  workdir = copy_run(reference.workdir, tmp_path)
  _flip_bytes(os.path.join(workdir, 'checkpoints', '30'), None)
  c = config()
  setup = train.Setup(c, sharding.build_mesh(c.mesh))
  data = input_pipeline.build_data(c.data, global_batch_size=c.train.batch_size, seed=c.seed)
  before = json.dumps(data.train_iter.get_state())
  ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    # Flipped bytes fail the checksums, or first the finiteness check where they made a NaN
    # (which bytes sit mid-file depends on the order orbax wrote the arrays in).
    with pytest.raises(ckpt_lib.CheckpointError, match='checksum mismatch|non-finite values'):
      ckpt.restore_step(30, {'params': setup.abstract_params, 'opt_state': setup.abstract_opt},
                        data.train_iter)
    assert json.dumps(data.train_iter.get_state()) == before
    ckpt.restore_step(20, {'params': setup.abstract_params, 'opt_state': setup.abstract_opt},
                      data.train_iter)      # an intact one does move it
    assert json.dumps(data.train_iter.get_state()) != before
  finally:
    ckpt.close()


def test_a_run_whose_every_checkpoint_is_unusable_is_refused(reference, tmp_path):
  """Issue 50 (2): every checkpoint damaged. Refused (rather than started over: new checkpoints
  and metrics would mix with the old run's), naming each checkpoint and why; they are set aside,
  not deleted, nothing is trained, and the same command is refused again until a person moves
  them (docs/faults.md)."""
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  for step in (10, 20, 30):
    _flip_bytes(os.path.join(ckpts, str(step)), None)
  rows_before = len(runs_lib.read_metrics(workdir, every_row=True))
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    loop.run(config(), workdir)
  message = str(e.value)
  assert re.search(r'every checkpoint is unusable: 30 \((checksum mismatch|non-finite values)',
                   message), message
  assert '; 20 (' in message and '; 10 (' in message and 'Nothing was restored or trained' in message
  assert sorted(os.listdir(ckpts)) == ['10.unusable', '20.unusable', '30.unusable']
  assert len(runs_lib.read_metrics(workdir, every_row=True)) == rows_before
  with pytest.raises(ckpt_lib.CheckpointError, match='only ones set aside as unusable: '
                     '10.unusable, 20.unusable, 30.unusable'):
    loop.run(config(), workdir)
  assert not os.path.exists(os.path.join(workdir, lock_lib.LOCK_FILE))   # released


# Non-finite steps -------------------------------------------------------------------------------

def poison(monkeypatch, first: int, count: int):
  """From step `first` on, the next `count` train batches carry a NaN in their loss mask (so the
  loss and every gradient are NaN); returns the list of poisoned steps (filled as they run)."""
  hit, step = [], loop._step

  def poisoned(run, batch, *rest):
    if run.step + 1 >= first and len(hit) < count:
      hit.append(run.step + 1)
      mask = np.array(batch['loss_mask'])
      mask[0, 0] = np.nan
      batch = {**batch, 'loss_mask': jax.device_put(mask, batch['loss_mask'].sharding)}
    return step(run, batch, *rest)
  monkeypatch.setattr(loop, '_step', poisoned)
  return hit


def test_nan_gradient_step_is_skipped(reference, tmp_path, monkeypatch, capsys):
  workdir = str(tmp_path / 'run')
  hit = poison(monkeypatch, 15, 1)
  loop.run(config(), workdir)
  assert hit == [15]
  assert [(e['step'], e['split'], e['loss']) for e in events(workdir)] == [(15, 'skip', None)]
  train = rows(workdir)
  assert sorted(train) == list(range(1, STEPS + 1))        # the run finished
  assert train[15]['loss'] is None and train[15]['finite'] is False
  assert train[15]['param_norm'] == train[14]['param_norm']  # the step changed nothing
  assert train[STEPS]['skipped_total'] == 1
  # --mode=analyze's count
  report = metrics_lib.stability(runs_lib.read_metrics(workdir, every_row=True))
  assert (report['skipped_steps'], report['spikes'], report['halted']) == (1, 0, False)
  assert {s: l for s, l in losses(workdir).items() if s < 15} == {
      s: l for s, l in reference.losses.items() if s < 15}
  # Not calm within spike_window (50) steps of the skip: no checkpoint at 20, nor at the last
  # step (issue 24: it was saved with `calm or last`); the run ends with checkpoint 10.
  assert steps_of(workdir) == [10]
  assert 'step 30: not saved: the loss is not calm' in capsys.readouterr().out
  assert_finite(params_of(workdir))


def test_nonfinite_steps_in_a_row_halt_and_nothing_bad_is_saved(reference, tmp_path,
                                                                  monkeypatch):
  workdir = str(tmp_path / 'run')
  hit = poison(monkeypatch, 13, 100)
  with pytest.raises(loop.TrainingStopped, match='10 non-finite steps in a row') as e:
    loop.run(config(), workdir)
  assert 'the best checkpoint is step 10' in str(e.value)
  assert hit == list(range(13, 23))
  assert [(e['step'], e['split']) for e in events(workdir)] == (
      [(s, 'skip') for s in range(13, 23)] + [(22, 'failure')])
  assert steps_of(workdir) == [10]
  assert_bitwise(params_of(workdir), params_of(reference.workdir, 10))


@pytest.mark.slow  # the halved learning rate is a static argument: one more compile
def test_nonfinite_steps_in_a_row_roll_back_with_a_lower_learning_rate(reference, tmp_path,
                                                                       monkeypatch):
  workdir = str(tmp_path / 'run')
  hit = poison(monkeypatch, 13, 10)                 # a transient fault: 10 poisoned batches
  loop.run(config(**{'train.on_failure': 'rollback'}), workdir)
  assert hit == list(range(13, 23))
  back = [e for e in events(workdir) if e['split'] == 'rollback']
  assert [(e['step'], e['to_step'], e['lr_scale']) for e in back] == [(22, 10, 0.5)]
  train = rows(workdir)
  assert sorted(train) == list(range(1, STEPS + 1))
  schedule = loop.train_lib.learning_rate_schedule(config().train)
  for step in (11, 20, 30):       # after the rollback the schedule runs at half the rate
    assert train[step]['learning_rate'] == pytest.approx(0.5 * float(schedule(step - 1)))
  assert train[11]['loss'] == reference.losses[11]   # same state and batch as the reference
  assert train[12]['loss'] != reference.losses[12]   # then the halved step moved it elsewhere
  assert_finite(params_of(workdir))


# A full disk and a failing asynchronous save ----------------------------------------------------

def test_disk_full_simulated_stops_cleanly(reference, tmp_path, monkeypatch):
  """The disk-space check before each save, with shutil.disk_usage (as the checkpointer sees it)
  reporting 64 KiB free; the run then resumes once there is space."""
  workdir = str(tmp_path / 'run')
  usage = shutil.disk_usage(str(tmp_path))
  full = types.SimpleNamespace(disk_usage=lambda _: usage._replace(free=64 << 10))
  monkeypatch.setattr(ckpt_lib, 'shutil', full)
  with pytest.raises(ckpt_lib.CheckpointError, match=r'Only 0\.1 MiB are free') as e:
    loop.run(config(), workdir)
  assert 'it resumes from step 10' in str(e.value)
  assert max(rows(workdir)) == 20                   # stopped at the save, not later
  assert steps_of(workdir) == [10]
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['10']
  monkeypatch.undo()
  loop.run(config(), workdir)                       # space again: resumes from 10
  assert_like_reference(workdir, reference)


def fail_second_save(monkeypatch):
  """The second asynchronous save fails in orbax's background thread: its writes finish, then
  ENOSPC. Returns the list of the saves' directories (filled as they start committing)."""
  calls, commit = [], async_checkpointer._background_wait_for_commit_futures

  def failing(directory, commit_futures, *args, **kwargs):
    calls.append(str(directory))
    if len(calls) == 2:
      for f in commit_futures:
        f.result()
      raise OSError(errno.ENOSPC, 'No space left on device', str(directory))
    return commit(directory, commit_futures, *args, **kwargs)
  monkeypatch.setattr(async_checkpointer, '_background_wait_for_commit_futures', failing)
  return calls


def test_failed_async_save_stops_the_run_at_the_next_step(reference, tmp_path, monkeypatch):
  """Step 21 waits until the failed save of step 20 has finished in the background: the run
  stops before step 22, the first step after the failure."""
  workdir = str(tmp_path / 'run')
  calls = fail_second_save(monkeypatch)
  step = loop._step

  def step_after_the_failure(run, batch, *rest):
    if run.step == 20:
      deadline = time.time() + 60
      while run.checkpointer.manager.is_saving_in_progress() and time.time() < deadline:
        time.sleep(0.01)
    return step(run, batch, *rest)
  monkeypatch.setattr(loop, '_step', step_after_the_failure)
  with pytest.raises(ckpt_lib.CheckpointError, match='No space left on device') as e:
    loop.run(config(), workdir)
  assert str(e.value).startswith(f'Saving a checkpoint to {workdir}/checkpoints failed: OSError')
  assert 'The checkpoints before it are intact' in str(e.value)
  assert len(calls) == 2 and os.path.basename(calls[1]).startswith('20')
  assert max(rows(workdir)) == 21
  assert steps_of(workdir) == [10]
  monkeypatch.undo()
  loop.run(config(), workdir)                       # resumes from 10 past the unfinished 20
  assert_like_reference(workdir, reference)


# Resume with changed data settings --------------------------------------------------------------

def _text_corpus(tmp_path) -> str:
  d = tmp_path / 'corpus'
  d.mkdir()
  for i in range(4):
    (d / f'{i}.txt').write_text(f'document {i}: ' + 'the quick brown fox jumps. ' * 200)
  return str(d / '*.txt')


def test_another_model_shape_without_config_json_sets_nothing_aside(reference, tmp_path, env):
  """Issue 37 (1): config.json gone (deleted, or a run directory copied without it) and a resume
  with another model shape: refused naming the differing parameters, every checkpoint kept as it
  was, no config.json written for the wrong shape; the right config then resumes."""
  workdir = copy_run(reference.workdir, tmp_path)
  os.remove(os.path.join(workdir, 'config.json'))
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  done = run_main(main_cmd(workdir, **{'model.hidden_size': 32}), env)
  assert done.returncode == 1, done.stdout + done.stderr
  one_paragraph(done.stderr)
  err = ' '.join(done.stderr.split())
  assert 'holds a model of other shapes than this config' in err and 'saved (' in err, err
  assert 'left as it is' in err
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before
  assert not os.path.exists(os.path.join(workdir, 'config.json'))
  assert steps_of(workdir) == [10, 20, 30]
  # init_from with another shape names the shapes too (it said "all failed verification").
  with pytest.raises(ckpt_lib.CheckpointError, match='holds a model of other shapes'):
    loop.run(config(**{'model.hidden_size': 32, 'train.init_from': workdir}),
             str(tmp_path / 'new'))


@pytest.mark.parametrize('name,kind', [('checkpoints', 'file'), ('metrics.jsonl', 'folder'),
                                       ('trainer.lock', 'folder'), ('config.json', 'folder')])
def test_run_files_of_the_wrong_kind_are_refused_before_any_work(tmp_path, name, kind):
  """Issue 37 (3, 5): `checkpoints` a file (the run started over from step 0, then timed out in
  orbax), metrics.jsonl, trainer.lock or config.json a folder: refused at once, nothing changed."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  if kind == 'file':
    (workdir / name).write_text('not a folder')
  else:
    (workdir / name).mkdir()
  with pytest.raises(ckpt_lib.CheckpointError, match=f'{name} should be a'):
    runs_lib.check_workdir(str(workdir))
  assert sorted(os.listdir(workdir)) == [name]


def test_ctrl_c_during_start_up_and_twice_is_one_line(tmp_path, env):
  """Issue 37 (6): Ctrl-C while the command starts up, and a second Ctrl-C while the first one's
  save is under way: exit 130 with one line, no KeyboardInterrupt traceback."""
  for when, twice in ((1.0, False), ('step 2/', True)):
    workdir = str(tmp_path / f'run{twice}')
    log = tmp_path / f'log{twice}'
    with open(log, 'w') as out:
      proc = subprocess.Popen(main_cmd(workdir), cwd=REPO, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
      deadline = time.time() + 240
      while (time.time() - deadline + 240 < when if isinstance(when, float)
             else when not in log.read_text()):
        assert proc.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.01)
      proc.send_signal(signal.SIGINT)
      if twice:
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
      proc.wait(timeout=120)
    text = log.read_text()
    assert 'Traceback' not in text and 'KeyboardInterrupt' not in text, text
    assert proc.returncode in (0, 130), (proc.returncode, text)
    if proc.returncode:
      assert 'Interrupted' in text, text


def test_a_raising_config_file_and_no_validation_batches_are_one_paragraph(tmp_path, env):
  """Issue 37 (7): a config file whose get_config raises (it printed 45 lines), and
  data.val_batches=0 (it trained, then failed at the first evaluation): one paragraph each,
  before anything is written."""
  bad = tmp_path / 'bad.py'
  bad.write_text('def get_config(arg=None):\n  raise RuntimeError("boom in config")\n')
  done = run_main([sys.executable, 'main.py', f'--config={bad}', '--mode=params'], env)
  assert done.returncode == 1
  one_paragraph(done.stderr)
  assert 'the config file raised RuntimeError: boom in config' in done.stderr
  workdir = tmp_path / 'run'
  done = run_main(main_cmd(str(workdir), **{'data.val_batches': 0}), env)
  assert done.returncode == 1
  one_paragraph(done.stderr)
  assert 'config.data.val_batches=0 must be positive' in done.stderr
  assert not workdir.exists()


@pytest.mark.parametrize('text,match', [
    ('[1, 2]', 'holds a JSON list'), ('"x"', 'holds a JSON str'),
    ('{"model": null}', 'model is null, not an object'),
    ('{"train": {"steps": "many"}}', 'train.steps is "many", not a number'),
    ('{"model": {"hidden_size": "big"}}', 'model.hidden_size is "big", not a number'),
    ('{"data": {"seq_len": 1.5}}', 'data.seq_len is 1.5, not a number'),
    ('{bad', 'is unreadable')])
def test_a_config_json_of_the_wrong_shape_or_types_is_one_error(tmp_path, text, match):
  """Issue 37 (5): valid JSON of the wrong shape or types in config.json (a list, a string
  where a number belongs, "model": null) is a RunError / CheckpointError naming the field, for
  readers and trainers alike (it was an AttributeError or TypeError)."""
  (tmp_path / 'config.json').write_text(text)
  with pytest.raises(runs_lib.RunError, match=match):
    runs_lib.read_config(str(tmp_path))
  with pytest.raises(ckpt_lib.CheckpointError, match=match):
    runs_lib.read_saved_config(str(tmp_path))


def test_damaged_metrics_rows_and_report_are_skipped_or_named(tmp_path):
  """Issue 37 (5): non-UTF-8 and mistyped metrics rows are skipped like truncated ones; a
  truncated analysis/report.json is a RunError naming the command that writes it again; a
  corrupt config.json behind configs/from_run.py is a ValueError with the JSON error."""
  (tmp_path / 'metrics.jsonl').write_bytes(
      b'{"step": 1, "split": "train", "loss": 2.5}\n\xff\xfe not text\n'
      b'{"step": "x", "split": "train", "loss": 1.0}\n{"step": 2, "split": "train", "loss": "a"}\n'
      b'{"step": 3, "split": "spike", "event": "spike", "why": "far above", "loss": 9.0}\n{"step": 4')
  assert [(r['step'], r['split']) for r in runs_lib.read_metrics(str(tmp_path))] == [
      (1, 'train'), (3, 'spike')]
  (tmp_path / 'analysis').mkdir()
  (tmp_path / 'analysis' / 'report.json').write_text('{"variant": "g1", "f_attn')
  with pytest.raises(runs_lib.RunError, match='--mode=analyze'):
    runs_lib.read_report(str(tmp_path))
  (tmp_path / 'config.json').write_text('{bad')
  from configs import from_run  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='is not valid JSON'):
    from_run.get_config(str(tmp_path))


def test_changed_data_settings_are_refused_with_the_differences(reference, tmp_path, env):
  workdir = copy_run(reference.workdir, tmp_path)
  before = {p: os.path.getmtime(os.path.join(workdir, p)) for p in ('config.json', 'checkpoints')}
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    loop.run(config(seed=7), workdir)
  assert 'holds a run with other data settings:\n  seed: saved 0, now 7\nTo continue' in str(
      e.value)
  path = _text_corpus(tmp_path)
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    loop.run(config(**{'data.source': 'text', 'data.path': path}), workdir)
  assert ("data.source: saved 'builtin', now 'text'\n  data.path: saved '', now "
          f"'{path}'\n") in str(e.value)
  assert {p: os.path.getmtime(os.path.join(workdir, p)) for p in before} == before
  assert steps_of(workdir) == [10, 20, 30]

  # The advised way on: its saved config (here from step 20, so that there is work left).
  advised = re.search(r'--config=configs/from_run\.py:(\S+?)\s', str(e.value)).group(1)
  assert advised == workdir
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '30'))
  done = run_main([sys.executable, 'main.py', f'--config=configs/from_run.py:{advised}',
                   f'--workdir={workdir}'], env)
  assert done.returncode == 0, done.stderr
  assert 'resuming at step 20' in done.stdout
  assert_like_reference(workdir, reference)


# Errors meant for a user: one paragraph, exit 1 -------------------------------------------------

def _read_only_dir(tmp_path) -> str:
  d = tmp_path / 'read_only'
  d.mkdir()
  d.chmod(0o555)
  try:
    (d / 'probe').write_text('')
  except PermissionError:
    return str(d / 'run')
  pytest.skip('permissions are not enforced for this user (root): a read-only directory is '
              'writable')


@pytest.mark.parametrize('case, flags, message', [
    pytest.param('file', [], 'is a file, not a directory; pass a directory',
                 id='workdir_is_a_file'),
    pytest.param('read_only', [], 'is not writable; pass a directory you can write to',
                 id='read_only_workdir'),
    pytest.param('run', ['--config.train.log_every=0'], 'config.train.log_every=0 must be positive',
                 id='log_every_0'),
    pytest.param('run', ['--config.x=1'], 'Error in a --config override (--config.x=1)',
                 id='unknown_override'),
    pytest.param('run', ['--config=configs/g1_elementwise.py:huge'], "Unknown scale 'huge'",
                 id='bad_scale'),
])
def test_user_errors_are_one_paragraph(tmp_path, env, case, flags, message):
  if case == 'file':
    workdir = str(tmp_path / 'file')
    open(workdir, 'w').close()
  elif case == 'read_only':
    workdir = _read_only_dir(tmp_path)
  else:
    workdir = str(tmp_path / 'run')
  done = run_main([sys.executable, 'main.py', f'--workdir={workdir}'] + flags, env, timeout=120)
  assert done.returncode == 1, (done.stdout, done.stderr)
  one_paragraph(done.stderr)
  assert message in ' '.join(done.stderr.split()), done.stderr
  assert not os.path.exists(os.path.join(workdir, 'checkpoints'))


# Forced divergence -----------------------------------------------------------------------------

def _diverge(workdir, env, **extra):
  """Resumes the reference's copy at learning rate 10 (resume allows it) for 200 more steps."""
  return run_main(main_cmd(workdir, **{'train.learning_rate': 10, 'train.steps': 230,
                                       'train.eval_every': 230, **extra}), env)


@pytest.mark.slow
def test_divergence_halts_and_keeps_the_good_checkpoint(env, reference, tmp_path, capsys):
  workdir = copy_run(reference.workdir, tmp_path)
  done = _diverge(workdir, env)
  assert done.returncode == 1, done.stderr
  one_paragraph(done.stderr)
  message = ' '.join(done.stderr.split())
  assert 'Error (TrainingStopped): Training stopped at step' in message
  assert 'the loss diverged' in message and 'the best checkpoint is step 30' in message
  ev = events(workdir)
  spikes = [e['step'] for e in ev if e['split'] == 'spike']
  assert len(spikes) == 100 and spikes == list(range(spikes[0], spikes[0] + 100))
  assert [(e['split'], e['step']) for e in ev[-2:]] == [('diverged', spikes[-1]),
                                                       ('failure', spikes[-1])]
  assert f'Training stopped at step {spikes[-1]}:' in message
  report = metrics_lib.stability(runs_lib.read_metrics(workdir, every_row=True))
  assert (report['spikes'], report['halted']) == (100, True)
  summary = (f'first spike at step {spikes[0]}, halted at {spikes[-1]}; max train loss '
             f'{max(r["loss"] for r in rows(workdir).values()):.0f}')
  assert steps_of(workdir) == [10, 20, 30]          # nothing saved while diverging
  assert_bitwise(params_of(workdir, 30), reference.params)
  loop.run(config(), workdir)                       # the good checkpoint restores (verified)
  out = capsys.readouterr().out
  assert 'resuming at step 30' in out and 'unusable' not in out, out
  print(summary)


@pytest.mark.slow
def test_divergence_rolls_back_with_lower_learning_rates(env, reference, tmp_path):
  workdir = copy_run(reference.workdir, tmp_path)
  done = _diverge(workdir, env, **{'train.on_failure': 'rollback', 'train.divergence_steps': 20})
  back = [e for e in events(workdir) if e['split'] == 'rollback']
  print(f'exit {done.returncode} after {len(back)} rollbacks: '
        f'{[(e["step"], e["to_step"], e["lr_scale"]) for e in back]}')
  assert back and all(e['to_step'] == 30 for e in back)
  assert [e['lr_scale'] for e in back] == [0.5 ** k for k in range(1, len(back) + 1)]
  counted = metrics_lib.stability(runs_lib.read_metrics(workdir, every_row=True))
  assert counted['rollbacks'] == len(back)          # every attempt's events, not one per step
  failures = [e['step'] for e in events(workdir) if e['split'] == 'failure']
  assert [e['step'] for e in back] == failures[:len(back)]
  schedule = loop.train_lib.learning_rate_schedule(config(**{'train.learning_rate': 10,
                                                             'train.steps': 230}).train)
  train = rows(workdir)
  step = max(train)
  assert train[step]['learning_rate'] == pytest.approx(
      back[-1]['lr_scale'] * float(schedule(step - 1)))
  if done.returncode == 0:                          # recovered at a lower learning rate
    assert step == 230 and len(back) <= 3
  else:                                             # or halted after max_rollbacks
    assert done.returncode == 1 and len(back) == 3 and len(failures) == 4
    one_paragraph(done.stderr)
    assert 'Training stopped at step' in done.stderr
  assert steps_of(workdir)[:3] == [10, 20, 30]
  assert_bitwise(params_of(workdir, 30), reference.params)


# A real full disk (a small tmpfs) ---------------------------------------------------------------

@pytest.fixture
def small_disk(reference, tmp_path):
  """A tmpfs of 2.5 x the size of a checkpoint (two fit, with less than one to spare), or a
  skip where mounting is not permitted (test_disk_full_simulated_stops_cleanly runs instead)."""
  size = ckpt_lib._dir_bytes(os.path.join(reference.workdir, 'checkpoints', '30'))
  mnt = tmp_path / 'tmpfs'
  mnt.mkdir()
  if not shutil.which('mount'):
    pytest.skip('no mount command')
  done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={(size * 5 // 2) // 4096 * 4096}',
                         'tmpfs', str(mnt)], capture_output=True, text=True)
  if done.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {done.stderr.strip()}')
  try:
    yield str(mnt)
  finally:
    subprocess.run(['umount', '-l', str(mnt)], check=True)


def _fill(path, leave=256 << 10):
  """Writes `path` until the disk has only `leave` bytes free (room for metrics, none for a
  checkpoint), or until it is full: the run writes beside it (a save, a metrics row), so the
  free space read before may be gone before the filler's last bytes, and a full disk is what
  these tests are after. Unbuffered, in 1 MiB writes: a refused write is seen here, not at close
  (a CI run failed there: ENOSPC from the buffered file's close, the run having written first)."""
  want = max(shutil.disk_usage(os.path.dirname(path)).free - leave, 0)
  with open(path, 'wb', buffering=0) as f:
    while want > 0:
      try:
        written = f.write(b'\0' * min(want, 1 << 20))
      except OSError as e:
        if e.errno != errno.ENOSPC:
          raise
        return
      want -= written


def _resume_elsewhere(workdir, tmp_path, reference):
  """The stopped run, moved to a disk with space, resumes and ends like the reference."""
  moved = copy_run(workdir, tmp_path, 'moved')
  loop.run(config(), moved)
  assert_like_reference(moved, reference)


@pytest.mark.slow
def test_disk_full_tmpfs_refuses_the_save(env, reference, small_disk, tmp_path):
  workdir = os.path.join(small_disk, 'run')
  done = run_main(main_cmd(workdir), env)
  assert done.returncode == 1, done.stderr
  one_paragraph(done.stderr)
  message = ' '.join(done.stderr.split())
  assert re.search(r'Only 0\.\d MiB are free on the disk of .+checkpoints, and the last '
                   r'checkpoint took 1\.\d MiB: the next save would fail', message), message
  assert 'it resumes from step 20' in message
  assert max(rows(workdir)) == 30 and steps_of(workdir) == [10, 20]
  _resume_elsewhere(workdir, tmp_path, reference)


@pytest.mark.slow
def test_disk_full_tmpfs_during_an_async_save(env, reference, small_disk, tmp_path):
  """The disk fills up (another writer) the moment the save of step 20 starts."""
  workdir = os.path.join(small_disk, 'run')
  with open(tmp_path / 'stdout', 'w') as out, open(tmp_path / 'stderr', 'w') as err:
    proc = subprocess.Popen(main_cmd(workdir), cwd=REPO, env=env, stdout=out, stderr=err)
    saving, deadline = _saving(workdir, 20), time.time() + 300
    while not saving() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.002)
    _fill(os.path.join(small_disk, 'filler'))
    proc.wait(timeout=300)
  stderr = (tmp_path / 'stderr').read_text()
  assert proc.returncode == 1, stderr
  start = stderr.rindex('Error (CheckpointError)')
  hint = '(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)'
  message = ' '.join(stderr[start:stderr.index(hint, start)].split())
  stopped = max(rows(workdir))
  print(f'stopped after step {stopped}, finished checkpoints {steps_of(workdir)}; stderr: '
        f'{len(stderr[:start].splitlines())} lines before the message '
        f'({stderr[:start].count("Traceback")} tracebacks, logged by orbax), '
        f'{len(stderr[start:].splitlines())} from it on')
  assert 'Traceback' not in stderr[start:], stderr[start:]    # none after it (tensorboardX's)
  if message.startswith('Error (CheckpointError): Saving a checkpoint to'):
    assert 'No space left on device' in message and steps_of(workdir) == [10]
    # It stops at the first step after the failure surfaces (22-26 in most runs); on a loaded
    # machine the ten steps after 20 can all run before the write fails, and the last step's save
    # reports it: the step is not asserted, what was kept is (above: neither 20 nor 30).
  else:                                             # the filler came after the save's writes
    assert 'MiB are free on the disk' in message and steps_of(workdir) == [10, 20]
  _resume_elsewhere(workdir, tmp_path, reference)


@pytest.mark.slow
def test_disk_full_tmpfs_while_a_metrics_row_is_written(env, reference, small_disk, tmp_path):
  """Issue 57: the disk fills (another writer takes every free byte) once checkpoint 25 is
  written; the rows after it fill the metrics file's last page and one row is cut short. The run
  stops naming the full disk; with space again, the same command resumes from 25, cuts the torn
  row off, and every line of metrics.jsonl parses, each row on its own line. Before: the torn row
  stayed, a line that never parses, ended by a newline the next run wrote."""
  del reference   # the compilation cache
  workdir = os.path.join(small_disk, 'run')
  cmd = main_cmd(workdir, **{'train.steps': 100, 'train.checkpoint_every': 25,
                             'train.eval_every': 100, 'train.keep_checkpoints': 1})
  filler = os.path.join(small_disk, 'filler')
  with open(tmp_path / 'stdout', 'w') as out, open(tmp_path / 'stderr', 'w') as err:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
    ckpts, deadline = os.path.join(workdir, 'checkpoints'), time.time() + 300
    while proc.poll() is None and time.time() < deadline and not (
        os.path.isdir(os.path.join(ckpts, '25'))
        and not any('tmp' in n for n in os.listdir(ckpts))):
      time.sleep(0.005)
    _fill(filler, leave=0)
    proc.wait(timeout=300)
  stderr = (tmp_path / 'stderr').read_text()
  assert proc.returncode == 1, stderr
  one_paragraph(stderr)
  message = ' '.join(stderr.split())
  assert re.search(r'Writing the metrics of step \d+ failed: OSError: \[Errno 28\] No space '
                   'left on device.*run the same command again', message), message
  with open(os.path.join(workdir, runs_lib.METRICS_FILE), 'rb') as f:
    raw = f.read()
  assert not raw.endswith(b'\n'), raw[-200:]          # a torn last row
  assert steps_of(workdir)[-1] == 25
  os.remove(filler)
  done = run_main(cmd, env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'resuming at step 25' in done.stdout and 'ended in a torn row' in done.stdout
  with open(os.path.join(workdir, runs_lib.METRICS_FILE), 'rb') as f:
    lines = f.read().split(b'\n')
  assert lines[-1] == b''
  parsed = [json.loads(line) for line in lines[:-1]]    # every line parses
  assert all(set(r) >= {'step', 'split'} for r in parsed)
  assert sorted(rows(workdir)) == list(range(1, 101))


# Nothing saved while spiking (issue 24) ---------------------------------------------------------

HOT = {'train.learning_rate': 10, 'train.steps': 40, 'train.checkpoint_every': 5,
       'train.eval_every': 40}


def test_a_run_that_ends_spiking_saves_nothing_at_the_last_step(reference, tmp_path, capsys):
  """lr 10 from scratch: spikes from the first steps on (above 1.5 x ln(vocab)). The last step is
  not calm: not saved either (it was, with `calm or last`), and the output says so."""
  del reference  # the compilation cache
  workdir = str(tmp_path / 'run')
  loop.run(config(**HOT), workdir)
  out = capsys.readouterr().out
  spikes = [e['step'] for e in events(workdir) if e['split'] == 'spike']
  assert spikes and spikes[-1] == 40, spikes
  saved = steps_of(workdir)
  assert all(s < spikes[0] for s in saved), (saved, spikes[0])   # only steps before the spikes
  line = next(l for l in out.splitlines() if l.startswith('step 40: not saved'))
  assert 'the loss is not calm' in line and (
      f'last calm checkpoint, step {saved[-1]}' if saved else 'no checkpoint was saved') in line
  print(line)


def test_resuming_into_spikes_keeps_the_good_checkpoint_best(reference, tmp_path, capsys):
  """The reference resumed at lr 10 for 10 more steps: it spikes from step ~32. Before: the last
  step (40) was saved at the level of the good steps (spike steps do not move the level), ranked
  best and rotated 10 out. Now nothing is saved; 30 stays best and bitwise the reference's."""
  workdir = copy_run(reference.workdir, tmp_path)
  loop.run(config(**HOT), workdir)
  out = capsys.readouterr().out
  assert [e['step'] for e in events(workdir) if e['split'] == 'spike'][-1] == 40
  assert 'step 40: not saved: the loss is not calm' in out, out
  assert 'last calm checkpoint, step 30' in out, out
  assert steps_of(workdir) == [10, 20, 30]
  ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    assert ckpt.best_step() == 30
  finally:
    ckpt.close()
  assert_bitwise(params_of(workdir), reference.params)


# One trainer per run directory (issue 24) -------------------------------------------------------

from gated_attention.runs import lock as lock_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def _write_lock(workdir, **holder):
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, lock_lib.LOCK_FILE)
  with open(path + '.tmp', 'w') as f:
    json.dump(holder, f)
  os.replace(path + '.tmp', path)


def test_a_second_trainer_is_refused_then_a_killed_one_never_blocks(env, reference, tmp_path):
  """Real: main.py trains (the reference resumed for many more steps); a second main.py on the
  same workdir is refused, one paragraph naming the holder; after a kill -9 of the holder, the
  same command runs (the lock names a dead pid on this host: taken over with a warning)."""
  workdir = copy_run(reference.workdir, tmp_path)
  long = main_cmd(workdir, **{'train.steps': 100000, 'train.eval_every': 100000})
  with open(tmp_path / 'log', 'w') as out:
    first = subprocess.Popen(long, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
      ready, deadline = _logged(workdir, STEPS + 1), time.time() + 300
      while not ready():
        assert first.poll() is None and time.time() < deadline, (tmp_path / 'log').read_text()
        time.sleep(0.01)
      with open(os.path.join(workdir, lock_lib.LOCK_FILE)) as f:
        holder = json.load(f)
      assert holder['pid'] == first.pid and holder['host'] == lock_lib.socket.gethostname()
      before = rows(workdir)
      second = run_main(main_cmd(workdir), env)
      assert second.returncode == 1, (second.stdout, second.stderr)
      one_paragraph(second.stderr)
      message = ' '.join(second.stderr.split())
      assert (f'is in use by another trainer (host {holder["host"]}, pid {first.pid}, started '
              in message), message
      assert set(rows(workdir)) >= set(before)      # the second one wrote no metrics rows
      first.send_signal(signal.SIGKILL)
      first.wait()
    finally:
      first.kill()
      first.wait()
  third = run_main(main_cmd(workdir), env)          # steps=30: nothing left to train
  assert third.returncode == 0, third.stderr
  assert (f'Warning: taking over the lock of {workdir} from a trainer that is gone (host '
          f'{holder["host"]}, pid {first.pid}') in third.stdout and (
              f'process {first.pid} is not running') in third.stdout, third.stdout
  assert not os.path.exists(os.path.join(workdir, lock_lib.LOCK_FILE))   # released at the end


def test_lock_staleness_live_dead_reused_pid_and_other_hosts(tmp_path):
  """Simulated holders (the lock file written by hand): a live process on this host holds;
  a dead pid, a reused pid (another start time) and an old heartbeat of another host do not. A
  pid of another PID namespace on this host (a container) is not looked up: its heartbeat
  decides."""
  host, now = lock_lib.socket.gethostname(), time.time()
  # this machine's boot and PID namespace: its pids are ours to look up (issue 50)
  here = dict(host=host, boot_id=lock_lib._boot_id(), pid_ns=lock_lib._pid_namespace())
  sleeper = subprocess.Popen(['sleep', '60'])
  try:
    cases = {
        'live': (dict(here, pid=sleeper.pid, started=now, heartbeat=now - 1e4,
                      process_start=lock_lib._process_start(sleeper.pid)), None),
        'dead': (dict(here, pid=2**22 + 7, started=now, heartbeat=now), 'is not running'),
        'reused': (dict(here, pid=sleeper.pid, started=now, heartbeat=now,
                        process_start='1'), 'is now another process'),
        'dead_in_another_namespace': (dict(here, pid=2**22 + 7, started=now, heartbeat=now,
                                           pid_ns='pid:[1]'), None),
        'other_host_fresh': (dict(host='gone-node', pid=1, started=now, heartbeat=now - 10),
                             None),
        'other_host_lost': (dict(host='gone-node', pid=1, started=now - 2000,
                                 heartbeat=now - 1000), 'its heartbeat is 1000 s old'),
    }
    for name, (holder, why) in cases.items():
      workdir = str(tmp_path / name)
      _write_lock(workdir, **holder)
      lock, said = lock_lib.RunLock(workdir), []
      if why is None:
        with pytest.raises(ckpt_lib.CheckpointError, match='is in use by another trainer') as e:
          lock.acquire(warn=said.append)
        assert f'pid {holder["pid"]}' in str(e.value) and '\n' not in str(e.value)
        assert lock.read() == holder                # untouched
      else:
        lock.acquire(warn=said.append)
        assert len(said) == 1 and why in said[0], (name, said)
        assert lock.read()['pid'] == os.getpid()
        lock.release()
        assert os.listdir(workdir) == []
  finally:
    sleeper.kill()
    sleeper.wait()


def test_lock_heartbeat_and_a_lost_lock(tmp_path):
  lock = lock_lib.RunLock(str(tmp_path / 'run'), heartbeat_s=0.05)
  lock.acquire()
  first = lock.read()['heartbeat']
  time.sleep(0.5)
  assert lock.read()['heartbeat'] > first           # the background thread refreshes it
  lock.check()
  _write_lock(lock.workdir, host='elsewhere', pid=5, started=time.time(),
              heartbeat=time.time())                # taken over: this holder was thought lost
  time.sleep(0.3)
  assert 'now names host elsewhere, pid 5' in lock.lost
  with pytest.raises(ckpt_lib.CheckpointError, match='lost the lock'):
    lock.check()
  lock.release()
  assert lock.read()['host'] == 'elsewhere'         # not ours: left in place


def test_readers_do_not_take_the_lock(reference, tmp_path):
  """A run held by a live trainer opens for evaluation (load.py), and the lock stays as it was."""
  workdir = copy_run(reference.workdir, tmp_path)
  holder = dict(host=lock_lib.socket.gethostname(), pid=os.getpid(), started=time.time(),
                heartbeat=time.time(), process_start=lock_lib._process_start(os.getpid()))
  _write_lock(workdir, **holder)
  assert_bitwise(params_of(workdir), reference.params)
  assert lock_lib.RunLock(workdir).read() == holder


# Parameters-only restores verify too, read-only (issue 24) ---------------------------------------

def _every_data_file(how):
  """`how` applied to every data file of the step (one file may hold only optimizer state,
  which a parameters-only restore does not read)."""
  def damage(step_dir, _):
    for d, _, fs in os.walk(os.path.join(step_dir, 'state')):
      for f in fs:
        path = os.path.join(d, f)
        if os.sep + 'd' + os.sep in path and os.path.getsize(path) > 64:
          how(path)
  return damage


def _flip_file(path):
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    old = f.read(4)
    f.seek(-4, os.SEEK_CUR)
    f.write(bytes(b ^ 0x5A for b in old))


READ_ONLY_DAMAGE = {
    'flipped_bytes': _every_data_file(_flip_file),
    'truncated_files': _every_data_file(lambda p: os.truncate(p, os.path.getsize(p) // 2)),
    'empty_step_dir': _empty, 'wrong_checksum': _wrong_checksums}


@pytest.mark.parametrize('damage', READ_ONLY_DAMAGE)
def test_parameters_only_restore_verifies_and_changes_nothing(reference, tmp_path, capsys,
                                                              damage):
  """load_run (analysis, sampling, long-context): the latest that verifies, a warning naming
  what was wrong, nothing renamed; the damaged step asked for by number: one paragraph."""
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  READ_ONLY_DAMAGE[damage](os.path.join(ckpts, '30'), os.path.join(ckpts, '20'))
  reason = (DAMAGE['truncated_file' if damage == 'truncated_files' else damage][1]
            + '|damaged or incomplete')
  before = _files(ckpts)
  run = runs_lib.load_run(workdir)
  out = capsys.readouterr().out
  assert run.step == 20
  assert_bitwise(jax.device_get(run.params), params_of(reference.workdir, 20))
  warning = next(l for l in out.splitlines() if l.startswith('Warning: checkpoint 30'))
  assert re.search(reason, warning) and 'the run directory is left as it is' in warning, warning
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    runs_lib.load_run(workdir, 30)
  message = str(e.value)
  print(f'{warning}\n{message}')
  assert message.startswith(f'Checkpoint 30 in {ckpts} is unusable (') and '\n' not in message
  assert len(message) < 700 and 'Other checkpoints: [10, 20]' in message, message
  assert _files(ckpts) == before                    # read-only: nothing set aside or changed


def test_deleted_checkpoint_metadata_is_unverified_not_silent(reference, tmp_path, capsys):
  """checkpoints/30/_CHECKPOINT_METADATA deleted: the checksums are gone; the restore says the
  checkpoint is unverified (training and load_run) and still checks the values are finite."""
  workdir = copy_run(reference.workdir, tmp_path)
  os.remove(os.path.join(workdir, 'checkpoints', '30', '_CHECKPOINT_METADATA'))
  assert steps_of(workdir) == [10, 20, 30]
  run = runs_lib.load_run(workdir)
  out = capsys.readouterr().out
  assert run.step == 30
  assert_bitwise(jax.device_get(run.params), reference.params)
  assert ('Warning: checkpoint 30 in ' in out and 'is unverified: its _CHECKPOINT_METADATA is '
          'missing' in out), out
  loop.run(config(), workdir)                       # training's restore says so too
  out = capsys.readouterr().out
  assert 'is unverified: its _CHECKPOINT_METADATA is missing' in out, out


def test_disk_check_waits_for_the_save_in_flight(tmp_path, monkeypatch):
  """A save issued while the previous one is still being written (a fast loop): the disk check
  measures that previous checkpoint, not nothing, and names it as the step to resume from."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  params = {'w': jnp.arange(4096.0), 'b': jnp.ones(8)}
  ckpt = ckpt_lib.Checkpointer(str(tmp_path / 'run'))
  try:
    ckpt.save_params(1, params)                     # asynchronous: returns while writing
    usage = shutil.disk_usage(str(tmp_path))
    monkeypatch.setattr(ckpt_lib, 'shutil', types.SimpleNamespace(
        disk_usage=lambda _: usage._replace(free=1 << 10)))
    with pytest.raises(ckpt_lib.CheckpointError, match=r'it resumes from step 1\.'):
      ckpt.save_params(2, params)
    assert ckpt.all_steps() == [1]
  finally:
    monkeypatch.undo()
    ckpt.close()


def test_nonfinite_values_are_caught_without_checksums(tmp_path, monkeypatch):
  """A checkpoint holding a NaN (written with the save's own check bypassed) and no metadata:
  the parameters-only restore refuses it."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  params = {'w': jnp.array([1.0, jnp.nan, 3.0]), 'b': jnp.zeros(2)}
  ckpt = ckpt_lib.Checkpointer(str(tmp_path / 'run'))
  with monkeypatch.context() as m:
    m.setattr(ckpt_lib, 'integrity', lambda t: ({}, []))
    ckpt.save_params(1, params)
  ckpt.close()
  os.remove(str(tmp_path / 'run' / 'checkpoints' / '1' / '_CHECKPOINT_METADATA'))
  said = []
  reader = ckpt_lib.Checkpointer(str(tmp_path / 'run'), read_only=True)
  try:
    with pytest.raises(ckpt_lib.CheckpointError, match=r"non-finite values in \[\"\['params'\]"):
      reader.restore_params(1, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                            params), warn=said.append)
  finally:
    reader.close()


# One paragraph, not a traceback (issue 24) ------------------------------------------------------

@pytest.mark.parametrize('flags, message', [
    pytest.param(['--config={bad_config}', '--mode=params'],
                 'does not parse: invalid syntax at line 1: def get_config(:', id='config_syntax'),
    pytest.param(['--mode=compile', '--topology=nonsense:9x9'],
                 "unknown TPU generation 'nonsense'", id='topology_unknown'),
    pytest.param(['--mode=compile', '--topology=v5p:0x0'],
                 "the chip grid '0x0' is not positive integers", id='topology_0x0'),
    pytest.param(['--mode=compile'], '--mode=compile needs --topology', id='no_topology'),
    pytest.param(['--workdir={bad_config}.d', '--seeds=1,1'], '--seeds=1,1: give one or more '
                 'distinct integer seeds', id='seeds_repeated'),
    pytest.param(['--workdir={bad_config}.d', '--seeds=a,2'], '--seeds=a,2: give integer seeds',
                 id='seeds_not_integers'),
])
def test_command_line_errors_are_one_paragraph(tmp_path, env, flags, message):
  bad = tmp_path / 'bad_config.py'
  bad.write_text('def get_config(:\n  pass\n')
  done = run_main([sys.executable, 'main.py'] + [f.format(bad_config=bad) for f in flags], env,
                  timeout=120)
  assert done.returncode == 1, (done.stdout, done.stderr)
  one_paragraph(done.stderr)
  assert message in ' '.join(done.stderr.split()), done.stderr
  assert len(done.stderr.splitlines()) <= 6, done.stderr


def test_unreadable_checkpoints_directory_is_one_paragraph(reference, tmp_path, monkeypatch):
  """Root reads any directory whatever its mode, so the denial is simulated: os.listdir and
  os.scandir (what etils' listing under orbax calls) raise PermissionError for paths under this
  run's checkpoints/, as they do for a user without the read permission."""
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  for name in ('listdir', 'scandir'):
    real = getattr(os, name)
    def denied(path='.', *a, _real=real, **k):
      if os.fspath(path).startswith(ckpts):
        raise PermissionError(errno.EACCES, 'Permission denied', os.fspath(path))
      return _real(path, *a, **k)
    monkeypatch.setattr(os, name, denied)
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    loop.run(config(), workdir)
  message = str(e.value)
  assert message.startswith(f'Cannot read the checkpoints directory {ckpts}: PermissionError: '
                            'Permission denied') and '\n' not in message, message
  monkeypatch.undo()
  assert not os.path.exists(os.path.join(workdir, lock_lib.LOCK_FILE))   # released


def test_tensorboard_writer_failure_is_one_note_not_tracebacks(tmp_path, capfd):
  """tensorboardX's writer thread and its close fail with ENOSPC (simulated: its events writer
  raises): one note, metrics.jsonl keeps every row, no traceback from the thread or the exit
  hook (tensorboardX's atexit cleanup calls the event writer's close: called here)."""
  from gated_attention.training import reporting  # pylint: disable=g-import-not-at-top
  writer = reporting.MetricsWriter(str(tmp_path / 'run'))
  events_file = writer.tb_events

  def full(*_):
    raise OSError(errno.ENOSPC, 'No space left on device')
  events_file._ev_writer.write_event = full
  events_file._ev_writer.flush = full
  for step in range(1, 30):
    writer.write(step, 'train', {'loss': 1.0 / step})
    time.sleep(0.01)
  writer.close()
  events_file.close()                               # tensorboardX's exit hook
  out, err = capfd.readouterr()
  assert 'Traceback' not in err and 'Exception in thread' not in err, err
  assert out.count('Note: TensorBoard events are off for the rest of this run') == 1, out
  assert sorted(rows(str(tmp_path / 'run'))) == list(range(1, 30))


# Small ones (issue 24) --------------------------------------------------------------------------

@pytest.mark.parametrize('flags, message', [
    pytest.param(['--config.train.log_every=0'], 'config.train.log_every=0 must be positive',
                 id='bad_setting'),
    pytest.param(['--config.data.source=text', '--config.data.path=/nonexistent/*.txt'],
                 'data.path', id='missing_data'),
])
def test_a_failed_command_leaves_no_new_workdir(tmp_path, env, flags, message):
  """A training command that fails before writing anything does not leave the --workdir it
  created behind (it held logs/: main.py sends the libraries' logs there first)."""
  workdir = str(tmp_path / 'new' / 'run')
  done = run_main([sys.executable, 'main.py', f'--workdir={workdir}'] + flags, env, timeout=120)
  assert done.returncode == 1, (done.stdout, done.stderr)
  one_paragraph(done.stderr)
  assert message in ' '.join(done.stderr.split()), done.stderr
  assert not os.path.exists(workdir), os.listdir(workdir)


def test_a_truncated_checkpoints_warning_has_no_pybind_repr(reference, tmp_path, capsys):
  workdir = copy_run(reference.workdir, tmp_path)
  _every_data_file(lambda p: os.truncate(p, os.path.getsize(p) // 2))(
      os.path.join(workdir, 'checkpoints', '30'), None)
  loop.run(config(), workdir)
  warning = next(l for l in capsys.readouterr().out.splitlines()
                 if l.startswith('Warning: checkpoint 30'))
  assert 'bound method' not in warning and 'pybind11' not in warning, warning
  assert 'See full TensorStore details' not in warning, warning


def test_data_file_messages_name_the_problem(tmp_path):
  from gated_attention import input_pipeline  # pylint: disable=g-import-not-at-top
  from gated_attention.input_pipeline import sources  # pylint: disable=g-import-not-at-top
  latin = tmp_path / 'latin1.txt'
  latin.write_bytes('caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, '.encode('latin-1') * 50)
  numbers = tmp_path / 'numbers.jsonl'
  numbers.write_text('{"text": 17}\n{"text": 18}\n')
  data = config().data
  for source, path, want in (('text', latin, "as UTF-8 text ('utf-8' codec can't decode"),
                             ('jsonl', numbers, "field 'text' holds a JSON number (17), not a "
                                                'string')):
    cfg = data.copy_and_resolve_references()
    cfg.source, cfg.path = source, str(path)
    with pytest.raises(sources.DataError) as e:
      input_pipeline.sources.load_documents(cfg)
    assert want in str(e.value) and 'only 1 document' not in str(e.value), str(e.value)


# A save interrupted mid-write (issue 24) --------------------------------------------------------

def test_sigterm_mid_save_finishes_the_save_and_resumes_bitwise(env, reference, tmp_path):
  """Real: SIGTERM (a preemption notice) while checkpoint 20 is written: the loop stops at the
  next step, waits for the save, saves the step it reached (calm) and exits 0; the same command
  resumes and ends bitwise."""
  workdir = str(tmp_path / 'run')
  cmd = main_cmd(workdir)
  with open(tmp_path / 'log', 'w') as out:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
      saving, deadline = _saving(workdir, 20), time.time() + 300
      while not saving():
        assert proc.poll() is None and time.time() < deadline, (tmp_path / 'log').read_text()
        time.sleep(0.002)
      proc.send_signal(signal.SIGTERM)
      proc.wait(timeout=120)
    finally:
      proc.kill()
      proc.wait()
  log = (tmp_path / 'log').read_text()
  assert proc.returncode == 0, log
  assert 'Interrupted (signal 15) at step' in log, log
  saved = steps_of(workdir)
  assert saved[:2] == [10, 20] and max(rows(workdir)) < STEPS, (saved, log)
  done = run_main(cmd, env)
  assert done.returncode == 0, done.stderr
  assert f'resuming at step {saved[-1]}' in done.stdout
  assert_like_reference(workdir, reference)


def test_a_partially_written_save_is_ignored_and_the_one_before_resumes(reference, tmp_path,
                                                                        capsys):
  """Simulated: the save of 30 was cut off mid-write (a kill, a preemption past its grace
  period): orbax's temporary directory holds part of its files and was never committed. The run
  resumes from 20 with no warning and ends bitwise."""
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  tmp = os.path.join(ckpts, '30.orbax-checkpoint-tmp-1733100000000000')
  os.rename(os.path.join(ckpts, '30'), tmp)
  os.remove(os.path.join(tmp, '_CHECKPOINT_METADATA'))      # orbax writes it at the commit
  for f in sorted(_files(os.path.join(tmp, 'state')))[::2]:  # and half the state's files
    os.remove(os.path.join(tmp, 'state', f[0]))
  assert steps_of(workdir) == [10, 20]
  loop.run(config(), workdir)
  out = capsys.readouterr().out
  assert 'resuming at step 20' in out and 'unusable' not in out, out
  assert_like_reference(workdir, reference)


def test_analyze_and_export_fall_back_from_a_bad_latest_checkpoint(reference, tmp_path, capsys):
  """--mode=analyze and --mode=export without a step: the newest checkpoint that verifies (a
  warning for the damaged 30), nothing in the run directory's checkpoints changed."""
  from gated_attention.modes import analyze  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  workdir = copy_run(reference.workdir, tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  _wrong_checksums(os.path.join(ckpts, '30'), None)
  before = _files(ckpts)
  analyze.run(workdir, config=config(), out_dir=str(tmp_path / 'analysis'))
  with open(tmp_path / 'analysis' / 'report.json') as f:
    assert json.load(f)['step'] == 20
  exported = interop.export_run(workdir, str(tmp_path / 'hf'))
  assert exported['step'] == 20
  out = capsys.readouterr().out
  assert out.count('Warning: checkpoint 30 in') == 2 and 'checksum mismatch' in out, out
  assert _files(ckpts) == before


# A reader of a run that is training (issue 57) ---------------------------------------------------

def _tiny(n):
  rng = np.random.default_rng(n)
  return {'w': rng.standard_normal((64, 32)).astype(np.float32), 'b': np.full(4, float(n))}


def test_a_reader_goes_on_past_the_checkpoint_a_trainer_removes_under_it(tmp_path, monkeypatch,
                                                                         capsys):
  """The trainer's rotation, simulated at the worst moment: as the reader starts reading the
  newest checkpoint (2), the trainer saves 3 and removes 2. Before: 2 failed ("... is the saved
  config.json the one it was trained with?"), 1 was "empty or partial", and the reader gave up
  with "No usable checkpoint". Now: one note that 2 was removed while it was read, and the
  newest (3) read and verified; a step asked for by number that goes the same way says so."""
  workdir = str(tmp_path / 'run')
  trainer = ckpt_lib.Checkpointer(workdir, every=1, keep=2)
  for step in (1, 2):
    trainer.save_params(step, _tiny(step))
  trainer.wait()
  reader = ckpt_lib.Checkpointer(workdir, read_only=True)
  read = ckpt_lib.Checkpointer._read_params
  rotated = []

  def rotating(self, step, abstract):
    if not rotated:                       # the trainer, while this read begins
      rotated.append(step)
      trainer.save_params(step + 1, _tiny(step + 1))
      trainer.wait()
      shutil.rmtree(os.path.join(workdir, 'checkpoints', str(step)))
    return read(self, step, abstract)
  monkeypatch.setattr(ckpt_lib.Checkpointer, '_read_params', rotating)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _tiny(0))
  step, params = reader.restore_latest_params(abstract)
  out = capsys.readouterr().out
  assert rotated == [2] and step == 3, (rotated, step, out)
  assert_bitwise(jax.device_get(params), _tiny(3))
  assert 'Note: checkpoint 2 was removed while it was read: the run is training' in out, out
  assert 'Warning' not in out and 'config.json' not in out, out
  rotated.clear()                          # by number: 3 goes while it is read
  with pytest.raises(runs_lib.CheckpointError, match=r'Checkpoint 3 in .* was removed while it '
                     r'was read: the run is training .*The checkpoints there now: \[1, 4\]'):
    reader.restore_params(3, abstract)
  reader.close()
  trainer.close()


def test_an_older_checkpoint_removed_as_the_reader_opens_is_no_damage(tmp_path, monkeypatch,
                                                                      capsys):
  """The trainer removes an older checkpoint (1) just as the reader opens the newest (3): orbax's
  reader lists every step as it opens and meets 1's folder gone. Before: "Warning: checkpoint 3
  ... is unusable ([Errno 2] No such file or directory: '.../checkpoints/1')" and checkpoint 2
  read instead (seen on a loaded machine by test_a_reader_of_a_run_that_is_training); now the
  listing is taken again and 3 is read, with no warning, whether newest or asked for by number."""
  workdir = str(tmp_path / 'run')
  trainer = ckpt_lib.Checkpointer(workdir, every=1, keep=3)
  for step in (1, 2, 3):
    trainer.save_params(step, _tiny(step))
  trainer.wait()
  reader = ckpt_lib.Checkpointer(workdir, read_only=True)
  real, removed = ckpt_lib.ocp.CheckpointManager, []

  def rotating(directory, *args, **kwargs):
    if not removed:                        # the trainer's rotation, mid-listing
      folder = os.path.join(workdir, 'checkpoints')
      gone = os.path.join(folder, str(min(int(n) for n in os.listdir(folder) if n.isdigit())))
      removed.append(gone)
      shutil.rmtree(gone)
      raise FileNotFoundError(errno.ENOENT, 'No such file or directory', gone)
    return real(directory, *args, **kwargs)
  monkeypatch.setattr(ckpt_lib.ocp, 'CheckpointManager', rotating)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _tiny(0))
  step, params = reader.restore_latest_params(abstract)
  out = capsys.readouterr().out
  assert removed and step == 3, (removed, step, out)
  assert_bitwise(jax.device_get(params), _tiny(3))
  assert 'Warning' not in out and 'unusable' not in out, out
  removed.clear()                          # by number: 2 goes as 3 is opened
  assert_bitwise(jax.device_get(reader.restore_params(3, abstract)), _tiny(3))
  assert removed and 'Warning' not in capsys.readouterr().out
  reader.close()
  trainer.close()


@pytest.mark.slow   # a real trainer and reads of it (~30 s)
def test_a_reader_of_a_run_that_is_training(env, reference, tmp_path, monkeypatch, capsys):
  """Issue 57's case for real: main.py trains with a checkpoint every 2 steps, 2 kept; the
  notebook's loader (load_run: analyze, sample, export, long_context read the same way) reads
  it, its first read held until the trainer has rotated that checkpoint away under it. Each read ends with the newest checkpoint's verified parameters, a note where one
  was removed mid-read, never a warning that blames the files or the config."""
  del reference   # the compilation cache
  workdir = str(tmp_path / 'run')
  cmd = main_cmd(workdir, **{'train.steps': 100000, 'train.checkpoint_every': 2,
                             'train.keep_checkpoints': 2, 'train.log_every': 50,
                             'train.eval_every': 100000})
  with open(tmp_path / 'out', 'w') as out:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 300
    while len(steps_of(workdir) if os.path.isdir(os.path.join(workdir, 'checkpoints'))
               else []) < 2:
      assert proc.poll() is None and time.time() < deadline, (tmp_path / 'out').read_text()
      time.sleep(0.1)
    read = ckpt_lib.Checkpointer._read_params
    held = []

    def slow_first(self, step, abstract):
      if not held:   # held until the trainer has rotated it away (a fixed 1 s was too short
        held.append(step)   # for a loaded machine: no note, and the test failed)
        gone, until = os.path.join(workdir, 'checkpoints', str(step)), time.time() + 120
        while os.path.isdir(gone) and time.time() < until:
          time.sleep(0.05)
      return read(self, step, abstract)
    monkeypatch.setattr(ckpt_lib.Checkpointer, '_read_params', slow_first)
    steps = []
    for _ in range(5):
      run = runs_lib.load_run(workdir)
      steps.append(run.step)
      assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(run.params))
  finally:
    proc.kill()
    proc.wait()
  out = capsys.readouterr().out
  print(f'read steps {steps}; first held at {held}: {out[-1500:]}')
  assert f'Note: checkpoint {held[0]} was removed while it was read' in out, out
  assert steps[0] > held[0] and steps == sorted(steps), steps
  assert 'Warning' not in out and 'config.json' not in out, out
