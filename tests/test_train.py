"""End-to-end training: loss falls, metrics, exact resume after SIGTERM, bad inputs refused."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gated_attention.config import scales
from gated_attention.runs import checkpoint as ckpt_lib
from gated_attention.runs import rundir as workdir_lib
from gated_attention.training import loop
from gated_attention import sharding
from gated_attention.runs import factory
from gated_attention.training import train as train_lib
from gated_attention import input_pipeline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = {
    'model.num_layers': 2, 'model.hidden_size': 64, 'model.num_heads': 4,
    'model.num_kv_heads': 2, 'model.head_dim': 16, 'model.ffn_size': 128,
    'data.seq_len': 32, 'data.val_batches': 2, 'train.batch_size': 8, 'train.steps': 40,
    'train.warmup_steps': 4, 'train.learning_rate': 1e-2, 'train.log_every': 1,
    'train.eval_every': 20, 'train.checkpoint_every': 10,
}


def tiny_config(variant='g1_elementwise', **extra):
  import importlib  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(f'configs.{variant}').get_config('tiny')
  c.update_from_flattened_dict({**OVERRIDES, **extra})
  return c


def read_metrics(workdir, split='train'):
  """{step: row} keeping the last row of each step (a resumed run may repeat none)."""
  rows = {}
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    for line in f:
      row = json.loads(line)
      if row['split'] == split:
        rows[row['step']] = row
  return rows


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run'))
  final = loop.run(tiny_config(), workdir)
  return workdir, final


def test_loss_falls_and_metrics_are_written(trained):
  workdir, final = trained
  train_rows = read_metrics(workdir)
  assert sorted(train_rows) == list(range(1, 41))
  assert train_rows[40]['loss'] < train_rows[1]['loss'] - 1.5, (train_rows[1], train_rows[40])
  for row in train_rows.values():
    for key in ('loss', 'learning_rate', 'grad_norm', 'tokens_per_sec', 'step_time'):
      assert np.isfinite(row[key]), key
    assert 0 <= row['data_wait'] <= 1          # the share of the time spent waiting for data
  val = read_metrics(workdir, 'val')
  assert sorted(val) == [20, 40]
  assert val[40]['loss'] < val[20]['loss']
  assert final['loss'] == pytest.approx(val[40]['loss'])
  assert val[40]['ppl'] == pytest.approx(np.exp(val[40]['loss']), rel=1e-5)
  assert len(val[40]['f_attn']) == 2 and len(val[40]['m_act']) == 2
  assert 0 < val[40]['gate_score_mean'] < 1
  assert os.listdir(os.path.join(workdir, 'tensorboard'))
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['20', '30', '40']


def test_warmup_then_cosine_schedule():
  tc = tiny_config().train
  sched = train_lib.learning_rate_schedule(tc)
  assert float(sched(0)) == 0.0
  assert float(sched(tc.warmup_steps)) == pytest.approx(tc.learning_rate)
  assert float(sched(tc.steps)) == pytest.approx(tc.min_learning_rate)
  assert float(sched(2)) == pytest.approx(tc.learning_rate * 2 / tc.warmup_steps)


def test_learning_rate_at_is_the_schedule_compiled_once():
  """The logged learning rate (one compiled program, as the optimizer's step computes it) equals
  the eager schedule to float32 rounding at every step of warm-up, cosine decay and past the
  end; one program serves a schedule."""
  tc = tiny_config().train
  tc.update(learning_rate=3e-3, min_learning_rate=7e-5, warmup_steps=7, steps=50)
  eager = train_lib.learning_rate_schedule(tc)
  for step in range(0, 56):
    assert train_lib.learning_rate_at(tc, step) == pytest.approx(float(eager(step)), rel=1e-6,
                                                                 abs=1e-7 * tc.learning_rate), step
  assert train_lib._compiled_schedule.cache_info().currsize >= 1
  before = train_lib._compiled_schedule.cache_info().misses
  train_lib.learning_rate_at(tc, 3)
  assert train_lib._compiled_schedule.cache_info().misses == before


def test_weight_decay_skips_norms_and_biases():
  c = tiny_config('g1_input_independent')
  setup = train_lib.Setup(c, sharding.build_mesh(c.mesh))
  params, _ = setup.init(0)
  zero_grads = jax.tree.map(np.zeros_like, params)
  opt_state = setup.optimizer.init(params)
  update = jax.jit(setup.optimizer.update)   # one compile, not op-by-op dispatch each step
  # Zero gradients until past warm-up (lr > 0): only weight-decayed parameters move.
  for _ in range(c.train.warmup_steps + 1):
    updates, opt_state = update(zero_grads, opt_state, params)
  moved = jax.tree_util.tree_map_with_path(
      lambda path, u: (path[-1].key, bool(np.any(np.asarray(u) != 0))), updates)
  for name, did_move in jax.tree.leaves(moved, is_leaf=lambda x: isinstance(x, tuple)):
    assert did_move == (name not in ('scale', 'bias')), name


def test_grad_accumulation_matches_one_big_batch():
  rng = np.random.default_rng(0)
  toks = rng.integers(0, 257, (8, 33)).astype(np.int32)
  batch = {'inputs': toks[:, :-1], 'targets': toks[:, 1:], 'loss_mask': np.ones((8, 32),
                                                                                np.float32)}
  results = []
  for accum in (1, 4):
    # AdamW's first step is ~lr * g / (|g| + eps): with eps=1e-8 a gradient element that nearly
    # cancels (|g| ~ 1e-8) turns float32 summation-order noise into a visible update difference.
    c = tiny_config(**{'train.grad_accum': accum, 'train.warmup_steps': 0, 'train.eps': 1e-6})
    mesh = sharding.build_mesh(c.mesh)
    setup = train_lib.Setup(c, mesh)
    params, opt = setup.init(0)
    with jax.set_mesh(mesh):
      params, _, metrics = setup.train_step(params, opt, setup.global_batch(batch), 1.0)
    results.append((jax.device_get(params), jax.device_get(metrics)))
  (p1, m1), (p4, m4) = results
  assert m1['loss'] == pytest.approx(m4['loss'], rel=1e-5)
  assert m1['grad_norm'] == pytest.approx(m4['grad_norm'], rel=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), p1, p4)  # updates ~1e-2


def test_cpu_compiler_options_take_effect_and_keep_the_numbers():
  """factory.CPU_COMPILER_OPTIONS (YNNPACK for matmuls only) reach XLA, so the compiled step has
  fewer YNNPACK fusions than with XLA's defaults, and the step's loss, gradient norm and new
  parameters agree to float32 rounding."""
  rng = np.random.default_rng(2)
  toks = rng.integers(0, 257, (8, 33)).astype(np.int32)
  batch = {'inputs': toks[:, :-1], 'targets': toks[:, 1:],
           'loss_mask': np.ones((8, 32), np.float32)}
  c = tiny_config(**{'train.warmup_steps': 0, 'train.eps': 1e-6})
  mesh = sharding.build_mesh(c.mesh)
  results, ynn = [], []
  for options in (None, {}):
    setup = train_lib.Setup(c, mesh, cpu_compiler_options=options)
    params, opt = setup.init(0)
    with jax.set_mesh(mesh):
      b = setup.global_batch(batch)
      ynn.append(setup.train_step.lower(params, opt, b, 1.0).compile().as_text()
                 .count('__ynn_fusion'))
      params, _, metrics = setup.train_step(params, opt, b, 1.0)
    results.append((jax.device_get(params), jax.device_get(metrics)))
  assert factory.CPU_COMPILER_OPTIONS and 0 < ynn[0] < ynn[1], ynn
  (p0, m0), (p1, m1) = results
  assert m0['loss'] == pytest.approx(m1['loss'], rel=1e-6)
  assert m0['grad_norm'] == pytest.approx(m1['grad_norm'], rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), p0, p1)


def _main_cmd(workdir, steps):
  overrides = {**OVERRIDES, 'train.steps': steps}
  return [sys.executable, os.path.join(REPO, 'main.py'), '--config=configs/g1_elementwise.py',
          f'--workdir={workdir}'] + [f'--config.{k}={v}' for k, v in overrides.items()]


def test_sigterm_saves_and_resume_follows_the_same_trajectory(tmp_path):
  steps = 120
  straight = str(tmp_path / 'straight')
  loop.run(tiny_config(**{'train.steps': steps}), straight)
  expected = read_metrics(straight)

  resumed = str(tmp_path / 'resumed')
  proc = subprocess.Popen(_main_cmd(resumed, steps), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  metrics_path = os.path.join(resumed, 'metrics.jsonl')
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics_path) and len(open(metrics_path).readlines()) >= 12:
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.02)
  out, _ = proc.communicate(timeout=240)
  assert proc.returncode == 0, out
  assert 'Interrupted' in out, out
  stopped = ckpt_lib.Checkpointer(resumed, read_only=True)
  stopped_at = stopped.latest_step()
  stopped.close()
  assert 10 < stopped_at < steps, stopped_at

  loop.run(tiny_config(**{'train.steps': steps}), resumed)
  got = read_metrics(resumed)
  assert sorted(got) == sorted(expected)
  for step in expected:
    assert got[step]['loss'] == pytest.approx(expected[step]['loss'], abs=1e-6), step
  assert read_metrics(resumed, 'val')[steps]['loss'] == pytest.approx(
      read_metrics(straight, 'val')[steps]['loss'], abs=1e-6)


def test_incompatible_workdir_is_refused(trained):
  workdir, _ = trained
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  with pytest.raises(ckpt_lib.CheckpointError, match='model.num_layers'):
    loop.run(tiny_config(**{'model.num_layers': 3}), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['model']['num_layers'] == 2


def test_layout_settings_that_change_no_checkpoint_are_free_on_resume(trained, tmp_path):
  """Issue 38: scan_layers and fused_gate_projection change nothing in a checkpoint (the same
  parameter tree), so resuming with the other value is accepted; a structural field is not."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained[0], workdir)
  changed = tiny_config(**{'model.scan_layers': False, 'model.fused_gate_projection': False})
  workdir_lib.check_or_write_config(workdir, changed, resuming_data=True)   # no error
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['model']['scan_layers'] is False   # config.json records the resumption
  with pytest.raises(ckpt_lib.CheckpointError, match='model.head_dim'):
    workdir_lib.check_or_write_config(workdir, tiny_config(**{'model.head_dim': 32}),
                                   resuming_data=True)
  a = train_lib.Setup(tiny_config(), sharding.build_mesh(tiny_config().mesh)).abstract_params
  b = train_lib.Setup(changed, sharding.build_mesh(changed.mesh)).abstract_params
  shapes = lambda t: jax.tree.map(lambda x: (x.shape, x.dtype), t)  # noqa: E731
  assert shapes(a) == shapes(b)


@pytest.mark.parametrize('overrides, error, match', [
    ({'data.source': 'text', 'data.path': '/nonexistent/*.txt'}, input_pipeline.DataError,
     'nonexistent'),
    ({'model.vocab_size': 100}, ValueError, 'vocab_size'),
    ({'train.grad_accum': 3}, ValueError, 'grad_accum'),
    ({'train.steps': 0}, ValueError, 'train.steps'),
    ({'model.gate.granularity': 'rowwise'}, ValueError, 'config.model.gate.granularity'),
    ({'mesh.data': 3}, ValueError, 'config.mesh'),
])
def test_bad_inputs_stop_before_training(tmp_path, overrides, error, match):
  workdir = str(tmp_path / 'run')
  with pytest.raises(error, match=match):
    loop.run(tiny_config(**overrides), workdir)
  assert not os.path.exists(os.path.join(workdir, 'checkpoints'))


def test_params_mode_prints_json():
  out = subprocess.run([sys.executable, 'main.py', '--config=configs/g1_headwise.py:moe_15a2b',
                        '--mode=params'], cwd=REPO, capture_output=True, text=True, check=True)
  report = json.loads(out.stdout.strip().splitlines()[-1])
  assert set(report) >= {'total', 'active', 'embedding', 'by_module'}
  assert 14e9 < report['total'] < 17e9 and 1.5e9 < report['active'] < 3e9
  assert report['embedding'] == scales.QWEN_VOCAB * 2048


def test_run_saved_by_older_code_still_resumes(tmp_path):
  """A config.json without fields added since (they take their defaults) is compatible."""
  workdir = str(tmp_path / 'old')
  cfg = tiny_config()
  workdir_lib.check_or_write_config(workdir, cfg)
  path = os.path.join(workdir, 'config.json')
  with open(path) as f:
    saved = json.load(f)
  del saved['model']['ffn_match_baseline'], saved['analysis']
  with open(path, 'w') as f:
    json.dump(saved, f)
  workdir_lib.check_or_write_config(workdir, cfg)
  saved['model']['ffn_match_baseline'] = True
  with open(path, 'w') as f:
    json.dump(saved, f)
  with pytest.raises(ckpt_lib.CheckpointError, match='ffn_match_baseline'):
    workdir_lib.check_or_write_config(workdir, cfg)


def test_chunked_loss_equals_the_whole_loss():
  rng = np.random.default_rng(1)
  toks = rng.integers(0, 257, (4, 33)).astype(np.int32)
  mask = (rng.random((4, 32)) > 0.2).astype(np.float32)
  batch = {'inputs': toks[:, :-1], 'targets': toks[:, 1:], 'loss_mask': mask}
  results = []
  for chunk, variant in ((0, 'g1_elementwise'), (8, 'g1_elementwise'), (0, 'baseline'),
                         (16, 'baseline')):
    c = tiny_config(variant, **{'train.loss_chunk_size': chunk, 'train.z_loss': 1e-3,
                                'model.tie_embeddings': variant == 'baseline',
                                'model.num_layers': 1})   # the loss is after the last layer
    setup = train_lib.Setup(c, sharding.build_mesh(c.mesh))
    params, _ = setup.init(0)
    grad_fn = jax.jit(jax.value_and_grad(
        lambda p, b, c=c, g=setup.graphdef: train_lib.loss_fn(p, g, b, c.train), has_aux=True))
    results.append(jax.device_get(grad_fn(params, batch)))
  for whole, chunked in (results[:2], results[2:]):
    (l0, (m0, _)), g0 = whole
    (l1, (m1, _)), g1 = chunked
    assert l0 == pytest.approx(l1, rel=1e-6) and m0['z_loss'] == pytest.approx(m1['z_loss'])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g0, g1)
  with pytest.raises(ValueError, match='loss_chunk_size'):
    c = tiny_config(**{'train.loss_chunk_size': 5})
    train_lib.Setup(c, sharding.build_mesh(c.mesh))


