"""The goodput account: analysis/goodput.py (the summary) and training/goodput.py (the laps and
the session files), against independent references; a killed and resumed main.py run (slow)."""

import json
import os
import random
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention.analysis import compare as compare_lib
from gated_attention.analysis import goodput as goodput_lib
from gated_attention.runs import rundir
from gated_attention.training import goodput

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reference_lost(spans):
  """Per session: how many of its steps a later session trains again (step by step)."""
  out = []
  for j, (a, b) in enumerate(spans):
    again = set()
    for a2, b2 in spans[j + 1:]:
      again.update(range(a2 + 1, b2 + 1))
    out.append(len(set(range(a + 1, b + 1)) & again))
  return out


def _random_sessions(rng, n):
  sessions, step = [], 0
  for k in range(n):
    start = rng.randint(0, step) if k else 0        # resumes from a checkpoint at or before
    end = start + rng.randint(0, 40)
    seconds = {c: rng.uniform(0, 30) for c in goodput_lib.CAUSES}
    sessions.append({'session': k + 1, 'start_step': start, 'step': end,
                     'seconds': seconds, 'wall_s': sum(seconds.values()) + rng.uniform(0, 2)})
    step = end
  return sessions


@pytest.mark.parametrize('seed', range(6))
def test_summary_against_a_step_by_step_reference(seed):
  rng = random.Random(seed)
  sessions = _random_sessions(rng, rng.randint(1, 6))
  account = goodput_lib.summarize(sessions)
  spans = [(s['start_step'], s['step']) for s in sessions]
  lost = _reference_lost(spans)
  assert [r['lost_steps'] for r in account['sessions']] == lost
  lost_s = sum(n * s['seconds']['steps'] / (s['step'] - s['start_step'])
               for n, s in zip(lost, sessions) if n)
  wall = sum(s['wall_s'] for s in sessions)
  steps = sum(s['seconds']['steps'] for s in sessions)
  np.testing.assert_allclose(account['lost_s'], lost_s, rtol=1e-12)
  np.testing.assert_allclose(account['goodput'], (steps - lost_s) / wall, rtol=1e-12)
  for c in goodput_lib.CAUSES:
    np.testing.assert_allclose(account['seconds'][c], sum(s['seconds'][c] for s in sessions))
  cols = goodput_lib.columns(account)
  np.testing.assert_allclose(cols['lost_frac'], lost_s / wall)
  np.testing.assert_allclose(cols['wall_h'], wall / 3600)


def test_a_kill_between_checkpoints_and_a_resume():
  """Killed at step 17 after checkpoint 10, resumed from 10, killed again at 12 with nothing
  saved, resumed from 10 to the end: 7 + 2 steps lost."""
  sec = lambda steps: {**dict.fromkeys(goodput_lib.CAUSES, 1.0), 'steps': steps}
  sessions = [{'start_step': 0, 'step': 17, 'seconds': sec(17.0), 'wall_s': 30.0},
              {'start_step': 10, 'step': 12, 'seconds': sec(4.0), 'wall_s': 12.0},
              {'start_step': 10, 'step': 30, 'seconds': sec(20.0), 'wall_s': 40.0}]
  account = goodput_lib.summarize(sessions)
  assert [r['lost_steps'] for r in account['sessions']] == [7, 2, 0]
  assert account['lost_s'] == pytest.approx(7 * 1.0 + 2 * 2.0)
  assert account['goodput'] == pytest.approx((41.0 - 11.0) / 82.0)
  text = goodput_lib.describe(account)
  assert 'Goodput 36.6%' in text and '9 steps' in text and 'lost to restarts' in text


def test_laps_partition_the_wall_time_and_take_compilation_out():
  account = goodput.Account()
  account.lap('startup')
  before = dict(account.seconds)
  t0, c0 = time.perf_counter(), goodput.compile_seconds()
  shape = (int(np.random.default_rng().integers(50, 90)), 7)    # a program never compiled yet
  f = jax.jit(lambda x: jnp.tanh(x) @ x.T + x.sum())
  f(jnp.asarray(np.random.default_rng(1).normal(size=shape), jnp.float32)).block_until_ready()
  time.sleep(0.05)
  account.lap('eval')
  spent, compiled = time.perf_counter() - t0, goodput.compile_seconds() - c0
  assert compiled > 0
  assert account.seconds['compile'] - before['compile'] == pytest.approx(compiled)
  assert account.seconds['eval'] == pytest.approx(spent - compiled, abs=2e-3)
  assert account.seconds['eval'] >= 0.05 - 1e-3
  assert sum(account.seconds.values()) == pytest.approx(account.wall, rel=1e-9)


@pytest.mark.parametrize('where', ['local', 'gcs'])
def test_sessions_are_written_numbered_and_read_back(where, tmp_path, request):
  if where == 'gcs':
    workdir = request.getfixturevalue('gcs').url('runs/account')
  else:
    workdir = str(tmp_path / 'run')
    os.makedirs(workdir)
  for k, (start, end) in enumerate([(0, 7), (5, 9)]):
    account = goodput.Account()
    account.begin(workdir, start, every_s=0.0)
    account.lap('steps')
    account.publish(end)
    record = account.finish(end, 'interrupted' if k == 0 else 'finished')
    assert record['session'] == k + 1 and record['step'] == end
  if where == 'local':     # an odd object under a session's name is skipped with a warning
    os.makedirs(os.path.join(workdir, 'goodput', 'session-00003.json'))
  sessions = rundir.read_goodput(workdir)
  assert [(s['session'], s['start_step'], s['step'], s['state']) for s in sessions] == [
      (1, 0, 7, 'interrupted'), (2, 5, 9, 'finished')]
  for s in sessions:
    assert sum(s['seconds'].values()) == pytest.approx(s['wall_s'], rel=1e-9)
  assert goodput_lib.summarize(sessions)['lost_steps'] == 2


