"""The attention-sink analysis: metrics on constructed models and inputs, pooling, the report,
and an end-to-end tiny run through training, --mode=analyze and --mode=compare.

Constructed model (`_constructed_model`): embeddings put every token on channel B_CH, BOS also on
channel A_CH, and a "spike" token on SPIKE_CH; attention and FFN output projections are zero, so
every layer sees the embeddings. Layer 0 has zero query weights: uniform causal attention, whose
F-Attn is mean_{q=1..T-1} 1/(q+1). In layer 1 heads 0 and 1 read a query from B_CH and only BOS
has a key (from A_CH); with QK-norm scales of 10 the logit to BOS is ~280 and every other logit
0, so those heads give probability 1 to token 0; heads 2 and 3 keep zero queries (uniform).
"""

import functools
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import scales
from gated_attention.model import attention, gating
from gated_attention.model import transformer as model_lib
from gated_attention.analysis import analyze, attention_maps, metrics
from gated_attention.modes import analyze as analyze_mode
from gated_attention.modes import compare
from gated_attention.runs import factory
from gated_attention.runs import rundir as runs
from tests.jax_helpers import model_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, D, H, K, HD = 16, 16, 4, 2, 8
BOS, SPIKE = 0, 5
A_CH, B_CH, SPIKE_CH = 0, 1, 7
ROPE_DIM = HD // 2 - 1       # the lowest-frequency RoPE pair (ROPE_DIM, HD - 1)


def uniform_f_attn(T):
  return float(np.mean([1.0 / (q + 1) for q in range(1, T)]))


def _model_cfg(**gate):
  c = scales.get_config('tiny')
  c.model.update(vocab_size=V, num_layers=2, hidden_size=D, num_heads=H, num_kv_heads=K,
                 head_dim=HD, ffn_size=16)
  c.model.gate.update(gate)
  return c.model


def _constructed_model(spike=50.0, value_scale=0.0, **gate):
  cfg = _model_cfg(**gate)
  model = model_lib.Transformer(model_config(cfg), rngs=nnx.Rngs(0))
  emb = np.zeros((V, D), np.float32)
  emb[:, B_CH] = 1.0
  emb[BOS, A_CH] = 1.0
  emb[SPIKE, SPIKE_CH] = spike
  model.embed.embedding[...] = jnp.asarray(emb)
  attn = model.blocks.attn
  L = cfg.num_layers
  wq = np.zeros((L, D, H, HD), np.float32)
  wq[1, B_CH, :2, ROPE_DIM] = 1.0                        # layer 1, heads 0 and 1 only
  wk = np.zeros((L, D, K, HD), np.float32)
  wk[:, A_CH, :, ROPE_DIM] = 1.0                         # only BOS has a key
  wv = np.zeros((L, D, K, HD), np.float32)
  wv[1, B_CH] = value_scale                              # layer 0: V = 0
  attn.wq[...] = jnp.asarray(wq)
  attn.wk[...] = jnp.asarray(wk)
  attn.wv[...] = jnp.asarray(wv)
  attn.q_norm.scale[...] = jnp.full((L, HD), 10.0)
  attn.k_norm.scale[...] = jnp.full((L, HD), 10.0)
  attn.wo[...] = jnp.zeros_like(attn.wo[...])
  model.blocks.ffn.wo[...] = jnp.zeros_like(model.blocks.ffn.wo[...])
  return model


_JITTED = {}  # id(model) -> (model, jitted inspect step); the model is kept so the id stays


def _run_inspect(model, tokens):
  """factory.inspect_step (what the analysis runs) on `tokens`; numpy outputs."""
  graphdef, state = nnx.split(model)
  if id(model) not in _JITTED:
    _JITTED[id(model)] = (model, jax.jit(functools.partial(factory.inspect_step,
                                                           graphdef=graphdef)))
  fn = _JITTED[id(model)][1]
  return jax.device_get(fn(nnx.to_pure_dict(state), {'inputs': jnp.asarray(tokens, jnp.int32)}))