def test_init_from_starts_a_new_run_from_another_runs_weights(trained, tmp_path, capsys):
  """train.init_from: the other run's latest parameters, a fresh optimizer and data iterator
  (here with another seed, which a resumption of that run would refuse)."""
  source, _ = trained
  workdir = str(tmp_path / 'warm')
  loop.run(tiny_config(**{'train.init_from': source, 'seed': 3, 'train.steps': 2,
                          'train.eval_every': 2, 'train.checkpoint_every': 2}), workdir)
  assert f'Initialised from {source} (step 40)' in capsys.readouterr().out
  warm, scratch = read_metrics(workdir), read_metrics(source)
  assert sorted(warm) == [1, 2]
  assert warm[1]['loss'] < scratch[1]['loss'] - 1.5       # it starts where the source ended
  assert abs(warm[1]['loss'] - scratch[40]['loss']) < 0.5


def test_document_mask_takes_the_data_tokenizers_bos():
  assert factory.document_bos(tiny_config()) is None                       # off by default
  assert factory.document_bos(tiny_config(**{'data.document_mask': True})) == 256   # byte BOS
  synthetic = tiny_config(**{'data.document_mask': True, 'data.source': 'synthetic'})
  assert factory.document_bos(synthetic) == synthetic.data.synthetic.vocab


def test_document_mask_changes_the_loss_only_when_on():
  """loss_fn with document_bos masks across the BOS inside the window, and without it equals
  the plain loss; a window with no BOS after position 0 is the same either way."""
  setup = train_lib.Setup(tiny_config(), sharding.build_mesh(tiny_config().mesh))
  params, _ = setup.init(0)
  tokens = np.random.default_rng(0).integers(0, 256, (2, 33)).astype(np.int32)
  tokens[:, 0] = 256
  one_doc = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
             'loss_mask': np.ones((2, 32), np.float32)}
  two_docs = dict(one_doc, inputs=one_doc['inputs'].copy())
  two_docs['inputs'][:, 16] = 256
  loss = jax.jit(lambda p, b, bos: train_lib.loss_fn(p, setup.graphdef, b, setup.cfg.train,
                                                     document_bos=bos)[0], static_argnums=2)
  assert float(loss(params, one_doc, 256)) == pytest.approx(float(loss(params, one_doc, None)),
                                                            rel=1e-6)
  assert abs(float(loss(params, two_docs, 256)) - float(loss(params, two_docs, None))) > 1e-4
