"""Several seeds as one program (training/seeds.py) against separate runs of each seed."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from gated_attention import sharding
from gated_attention.errors import ConfigError
from gated_attention.runs import factory
from gated_attention.runs import lock as lock_lib
from gated_attention.runs import rundir
from gated_attention.training import loop
from gated_attention.training import seeds as seeds_lib
from gated_attention.training import train as train_lib
from tests.test_train import REPO, read_metrics, tiny_config

STEPS = 12
EXTRA = {'train.steps': STEPS, 'train.eval_every': 6, 'train.checkpoint_every': 6,
         'train.log_every': 1}
# float32 rounding: the batched (vmapped) matmuls may sum in another order than a single run's.
# Measured differences are in the report of benchmarks/seeds.py; these bounds hold them with room.
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-5


def _params(workdir):
  cfg = rundir.read_config(workdir)
  f = factory.ModelFactory(cfg, rundir.build_mesh(cfg))
  return f.restore(workdir)


@pytest.mark.slow  # ~11 s on the shared 2-core machine: two compiles of the step
@pytest.mark.parametrize('program', ['vmap', 'unrolled'])
def test_the_stacked_step_equals_the_single_step_per_seed(program):
  """Setup.train_step on each seed alone against Stacked.train_step on both, 2 steps in memory:
  to float32 rounding (vmap), bit for bit (unrolled)."""
  cfg = tiny_config(**{'model.num_layers': 1, 'model.hidden_size': 32, 'model.num_heads': 2,
                       'model.num_kv_heads': 1, 'model.ffn_size': 64})
  setup = train_lib.Setup(cfg, sharding.build_mesh(cfg.mesh))
  stacked = seeds_lib.Stacked(setup, program)
  rng = np.random.default_rng(0)
  B, T, V = cfg.train.batch_size, cfg.data.seq_len, 256
  batches = [[{'inputs': rng.integers(0, V, (B, T), dtype=np.int32),
               'targets': rng.integers(0, V, (B, T), dtype=np.int32),
               'loss_mask': np.ones((B, T), np.float32)} for _ in range(2)] for _ in range(2)]
  with jax.set_mesh(setup.mesh):
    alone = []
    for s in (0, 1):
      params, opt, losses = *setup.init(s), []
      for b in batches[s]:
        params, opt, m = setup.train_step(params, opt, setup.global_batch(b), 1.0)
        losses.append(float(m['loss']))
      alone.append((params, opt, losses))
    params_S, opt_S = stacked.stack_state([setup.init(0), setup.init(1)])
    losses_S = []
    for b0, b1 in zip(*batches):
      batch_S = stacked.stack_batch([setup.global_batch(b0), setup.global_batch(b1)])
      params_S, opt_S, m = stacked.train_step(params_S, opt_S, batch_S, 1.0)
      losses_S.append(np.asarray(m['loss']))
  for i, (params, opt, losses) in enumerate(alone):
    np.testing.assert_allclose([l[i] for l in losses_S], losses, rtol=LOSS_RTOL)
    taken, taken_opt = stacked.take(params_S, opt_S, i)
    for a, b in zip(jax.tree.leaves((taken, taken_opt)), jax.tree.leaves((params, opt))):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=PARAM_ATOL, rtol=1e-4)
    assert jax.tree.leaves(taken)[0].sharding == jax.tree.leaves(setup.param_shardings)[0]
    if program == 'unrolled':
      assert [float(l[i]) for l in losses_S] == losses
      for a, b in zip(jax.tree.leaves((taken, taken_opt)), jax.tree.leaves((params, opt))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert losses_S[0][0] != losses_S[0][1]   # two seeds, two models


@pytest.fixture(scope='module')
def batched_and_single(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('seeds'))
  config = tiny_config(**EXTRA)
  dirs = rundir.seed_workdirs(os.path.join(root, 'batched'), [3, 4])
  vals = seeds_lib.run(config, dirs)
  singles = {}
  for s in (3, 4):
    c = tiny_config(**EXTRA, seed=s)
    singles[s] = os.path.join(root, f'single_s{s}')
    loop.run(c, singles[s])
  return dirs, singles, vals


@pytest.mark.slow  # ~30 s: 2 seeds batched and 2 single runs of 12 steps
def test_each_seed_is_a_run_equal_to_its_separate_run(batched_and_single):
  dirs, singles, vals = batched_and_single
  assert set(vals) == {3, 4} and all('loss' in v for v in vals.values())
  losses = {}
  for s in (3, 4):
    assert rundir.read_config(dirs[s]).seed == s
    assert rundir.checkpoint_steps(dirs[s]) == [6, 12]
    got, want = read_metrics(dirs[s]), read_metrics(singles[s])
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for key in ('loss', 'grad_norm', 'param_norm', 'update_norm', 'learning_rate'):
      a = np.array([got[k][key] for k in sorted(got)])
      b = np.array([want[k][key] for k in sorted(want)])
      np.testing.assert_allclose(a, b, rtol=LOSS_RTOL, err_msg=f'seed {s} {key}')
    val_a, val_b = read_metrics(dirs[s], 'val'), read_metrics(singles[s], 'val')
    assert sorted(val_a) == sorted(val_b) == [6, 12]
    for key in ('loss', 'f_attn_mean', 'm_act_mean', 'gate_score_mean'):
      np.testing.assert_allclose(val_a[12][key], val_b[12][key], rtol=1e-4, atol=1e-6)
    (step_a, p_a), (step_b, p_b) = _params(dirs[s]), _params(singles[s])
    assert step_a == step_b == STEPS
    diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(p_a), jax.tree.leaves(p_b)))
    # On CPU, seeds_program='auto' is the unrolled program: bit for bit a separate run's.
    assert diff == 0.0
    for key in ('loss', 'grad_norm', 'param_norm', 'update_norm'):
      assert [got[k][key] for k in sorted(got)] == [want[k][key] for k in sorted(want)], key
    for key in ('loss', 'f_attn_mean', 'm_act_mean', 'gate_score_mean'):
      assert val_a[12][key] == val_b[12][key], key
    assert diff <= PARAM_ATOL, f'seed {s}: params differ by {diff}'
    losses[s] = [got[k]['loss'] for k in sorted(got)]
  assert losses[3] != losses[4]          # the seeds are different runs


@pytest.mark.slow  # the fixture, and main.py in a subprocess
def test_a_seed_directory_resumes_alone_with_main(batched_and_single, tmp_path):
  dirs, _, _ = batched_and_single
  workdir = str(tmp_path / 's3')
  subprocess.run(['cp', '-r', dirs[3], workdir], check=True)
  out = subprocess.run([sys.executable, 'main.py', f'--workdir={workdir}',
                        f'--config.train.steps={STEPS + 3}'], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'resuming at step 12' in out.stdout
  rows = read_metrics(workdir)
  assert max(rows) == STEPS + 3 and rundir.latest_step(workdir) == STEPS + 3
  assert rundir.read_config(workdir).seed == 3


def test_bad_seeds_are_refused(tmp_path):
  mesh = sharding.build_mesh(tiny_config().mesh)
  assert seeds_lib.resolve_program('auto', mesh) == 'unrolled'        # a CPU mesh
  assert seeds_lib.resolve_program('vmap', mesh) == 'vmap'
  with pytest.raises(ConfigError, match=r"seeds_program='scan' is not one of"):
    seeds_lib.resolve_program('scan', mesh)
  with pytest.raises(ConfigError, match='distinct'):
    rundir.seed_workdirs(str(tmp_path), [1, 1])
  with pytest.raises(ConfigError, match='distinct'):
    seeds_lib.seed_configs(tiny_config(), [])
  assert rundir.seed_workdirs('out/g1_s{seed}', [0, 2]) == {0: 'out/g1_s0', 2: 'out/g1_s2'}
  assert rundir.seed_workdirs('out', [5]) == {5: os.path.join('out', 's5')}


@pytest.mark.slow  # the fixture
def test_seeds_at_different_steps_are_refused(batched_and_single, tmp_path):
  _, singles, _ = batched_and_single
  workdirs = {3: singles[3], 7: str(tmp_path / 's7')}   # one at step 12, one new
  with pytest.raises(ConfigError, match='different steps'):
    seeds_lib.run(tiny_config(**{**EXTRA, 'train.steps': STEPS + 2}), workdirs)
  lock = lock_lib.RunLock(singles[3])        # the refused batch released its locks
  lock.acquire()
  lock.release()
  with open(os.path.join(singles[3], rundir.CONFIG_FILE)) as f:
    assert json.load(f)['seed'] == 3


@pytest.mark.slow  # a batched run of 12 steps and main.py in a subprocess
def test_a_failing_seed_leaves_the_batch_and_the_others_finish(tmp_path, monkeypatch):
  """Seed 6's guard reports a failure at step 8 (a stand-in for a divergence): it stops with its
  checkpoint of step 6, seed 5 trains to the end, and the run says so; seed 6 resumes alone."""
  from gated_attention.training import stability  # pylint: disable=g-import-not-at-top
  check = loop.check_pending

  def failing(run):
    failure = check(run)
    if run.config.seed == 6 and run.step == 8:
      return stability.Event('failure', 8, 9.9, why='a test failure')
    return failure
  monkeypatch.setattr(loop, 'check_pending', failing)
  dirs = rundir.seed_workdirs(str(tmp_path / 'seeds_{seed}'), [5, 6])
  with pytest.raises(loop.TrainingStopped, match='1 of 2 seeds stopped') as e:
    seeds_lib.run(tiny_config(**{**EXTRA, 'train.eval_every': 4}), dirs)
  assert 'seed 6 stopped at step 8: a test failure' in str(e.value)
  assert f'python main.py --workdir={dirs[6]}' in str(e.value)
  assert rundir.checkpoint_steps(dirs[5]) == [6, 12] and max(read_metrics(dirs[5])) == STEPS
  # as in a single run, the failing step's row is not written
  assert rundir.checkpoint_steps(dirs[6]) == [6] and max(read_metrics(dirs[6])) == 7
  assert sorted(read_metrics(dirs[5], 'val')) == [4, 8, 12]
  assert sorted(read_metrics(dirs[6], 'val')) == [4]
  monkeypatch.setattr(loop, 'check_pending', check)
  out = subprocess.run([sys.executable, 'main.py', f'--workdir={dirs[6]}'], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'resuming at step 6' in out.stdout and rundir.latest_step(dirs[6]) == STEPS