def _tokens(B, T, spikes=()):
  """BOS then ordinary tokens (never BOS or SPIKE); SPIKE at each (sample, position)."""
  rng = np.random.default_rng(B * 100 + T)
  ordinary = np.array([t for t in range(V) if t not in (BOS, SPIKE)])
  tokens = rng.choice(ordinary, size=(B, T))
  tokens[:, 0] = BOS
  for b, t in spikes:
    tokens[b, t] = SPIKE
  return tokens


# --------------------------------------------------------------------------------------------
# F-Attn and attention maps on a model whose attention pattern is known exactly
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def constructed():
  return _constructed_model(value_scale=1e-3)


def test_f_attn_per_layer_and_head_exact(constructed):
  B, T = 2, 16
  aux = _run_inspect(constructed, _tokens(B, T, spikes=[(1, 3)]))
  u = uniform_f_attn(T)
  assert u == pytest.approx(metrics.uniform_causal_f_attn(T), abs=1e-15)
  np.testing.assert_allclose(aux['f_attn_H'][0], [u] * 4, rtol=1e-6)
  np.testing.assert_allclose(aux['f_attn_H'][1], [1.0, 1.0, u, u], rtol=1e-6)
  rep = metrics.report(metrics.pool([aux], [(B, T)]), loss=None)
  assert rep['f_attn'] == pytest.approx([u, (1 + u) / 2], rel=1e-6)
  assert rep['f_attn_mean'] == pytest.approx((u + (1 + u) / 2) / 2, rel=1e-6)
  assert rep['f_attn_per_head'][1] == pytest.approx([1.0, 1.0, u, u], rel=1e-6)


def test_attention_maps_exact(constructed):
  B, T = 2, 12
  aux = _run_inspect(constructed, _tokens(B, T))
  q = np.arange(T)[:, None]
  causal = np.tril(np.ones((T, T)))
  uniform = causal / (q + 1)                            # row q: 1/(q+1) on keys 0..q
  sink = np.zeros((T, T))
  sink[:, 0] = 1.0
  np.testing.assert_allclose(aux['attn_map'][0], uniform, atol=1e-6)
  np.testing.assert_allclose(aux['attn_map'][1], (2 * sink + 2 * uniform) / 4, atol=1e-6)


def test_m_act_value_and_location_in_model(constructed):
  B, T = 2, 16
  aux = _run_inspect(constructed, _tokens(B, T, spikes=[(1, 3)]))
  m = aux['m_act']
  for site in ('attn_residual', 'ffn_residual'):         # the residual stream = the embeddings
    np.testing.assert_allclose(m[site]['max'], [50.0, 50.0])
    np.testing.assert_array_equal(m[site]['where'], [[1, 3, SPIKE_CH]] * 2)
  for site in ('attn_out', 'ffn_out'):                   # zero output projections
    np.testing.assert_array_equal(m[site]['max'], [0.0, 0.0])


def test_sparsity_in_model(constructed):
  B, T = 2, 16
  aux = _run_inspect(constructed, _tokens(B, T, spikes=[(1, 3)]))
  pre = aux['sdpa_pre_gate']
  # layer 0: V = 0, so Y = 0; layer 1: every |Y| lies in (1e-3, 1e-2) (V = 1e-3 * x[B_CH] with
  # x[B_CH] in {2.83 (BOS), 4, 0.08 (spike)}, averaged over at least BOS and one other token).
  np.testing.assert_array_equal(pre['abs_mean'][0], 0.0)
  np.testing.assert_array_equal(pre['frac_below_1e-2'], [1.0, 1.0])
  np.testing.assert_array_equal(pre['frac_below_1e-3'], [1.0, 0.0])
  assert 1e-3 < pre['abs_mean'][1] < 1e-2
  for k in pre:                                          # no gate: post == pre
    np.testing.assert_array_equal(aux['sdpa_post_gate'][k], pre[k])
  assert 'gate' not in aux