def test_compare_shows_the_goodput_columns():
  sec = dict.fromkeys(goodput_lib.CAUSES, 0.0) | {'steps': 30.0, 'compile': 10.0}
  sessions = [{'start_step': 0, 'step': 10, 'seconds': sec, 'wall_s': 40.0}]
  with_account = compare_lib.run_summary('/r/a', 'baseline', [], None, sessions)
  without = compare_lib.run_summary('/r/b', 'g1', [], None, None)
  table = compare_lib.time_table([with_account, without], ['baseline', 'g1'])
  assert '| baseline | 1 | 75.0% | 0.011 | 25.0% | 0.0% | 0.0% | 0.0% | 0.0% |' in table, table
  assert '| g1 | 0 | - | - |' in table


# --- a main.py run killed between checkpoints and resumed ------------------------------------

def _session(workdir, number):
  path = rundir.goodput_session(workdir, number)
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


@pytest.mark.slow   # two main.py runs (~40 s)
def test_a_killed_and_resumed_run_accounts_for_the_repeated_steps(tmp_path):
  from tests.test_faults import kill_when, main_cmd  # pylint: disable=g-import-not-at-top
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  workdir = str(tmp_path / 'run')
  # Checkpoints 100 steps apart: the window between two is seconds long, longer than the
  # account's writes apart (0.25 s) on a fast machine too.
  cmd = main_cmd(workdir, **{'train.steps': 200, 'train.eval_every': 100,
                             'train.checkpoint_every': 100, 'train.log_every': 5})

  def past_checkpoint_100():   # and 100 finished: its save is asynchronous, and on a loaded
    s = _session(workdir, 1)   # machine the steps ran past it while it was written (a run with
    ckpts = os.path.join(workdir, 'checkpoints')   # the slow tests on two workers resumed at 0)
    return (s is not None and s['step'] > 100 and os.path.isdir(os.path.join(ckpts, '100'))
            and not any('tmp' in n for n in os.listdir(ckpts))
            and not os.path.exists(os.path.join(ckpts, '200')))
  past_checkpoint_100.what = ('the account shows a step after checkpoint 100, which is finished, '
                              'before 200')
  t0 = time.time()
  kill_when(cmd, env, past_checkpoint_100, str(tmp_path / 'log'))
  killed_after = time.time() - t0
  first = _session(workdir, 1)
  # The resumed session, timed from outside: from its start to the account it prints at its end
  # (Python's own exit after that, ~1 s here, is in no session), and to its exit.
  t0 = time.time()
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  out, wall = [], None
  for line in proc.stdout:
    out.append(line)
    if line.startswith('Goodput'):
      wall = time.time() - t0
  proc.wait(timeout=300)
  exited = time.time() - t0
  stdout = ''.join(out)
  assert proc.returncode == 0, stdout[-3000:]
  sessions = rundir.read_goodput(workdir)
  assert [s['state'] for s in sessions] == ['running', 'finished']
  assert sessions[1]['start_step'] == 100 and sessions[1]['step'] == 200
  account = goodput_lib.summarize(sessions)
  assert account['sessions'][0]['lost_steps'] == first['step'] - 100 > 0
  assert account['lost_s'] > 0
  # The resumed session's account covers its process's life (python's start to its exit) ...
  assert sessions[1]['wall_s'] == pytest.approx(wall, rel=0.05), (sessions[1], wall)
  assert exited - 3 < sessions[1]['wall_s'] < exited, (sessions[1], exited)
  assert sessions[0]['wall_s'] <= killed_after
  # ... and its causes add up to it.
  for s in account['sessions']:
    assert abs(s['other_s']) <= 0.05 * s['wall_s'], s
  assert sessions[1]['seconds']['restore'] > 0 and sessions[1]['seconds']['compile'] > 0
  assert f'{first["step"] - 100} steps' in stdout, stdout


def test_a_stalled_storage_does_not_hold_the_end(tmp_path, monkeypatch, capsys):
  """The last write waits CLOSE_WAIT_S at most (a stalled endpoint's request bound can be
  minutes), then a run already failing ends with a warning, and one that was not with one
  paragraph (issue 57; tests/test_storage_stalls.py has the stopped server)."""
  workdir = str(tmp_path / 'run')
  os.makedirs(workdir)
  account = goodput.Account()
  account.begin(workdir, 0, every_s=0.0)
  release = __import__('threading').Event()
  monkeypatch.setattr(goodput.storage, 'write', lambda path, data: release.wait(30))
  monkeypatch.setattr(goodput._Writer, 'CLOSE_WAIT_S', 0.5)  # pylint: disable=protected-access
  start = time.perf_counter()
  account.finish(3, 'failed', raise_errors=False)
  assert time.perf_counter() - start < 2.0
  assert 'was not written' in capsys.readouterr().out
  account = goodput.Account()
  account.begin(workdir, 3, every_s=0.0)
  start = time.perf_counter()
  with pytest.raises(goodput.storage.StorageError, match='was not written .* within 0.5 s: the '
                     'storage stopped answering. Training stopped at step 5 .*run the same '
                     'command again'):
    account.finish(5, 'finished')
  assert time.perf_counter() - start < 2.0
  release.set()
