"""Local temporary folders (gated_attention/storage/scratch.py): a kill -9 left a gs:// run's
TensorBoard and log folders in /tmp for good (issue 50); the next command of the kind removes
those whose process is gone, never a live process's. Each test points TMPDIR at a folder of its
own."""

import os
import signal
import subprocess
import sys
import time

import pytest

from gated_attention.storage import scratch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWNER = """
import sys, time
from gated_attention.storage import scratch
print(scratch.make(sys.argv[1]), flush=True)
time.sleep(600)
"""


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
  """TMPDIR for this process (tempfile reads it once: its cache is reset) and its children."""
  import tempfile  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'tmp'
  root.mkdir()
  monkeypatch.setenv('TMPDIR', str(root))
  monkeypatch.setattr(tempfile, 'tempdir', None)
  yield root
  tempfile.tempdir = None


def _owner(prefix):
  proc = subprocess.Popen([sys.executable, '-c', _OWNER, prefix], cwd=REPO,
                          env={**os.environ, 'PYTHONPATH': REPO}, stdout=subprocess.PIPE,
                          text=True)
  return proc, proc.stdout.readline().strip()


def test_a_dead_process_folders_are_removed_a_live_one_is_kept(tmpdir_env):
  prefix = 'gated_attention_tensorboard_'
  dead, dead_dir = _owner(prefix)
  live, live_dir = _owner(prefix)
  try:
    for d in (dead_dir, live_dir):
      with open(os.path.join(d, 'events.out.tfevents'), 'wb') as f:
        f.write(b'x' * 100)
    older = tmpdir_env / f'{prefix}older'          # made by code without owner files
    older.mkdir()
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    other = scratch.make('gated_attention_logs_')  # another kind: not swept by it
    assert os.path.isdir(dead_dir)
    mine = scratch.make(prefix)
    assert not os.path.exists(dead_dir)             # its process is gone
    assert os.path.isdir(live_dir) and os.path.isdir(older) and os.path.isdir(other)
    assert scratch.files(mine) == [] and scratch.files(live_dir) == ['events.out.tfevents']
    scratch.remove(mine)
    scratch.remove(other)
    assert not os.path.exists(mine) and not os.path.exists(other)
  finally:
    for p in (dead, live):
      p.kill()
      p.wait()
  assert scratch.sweep(prefix) == [live_dir]        # dead now too


def test_a_folder_being_made_is_not_taken_for_a_dead_one(tmpdir_env):
  """Between creating its owner file and locking it, a folder looks unowned: an empty owner
  file is left alone."""
  prefix = 'gated_attention_logs_'
  making = tmpdir_env / f'{prefix}making'
  making.mkdir()
  (making / '.owner').write_bytes(b'')
  assert scratch.sweep(prefix) == [] and making.is_dir()


@pytest.mark.slow   # ~20 s: a trainer on gs://, killed, and the next command
def test_a_killed_gcs_trainer_leaves_no_temporary_folders_after_the_next_command(
    tmpdir_env, gcs, tmp_path):
  """kill -9 of a gs:// trainer leaves its TensorBoard and log folders (nothing else can
  remove them); the next trainer's start removes them, and its own are gone at its end."""
  from tests.test_faults import kill_when, main_cmd  # pylint: disable=g-import-not-at-top
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'TMPDIR': str(tmpdir_env)}
  workdir = gcs.url('runs/killed')

  def logged_a_step():
    return any(n.startswith('gated_attention_tensorboard_') for n in os.listdir(tmpdir_env))
  logged_a_step.what = 'its TensorBoard folder exists'
  kill_when(main_cmd(workdir), env, logged_a_step, str(tmp_path / 'log'))
  left = sorted(n for n in os.listdir(tmpdir_env) if n.startswith('gated_attention_'))
  kinds = ('gated_attention_tensorboard_', 'gated_attention_logs_')   # mkdtemp's suffix may hold '_'
  assert sorted(k for n in left for k in kinds if n.startswith(k)) == sorted(kinds), left
  assert len(left) == 2, left
  start = time.time()
  done = subprocess.run(main_cmd(workdir, **{'train.steps': 2}), cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert [n for n in os.listdir(tmpdir_env) if n.startswith('gated_attention_')] == [], (
      os.listdir(tmpdir_env), time.time() - start)