def test_m_act_on_constructed_hidden_states():
  h = np.zeros((2, 5, 3), np.float32)
  h[0, 4, 2] = 6.0
  h[1, 2, 0] = -7.0                                      # |h|: the negative one is larger
  out = jax.device_get(model_lib._where_max_abs(jnp.asarray(h)))
  assert float(out['max']) == 7.0
  np.testing.assert_array_equal(out['where'], [1, 2, 0])
  assert float(out['median']) == 0.0                     # 28 of the 30 elements are 0
  r = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
  out_r = jax.device_get(model_lib._where_max_abs(jnp.asarray(r)))
  assert float(out_r['median']) == pytest.approx(np.median(np.abs(r.astype(np.float64))), rel=1e-6)
  h[0, 1, 1] = 7.0                                       # a tie: the first occurrence wins
  out = jax.device_get(model_lib._where_max_abs(jnp.asarray(h)))
  np.testing.assert_array_equal(out['where'], [0, 1, 1])


def test_sparsity_on_constructed_y():
  y = jnp.asarray([0.0, 1e-4, -5e-3, 0.02, -0.5, 2.0, 1e-3 * 0.999, 0.011])
  s = jax.device_get(attention.sparsity(y))
  a = np.abs(np.asarray(y, np.float64))
  assert float(s['abs_mean']) == pytest.approx(a.mean(), rel=1e-6)
  assert float(s['frac_below_1e-2']) == 4 / 8           # 0, 1e-4, 5e-3, 9.99e-4
  assert float(s['frac_below_1e-3']) == 3 / 8           # 0, 1e-4, 9.99e-4


# --------------------------------------------------------------------------------------------
# Gate scores on known gates
# --------------------------------------------------------------------------------------------

def test_input_independent_gate_at_init_is_one_half():
  cfg = _model_cfg(position='g1', input_dependent=False)
  model = model_lib.Transformer(model_config(cfg), rngs=nnx.Rngs(3))   # random weights, zero gate bias
  aux = _run_inspect(model, np.random.default_rng(0).integers(0, V, (2, 10)))
  g = aux['gate']
  np.testing.assert_array_equal(g['mean'], [0.5, 0.5])
  np.testing.assert_array_equal(g['frac_below_0.1'], [0.0, 0.0])
  want = np.zeros(gating.HIST_BINS)
  want[gating.HIST_BINS // 2] = 1.0                      # 0.5 is in the bin [0.5, 0.55)
  np.testing.assert_array_equal(g['hist'], [want, want])
  np.testing.assert_allclose(aux['sdpa_post_gate']['abs_mean'],
                             0.5 * aux['sdpa_pre_gate']['abs_mean'], rtol=1e-6)
  rep = metrics.report(metrics.pool([aux], [(2, 10)]), loss=1.0)
  assert rep['gate_score_mean'] == 0.5
  assert rep['gate']['frac_below_0.1_mean'] == 0.0


def test_input_dependent_gate_closed_on_half_the_heads():
  model = _constructed_model(position='g1')              # elementwise, sigmoid, input-dependent
  kernel = np.zeros((2, D, H, HD), np.float32)
  kernel[:, B_CH, :2, :] = -10.0                         # heads 0, 1: sigmoid(-10 x_B) ~ 1e-12
  model.blocks.attn.gate.kernel[...] = jnp.asarray(kernel)
  aux = _run_inspect(model, _tokens(2, 12))              # no spike token: x_B in {2.83, 4}
  g = aux['gate']
  np.testing.assert_allclose(g['mean'], [0.25, 0.25], atol=1e-6)
  np.testing.assert_array_equal(g['frac_below_0.1'], [0.5, 0.5])
  want = np.zeros(gating.HIST_BINS)
  want[0] = want[gating.HIST_BINS // 2] = 0.5
  np.testing.assert_array_equal(g['hist'], [want, want])


def test_ungated_report_has_null_gate(constructed):
  aux = _run_inspect(constructed, _tokens(2, 8))
  rep = metrics.report(metrics.pool([aux], [(2, 8)]), loss=2.0)
  assert rep['gate_score_mean'] is None and rep['gate'] is None
  assert rep['ppl'] == pytest.approx(math.exp(2.0))


# --------------------------------------------------------------------------------------------
# Pooling over batches
# --------------------------------------------------------------------------------------------

def test_pool_f_attn_weighted_by_queries_and_m_act_max_over_batches(constructed):
  a1 = _run_inspect(constructed, _tokens(2, 8, spikes=[(1, 3)]))
  model80 = _constructed_model(spike=80.0, value_scale=1e-3)
  a2 = _run_inspect(model80, _tokens(2, 16, spikes=[(0, 9)]))
  pooled = metrics.pool([a1, a2], [(2, 8), (2, 16)])
  u8, u16 = uniform_f_attn(8), uniform_f_attn(16)
  want0 = (2 * 7 * u8 + 2 * 15 * u16) / (2 * 7 + 2 * 15)   # weights: B * (T - 1) queries
  np.testing.assert_allclose(pooled['f_attn_H'][0], [want0] * 4, rtol=1e-6)
  np.testing.assert_allclose(pooled['f_attn_H'][1], [1, 1, want0, want0], rtol=1e-6)
  m = pooled['m_act']['ffn_residual']
  np.testing.assert_allclose(m['max'], [80.0, 80.0])
  np.testing.assert_array_equal(m['batch'], [1, 1])
  np.testing.assert_array_equal(m['where'], [[0, 9, SPIKE_CH]] * 2)
  rep = metrics.report(pooled, loss=None, batch_size=2,
                       inputs=[_tokens(2, 8, [(1, 3)]), _tokens(2, 16, [(0, 9)])])
  w = rep['m_act_where']['ffn_residual']
  assert w['sequence'] == [2, 2] and w['token'] == [9, 9] and w['channel'] == [SPIKE_CH] * 2
  assert w['token_id'] == [SPIKE, SPIKE]
  np.testing.assert_array_equal(pooled['attn_map'], a1['attn_map'])   # the first batch's


def test_pool_gate_and_sparsity_weighted_and_histograms_summed():
  def fake(gate_mean, frac, hist, abs_mean, f_attn):
    stat = lambda v: np.array([v, v], np.float32)       # noqa: E731  two layers
    m = {'max': np.array([1.0, 2.0]), 'where': np.zeros((2, 3), np.int32),
         'median': np.array([abs_mean, 2 * abs_mean])}
    return {'f_attn_H': np.full((2, 4), f_attn), 'attn_map': np.zeros((2, 3, 3)),
            'gate': {'mean': stat(gate_mean), 'frac_below_0.1': stat(frac),
                     'hist': np.array([hist, hist], np.float32)},
            'sdpa_pre_gate': {'abs_mean': stat(abs_mean), 'frac_below_1e-2': stat(frac),
                              'frac_below_1e-3': stat(0.0)},
            'sdpa_post_gate': {'abs_mean': stat(abs_mean / 2), 'frac_below_1e-2': stat(frac),
                               'frac_below_1e-3': stat(0.0)},
            'm_act': {s: m for s in metrics.M_ACT_SITES}}
  b1 = fake(0.2, 0.5, [1.0, 0.0, 0.0], 1.0, 0.1)         # 2 x 8 tokens
  b2 = fake(0.5, 0.0, [0.0, 0.25, 0.75], 4.0, 0.4)       # 2 x 16 tokens
  pooled = metrics.pool([b1, b2], [(2, 8), (2, 16)])
  np.testing.assert_allclose(pooled['gate']['mean'], [(16 * 0.2 + 32 * 0.5) / 48] * 2)
  np.testing.assert_allclose(pooled['gate']['frac_below_0.1'], [16 * 0.5 / 48] * 2)
  counts = 16 * np.array([1.0, 0, 0]) + 32 * np.array([0, 0.25, 0.75])   # summed histograms
  np.testing.assert_allclose(pooled['gate']['hist'], [counts / 48] * 2)
  np.testing.assert_allclose(pooled['sdpa_pre_gate']['abs_mean'], [(16 + 32 * 4) / 48] * 2)
  np.testing.assert_allclose(pooled['sdpa_post_gate']['abs_mean'], [(8 + 32 * 2) / 48] * 2)
  np.testing.assert_allclose(pooled['f_attn_H'], np.full((2, 4), (14 * 0.1 + 30 * 0.4) / 44))
  np.testing.assert_array_equal(pooled['m_act']['attn_out']['batch'], [0, 0])  # ties: first
  np.testing.assert_allclose(pooled['m_act']['ffn_out']['median'],   # weighted by tokens
                             [(16 + 32 * 4) / 48, 2 * (16 + 32 * 4) / 48])
  # equal shapes (or none given): plain means
  np.testing.assert_allclose(metrics.pool([b1, b2])['gate']['mean'], [0.35, 0.35])
  rep = metrics.report(pooled, loss=None)
  assert rep['sparsity']['pre_gate']['abs_mean_mean'] == pytest.approx((16 + 128) / 48)
  with pytest.raises(ValueError):
    metrics.pool([])


# --------------------------------------------------------------------------------------------
# Options, overrides, run files
# --------------------------------------------------------------------------------------------

def test_analysis_config_overrides():
  saved = scales.get_config('tiny')
  cfg = runs.evaluation_config(saved, {'data.val_batches': 7, 'train.batch_size': 4,
                                       'model.dtype': 'bfloat16'})
  assert (cfg.data.val_batches, cfg.train.batch_size, cfg.model.dtype) == (7, 4, 'bfloat16')
  assert saved.data.val_batches != 7                     # the saved config is not modified
  yarn = runs.evaluation_config(saved, {'model.rope_base': 5e5,
                                        'model.rope_scaling.type': 'yarn',
                                        'model.rope_scaling.factor': 4.0})
  assert (yarn.model.rope_base, yarn.model.rope_scaling.type) == (5e5, 'yarn')  # context extension
  with pytest.raises(runs.RunError, match='model.num_layers'):
    runs.evaluation_config(saved, {'model.num_layers': 3})
  with pytest.raises(runs.RunError, match='tokenizer'):
    runs.evaluation_config(saved, {'data.tokenizer': 'x.model'})
  assert analyze.map_layers('', 4) == [0, 2, 3]
  assert analyze.map_layers('0,-1', 4) == [0, 3]
  assert analyze.map_layers([1], 2) == [1]
  with pytest.raises(analyze.AnalysisError):
    analyze.map_layers('5', 4)
  with pytest.raises(analyze.AnalysisError, match='Unknown analysis options'):
    analyze.options(None, {}, {'bogus': 1})


def test_evaluation_may_name_the_tokenizer_a_run_did_not_save():
  """An import of a Hugging Face directory without tokenizer.json saves data.tokenizer=''
  (unknown): evaluation may name one (--config.data.tokenizer=byte) instead of refusing it as
  a change of what the checkpoint fixes; a saved tokenizer still cannot change."""
  saved = scales.get_config('tiny')
  saved.data.tokenizer = ''
  assert runs.evaluation_config(saved, {'data.tokenizer': 'byte'}).data.tokenizer == 'byte'
  saved.data.tokenizer = 'byte'
  assert runs.evaluation_config(saved, {'data.tokenizer': 'byte'}).data.tokenizer == 'byte'
  with pytest.raises(runs.RunError, match="data.tokenizer='x.model' \\(saved: 'byte'\\)"):
    runs.evaluation_config(saved, {'data.tokenizer': 'x.model'})


def test_read_metrics_dedups_resumed_steps(tmp_path):
  rows = [{'step': 10, 'split': 'train', 'loss': 3.0}, {'step': 20, 'split': 'train', 'loss': 9},
          {'step': 20, 'split': 'train', 'loss': 2.0}, {'step': 20, 'split': 'val', 'loss': 2.5}]
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.write('\n'.join(json.dumps(r) for r in rows) + '\n{"step": 30, "spl')   # truncated line
  got = runs.read_metrics(str(tmp_path))
  assert [(r['step'], r['split'], r['loss']) for r in got] == [
      (10, 'train', 3.0), (20, 'train', 2.0), (20, 'val', 2.5)]


def test_refuses_dirs_without_config_or_checkpoint(tmp_path):
  with pytest.raises(runs.RunError, match='config.json'):
    analyze_mode.run(str(tmp_path))
  with open(tmp_path / 'config.json', 'w') as f:
    f.write(scales.get_config('tiny').to_json())
  with pytest.raises(analyze.AnalysisError, match='no finished checkpoint'):
    analyze_mode.run(str(tmp_path))
  with pytest.raises(runs.RunError, match='no finished checkpoint'):
    runs.load_run(str(tmp_path))
  with pytest.raises(runs.RunError, match='not a directory'):
    runs.load_run(str(tmp_path / 'missing'))


# --------------------------------------------------------------------------------------------
# End to end: a tiny run, --mode=analyze, --mode=compare
# --------------------------------------------------------------------------------------------

TINY_RUN_OVERRIDES = dict(steps=6, batch_size=4, eval_every=6, checkpoint_every=6, log_every=3,
                          warmup_steps=2)


def tiny_run_config(variant='g1_elementwise'):
  import importlib  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(f'configs.{variant}').get_config('tiny')
  c.model.num_layers = 2
  c.data.update(seq_len=32, val_batches=2)
  c.train.update(TINY_RUN_OVERRIDES)
  return c


def make_tiny_run(workdir: str, analyse: bool = True) -> str:
  """Trains (once) a 6-step 2-layer G1 run in `workdir` and analyses it; returns workdir."""
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  if runs.latest_step(workdir) is None:
    loop.run(tiny_run_config(), workdir)
  if analyse and not os.path.isfile(os.path.join(workdir, 'analysis', 'report.json')):
    analyze_mode.run(workdir)
  return workdir


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  return make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=False)


def test_end_to_end_analyze_and_compare(tiny_run, tmp_path):
  report = analyze_mode.run(tiny_run, overrides={'data.val_batches': 3},
                            options={'attn_map_layers': '1'})
  out = os.path.join(tiny_run, 'analysis')
  for name in ('report.json', 'f_attn.png', 'm_act.png', 'gate.png', 'sparsity.png',
               'attention_maps.png', 'attention_maps.npz'):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, 'report.json')) as f:
    on_disk = json.load(f)
  assert on_disk == json.loads(json.dumps(report))
  for key in ('f_attn', 'f_attn_mean', 'm_act', 'm_act_mean', 'gate_score_mean', 'sparsity',
              'ppl'):
    assert key in on_disk, key
  L = 2
  assert len(on_disk['f_attn']) == L and all(0 <= x <= 1 for x in on_disk['f_attn'])
  assert isinstance(on_disk['f_attn_mean'], float)
  assert set(on_disk['m_act']) == set(metrics.M_ACT_SITES)
  assert all(len(v) == L for v in on_disk['m_act'].values())
  assert on_disk['m_act_mean'] == pytest.approx(np.mean(on_disk['m_act']['ffn_residual']))
  assert 0 < on_disk['gate_score_mean'] < 1
  assert set(on_disk['sparsity']) == {'pre_gate', 'post_gate'}
  assert len(on_disk['sparsity']['post_gate']['frac_below_1e-3']) == L
  assert on_disk['ppl'] > 1 and on_disk['ppl'] == pytest.approx(math.exp(on_disk['loss']))
  assert on_disk['num_batches'] == 3 and on_disk['step'] == 6
  assert on_disk['attn_map_layers'] == [1]
  with np.load(os.path.join(out, 'attention_maps.npz')) as z:
    assert z['maps'].shape == (L, 32, 32)

  # the checkpoint opened for notebooks; the attention map of typed text
  run = runs.load_run(tiny_run)
  assert run.step == 6 and run.config.variant == 'g1_elementwise' and run.metrics
  am = attention_maps.attention_map(run.model, run.tokenizer, 'hello')
  assert am['tokens'][0] == '<bos>' and len(am['tokens']) == 6
  assert am['maps'].shape == (L, 6, 6)
  np.testing.assert_allclose(am['maps'].sum(-1), 1.0, rtol=1e-5)

  # compare: the analysed run and a run known only by its metrics (the paper's table)
  other = tmp_path / 'baseline_run'
  other.mkdir()
  with open(other / 'config.json', 'w') as f:
    f.write(scales.get_config('tiny').to_json())
  with open(other / 'metrics.jsonl', 'w') as f:
    f.write(json.dumps({'step': 5, 'split': 'train', 'loss': 4.0}) + '\n')
    f.write(json.dumps({'step': 6, 'split': 'val', 'loss': 3.5, 'ppl': 33.1, 'f_attn': [0.4, 0.5],
                        'f_attn_mean': 0.45, 'm_act': [3.0, 5.0], 'm_act_mean': 4.0}) + '\n')
  out_dir = tmp_path / 'cmp'
  md = compare.compare([tiny_run, str(other)], str(out_dir))
  assert '| variant | gate score | M-Act | F-Attn | PPL |' in md
  row = next(l for l in md.splitlines() if l.startswith('| g1_elementwise '))
  assert f'{report["f_attn_mean"]:.3f}' in row and f'{report["ppl"]:.3f}' in row
  assert '| baseline* | - | 4.0 | 0.450 | 33.100 | 6 |' in md
  for name in ('compare.md', 'compare.json', 'f_attn_per_layer.png', 'm_act_per_layer.png',
               'loss_curves.png'):
    assert os.path.getsize(out_dir / name) > 0, name

  # the command line: main.py --mode=compare prints the same table
  res = subprocess.run([sys.executable, 'main.py', '--mode=compare', tiny_run, str(other),
                        f'--out={tmp_path / "cmp2"}'], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert '| baseline* | - | 4.0 | 0.450 | 33.100 | 6 |' in res.stdout


def test_analysis_after_training_equals_mode_analyze(tmp_path):
  """`--mode=train --analyze` (loop.run's on_finish: the parameters in memory, the training's
  factory and data) writes what a separate --mode=analyze of the final checkpoint writes, to
  the bit; an interrupted or unfinished run is not analysed."""
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  cfg = tiny_run_config()
  cfg.train.steps = 3
  calls = []

  def on_finish(finished):
    calls.append(finished.step)
    analyze_mode.after_training(finished)
  loop.run(cfg, workdir, on_finish=on_finish)
  assert calls == [3] and runs.latest_step(workdir) == 3   # the last step is always saved
  in_training = os.path.join(workdir, 'analysis')
  with open(os.path.join(in_training, 'report.json')) as f:
    first = json.load(f)
  separate = analyze_mode.run(workdir, out_dir=str(tmp_path / 'separate'))
  with open(tmp_path / 'separate' / 'report.json') as f:
    second = json.load(f)
  assert first == second == json.loads(json.dumps(separate))
  assert first['step'] == 3 and first['num_batches'] == 2
  for name in ('attention_maps.npz',):
    with np.load(os.path.join(in_training, name)) as a, \
         np.load(tmp_path / 'separate' / name) as b:
      for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
  assert sorted(os.listdir(in_training)) == sorted(os.listdir(tmp_path / 'separate'))

  # more steps asked of a stopped run: it trains on; stopped by a signal before the end, no call
  cfg.train.steps = 6
  calls.clear()
  real_train = loop._train

  def interrupted(run, interrupt):
    interrupt.signal = 15
    return real_train(run, interrupt)
  loop._train = interrupted
  try:
    loop.run(cfg, workdir, on_finish=on_finish)
  finally:
    loop._train = real_train
  assert calls == [] and runs.latest_step(workdir) == 3
