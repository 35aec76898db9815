"""attention.py: fused == explicit == numpy float64 reference, GQA head mapping, inspect stats."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.model import attention, attention_kernels
from tests import reference as ref
from gated_attention.model import layers
from gated_attention.model.context import Context
from tests.jax_helpers import model_config, perturb

B, T = 2, 8
TOL = dict(rtol=1e-4, atol=1e-4)


def _randn(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _f64(a):
  return np.asarray(a, np.float64)




def _jitted(module):
  """One compiled function running both paths: (fused out, stats), (explicit out, stats)."""
  graphdef, state = nnx.split(module)

  @jax.jit
  def both(state, x, pos):
    attn = nnx.merge(graphdef, state)
    (out_i, _), stats_i = layers.capture_stats(attn, x, Context(pos))
    return (attn(x, Context(pos))[0], {}), (out_i, stats_i)

  return lambda x, pos: both(state, x, pos)


@jax.jit
def _both_cores(q, k, v):
  return attention.explicit_attention(q, k, v), jax.nn.dot_product_attention(q, k, v,
                                                                              is_causal=True)


# --------------------------------------------------------------------------------------------
# The attention core
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('H,K', [(4, 2), (4, 4), (4, 1), (6, 2)])
def test_fused_equals_explicit_equals_reference(H, K):
  d = 8
  q, k, v = _randn(0, (B, T, H, d)), _randn(1, (B, T, K, d)), _randn(2, (B, T, K, d))
  q = q * 2.0                                              # peakier softmax
  (y_explicit, probs), y_fused = _both_cores(q, k, v)
  y_ref, probs_ref = ref.causal_gqa_attention(_f64(q), _f64(k), _f64(v))
  assert y_explicit.shape == (B, T, H, d) and probs.shape == (B, H, T, T)
  np.testing.assert_allclose(y_explicit, y_ref, **TOL)
  np.testing.assert_allclose(y_fused, y_ref, **TOL)
  np.testing.assert_allclose(probs, probs_ref, rtol=1e-5, atol=1e-6)
  probs = np.asarray(probs)
  assert np.all(probs[:, :, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)  # causal
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_gqa_head_mapping_is_group_major():
  """Query head h reads KV head h // G: give each KV head constant values c_j."""
  H, K, d = 6, 3, 4
  G = H // K
  c = np.array([1.0, -2.0, 5.0], np.float32)
  v = jnp.broadcast_to(jnp.asarray(c)[None, None, :, None], (B, T, K, d))
  q, k = _randn(3, (B, T, H, d)), _randn(4, (B, T, K, d))
  (y_explicit, probs), y_fused = _both_cores(q, k, v)
  for y in (y_explicit, y_fused):
    for h in range(H):
      np.testing.assert_allclose(y[:, :, h], c[h // G], rtol=1e-5)
  # and the scores: query head h must match KV head h // G's keys
  y_ref, probs_ref = ref.causal_gqa_attention(_f64(q), _f64(k), _f64(v))
  np.testing.assert_allclose(probs, probs_ref, rtol=1e-5, atol=1e-6)


def test_explicit_attention_is_causal():
  H, K, d = 4, 2, 8
  q, k, v = _randn(5, (1, T, H, d)), _randn(6, (1, T, K, d)), _randn(7, (1, T, K, d))
  (y0, _), f0 = _both_cores(q, k, v)
  t = 5
  k2 = k.at[:, t:].set(_randn(8, (1, T - t, K, d)))
  v2 = v.at[:, t:].set(_randn(9, (1, T - t, K, d)))
  (y1, _), f1 = _both_cores(q, k2, v2)
  for a, b in ((y0, y1), (f0, f1)):
    np.testing.assert_allclose(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert not np.allclose(a[:, t:], b[:, t:])


# --------------------------------------------------------------------------------------------
# Document masking (segment ids) and the fused cores, outputs and gradients
# --------------------------------------------------------------------------------------------

BOS = 9
# Window 0 starts inside a document (id 0), then two more begin: three documents. Window 1 starts
# with BOS (one document, id 1).
DOC_TOKENS = np.array([[3, 4, 5, BOS, 1, 2, 6, BOS, 7, 8, 1, 2],
                       [BOS, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]], np.int32)
DOC_IDS = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2], [1] * 12], np.int32)


def test_document_ids_count_bos_tokens():
  np.testing.assert_array_equal(attention_kernels.document_ids(jnp.asarray(DOC_TOKENS), BOS),
                                DOC_IDS)


def _qkv_dout(H, K, T, d=8, B=2):
  q, k, v = _randn(20, (B, T, H, d), 2.0), _randn(21, (B, T, K, d)), _randn(22, (B, T, K, d))
  return q, k, v, _randn(23, (B, T, H, d))


def _check_core(core, segment_ids, H=4, K=2, T=DOC_IDS.shape[1], tol=TOL):
  """core(q, k, v) against the float64 reference: outputs and the gradients of sum(out * dout)."""
  q, k, v, dout = _qkv_dout(H, K, T)
  out, vjp = jax.vjp(core, q, k, v)
  grads = vjp(dout)
  seg = None if segment_ids is None else np.asarray(segment_ids)
  want, _ = ref.causal_gqa_attention(_f64(q), _f64(k), _f64(v), seg)
  want_grads = ref.causal_gqa_attention_grads(_f64(q), _f64(k), _f64(v), _f64(dout), seg)
  np.testing.assert_allclose(out, want, **tol)
  for got, exp, name in zip(grads, want_grads, 'qkv'):
    np.testing.assert_allclose(got, exp, err_msg=f'd{name}', **tol)


DOC_CORES = {
    'explicit': lambda q, k, v, s: attention.explicit_attention(q, k, v, segment_ids_BxT=s)[0],
    'xla': lambda q, k, v, s: attention_kernels.attend(q, k, v, 'xla', s),
    # tiles of 4 queries x 6 keys: tiles straddle documents and the diagonal
    'blockwise': lambda q, k, v, s: attention_kernels.attend(q, k, v, 'blockwise', s,
                                                             block_q=4, block_kv=6),
    # chunks of 4 queries over T=12: three key prefixes (4, 8, 12), chunks straddle documents
    'chunked': lambda q, k, v, s: attention_kernels.attend(q, k, v, 'chunked', s, block_q=4),
}


@pytest.mark.parametrize('masked', [True, False], ids=['documents', 'causal'])
@pytest.mark.parametrize('core', list(DOC_CORES))
def test_core_matches_reference_with_gradients(core, masked):
  seg = jnp.asarray(DOC_IDS) if masked else None
  _check_core(jax.jit(lambda q, k, v: DOC_CORES[core](q, k, v, seg)), seg)


@pytest.mark.parametrize('H,K', [(6, 2), pytest.param(4, 4, marks=pytest.mark.slow),
                                 pytest.param(4, 1, marks=pytest.mark.slow)])
def test_blockwise_gqa_head_mapping(H, K):
  """Other head groupings, with tiles of 6 queries x 4 keys (the other way round)."""
  seg = jnp.asarray(DOC_IDS)
  _check_core(jax.jit(lambda q, k, v: attention_kernels.blockwise_attention(
      q, k, v, seg, block_q=6, block_kv=4)), seg, H=H, K=K)


@pytest.mark.parametrize('H,K', [(6, 2), (4, 1)])
def test_chunked_gqa_head_mapping(H, K):
  """Other head groupings (query chunks of 3) and MQA, with documents."""
  seg = jnp.asarray(DOC_IDS)
  _check_core(jax.jit(lambda q, k, v: attention_kernels.chunked_attention(
      q, k, v, seg, block_q=3)), seg, H=H, K=K)


@pytest.mark.parametrize('fused_bwd', [True, False], ids=['fused_bwd', 'dq_dkv_kernels'])
def test_splash_in_interpret_mode_matches_reference_with_gradients(fused_bwd):
  """Pallas splash attention, run by the Pallas interpreter on CPU: GQA, three documents in
  window 0, 128-token tiles (its minimum) over T=256, so tiles below the diagonal, on it, and
  skipped above it all occur; the fused backward kernel and the dq + dkv pair."""
  T = 256
  seg = np.zeros((2, T), np.int32)
  seg[0, 100:], seg[0, 200:], seg[1] = 1, 2, 1
  core = lambda q, k, v: attention_kernels.attend(  # noqa: E731
      q, k, v, 'splash', jnp.asarray(seg), block_q=128, block_kv=128, platform='cpu',
      fused_bwd=fused_bwd)
  _check_core(jax.jit(core), seg, T=T, tol=dict(rtol=2e-4, atol=2e-4))


def test_auto_choice_per_platform():
  choose = attention_kernels.choose
  assert choose('auto', 'tpu', jnp.bfloat16, 4096, 128, 0, 0) == 'splash'
  assert choose('auto', 'tpu', jnp.bfloat16, 100, 128, 0, 0) == 'xla'        # no 128-tile
  assert choose('auto', 'gpu', jnp.bfloat16, 4096, 128, 0, 0) == 'cudnn'
  assert choose('auto', 'gpu', jnp.float32, 4096, 128, 0, 0) == 'xla'        # cuDNN: 16-bit
  assert choose('auto', 'gpu', jnp.bfloat16, 4096, 256, 0, 0) == 'xla'       # head_dim > 128
  assert choose('auto', 'gpu', jnp.bfloat16, 4095, 128, 0, 0, masked=True) == 'xla'
  assert choose('auto', 'cpu', jnp.float32, 128, 32, 0, 0) == 'chunked'      # the tiny default
  assert choose('auto', 'cpu', jnp.float32, 100, 32, 0, 0) == 'chunked'      # one chunk of 100
  assert choose('auto', 'cpu', jnp.float32, 4096, 64, 0, 0) == 'chunked'
  assert choose('auto', 'cpu', jnp.float32, 8192, 64, 0, 0) == 'blockwise'   # linear memory
  assert choose('auto', 'cpu', jnp.float32, 1000, 32, 0, 0) == 'xla'         # 128 does not divide
  assert choose('blockwise', 'tpu', jnp.float32, 8, 32, 0, 0) == 'blockwise'  # explicit: kept


def test_bad_attention_settings_are_named():
  with pytest.raises(ValueError, match='attention_impl.*auto, xla, cudnn, splash, blockwise, ch'):
    model_config(ref.tiny_model_config('baseline', attention_impl='flash'))
  with pytest.raises(ValueError, match='attention_block_q'):
    model_config(ref.tiny_model_config('baseline', attention_block_q=-1))
  with pytest.raises(ValueError, match=r'blocks \(128, 128\) must divide the sequence length 200'):
    attention_kernels.check('blockwise', 200, 0, 0)
  with pytest.raises(ValueError, match='query chunk 128 must divide the sequence length 200'):
    attention_kernels.check('chunked', 200, 0, 0)
  attention_kernels.check('chunked', 256, 64, 7)                   # keys: whole prefixes
  with pytest.raises(ValueError, match='multiples of 128'):
    attention_kernels.check('splash', 256, 64, 128)
  attention_kernels.check('splash', 256, 0, 0)                     # 512 capped at 256: fine
  attention_kernels.check('xla', 200, 7, 7)                        # blocks do not matter


def test_document_mask_hides_other_documents():
  """Changing document 1 of window 0 (positions 3..6) changes nothing else in that window."""
  q, k, v, _ = _qkv_dout(4, 2, DOC_IDS.shape[1])
  seg = jnp.asarray(DOC_IDS)
  attend = jax.jit(lambda k, v: attention_kernels.attend(q, k, v, 'xla', seg))
  y0 = attend(k, v)
  y1 = attend(k.at[0, 3:7].add(1.0), v.at[0, 3:7].add(1.0))
  other = np.r_[0:3, 7:12]
  np.testing.assert_allclose(y1[0, other], y0[0, other], rtol=0, atol=1e-6)
  assert not np.allclose(y1[0, 3:7], y0[0, 3:7])
  np.testing.assert_array_equal(y1[1], y0[1])


# --------------------------------------------------------------------------------------------
# The attention module (projections, QK-norm, RoPE, gate hooks)
# --------------------------------------------------------------------------------------------

MODULE_CASES = {
    'qk_norm': dict(qk_norm=True),
    'no_qk_norm': dict(qk_norm=False),
    'mqa_yarn': dict(num_kv_heads=1, rope_scaling=dict(type='yarn', factor=4.0,
                                                       original_max_len=4096)),
    # gate switches that no config file uses
    'g4_after_qk_norm_rope': dict(gate=dict(position='g4', after_qk_norm_rope=True)),
    'g3_after_qk_norm_rope': dict(gate=dict(position='g3', after_qk_norm_rope=True,
                                            granularity='headwise')),
    'g3_headwise_no_qk_norm': dict(qk_norm=False, gate=dict(position='g3', granularity='headwise')),
    'g2_headwise_shared_logit': dict(gate=dict(position='g2', granularity='headwise',
                                               head_shared=True, shared_reduce='logit')),
    'g1_headshared_logit_silu': dict(gate=dict(position='g1', head_shared=True,
                                               shared_reduce='logit', activation='silu')),
    'g1_input_independent_headwise': dict(gate=dict(position='g1', input_dependent=False,
                                                    granularity='headwise')),
    'g5_input_independent_ns': dict(gate=dict(position='g5', input_dependent=False,
                                              activation='ns_sigmoid')),
    'g4_additive_silu': dict(gate=dict(position='g4', mode='additive', activation='silu')),
    # the blockwise core inside the module (tiles of 4 queries x 2 keys over T=8)
    'g1_blockwise': dict(attention_impl='blockwise', attention_block_q=4, attention_block_kv=2,
                         gate=dict(position='g1')),
    # 'auto' is chunked on CPU (one chunk at T=8): the other cores inside the module
    'g1_chunked': dict(attention_impl='chunked', attention_block_q=2, gate=dict(position='g1')),
    'g1_xla': dict(attention_impl='xla', gate=dict(position='g1')),
}


def _module_cfg(case):
  over = dict(MODULE_CASES[case])
  gate = over.pop('gate', {})
  scaling = over.pop('rope_scaling', None)
  cfg = ref.tiny_model_config('baseline', **over)
  cfg.gate.update(gate)
  if scaling:
    cfg.rope_scaling.update(scaling)
  return cfg


@pytest.fixture(scope='module')
def modules():
  cache = {}

  def get(case):
    if case not in cache:
      cfg = _module_cfg(case)
      attn = attention.Attention(model_config(cfg), rngs=nnx.Rngs(11))
      perturb(attn, seed=12)
      both = _jitted(attn)
      x = _randn(13, (B, T, cfg.hidden_size))
      pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
      params = ref.to_float64(nnx.to_pure_dict(nnx.state(attn, nnx.Param)))
      want, extras = ref.attention_layer(params, _f64(x), np.asarray(pos), cfg.to_dict())
      (out, stats), (out_i, stats_i) = both(x, pos)
      cache[case] = dict(cfg=cfg, attn=attn, x=x, pos=pos, params=params, want=want,
                         extras=extras, out=out, stats=stats, out_i=out_i, stats_i=stats_i)
    return cache[case]

  return get


@pytest.mark.parametrize('case', list(MODULE_CASES))
def test_attention_module_matches_reference(modules, case):
  m = modules(case)
  out, stats, out_i = m['out'], m['stats'], m['out_i']
  assert out.shape == m['x'].shape and stats == {}
  np.testing.assert_allclose(out, m['want'], **TOL)
  np.testing.assert_allclose(out_i, m['want'], **TOL)                     # explicit path
  np.testing.assert_allclose(out_i, out, rtol=1e-5, atol=1e-5)            # == fused path


@pytest.mark.parametrize('case', ['qk_norm', 'no_qk_norm', 'g1_headshared_logit_silu'])
def test_inspect_stats(modules, case):
  m = modules(case)
  stats = m['stats_i']
  probs = m['extras']['probs']                                            # [B, H, T, T]
  H = m['cfg'].num_heads
  assert stats['f_attn_H'].shape == (H,)
  np.testing.assert_allclose(stats['f_attn_H'], probs[:, :, 1:, 0].mean(axis=(0, 2)),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats['f_attn_H'], ref.f_attn_per_head(probs), rtol=1e-5, atol=1e-6)
  assert stats['attn_map'].shape == (T, T)
  np.testing.assert_allclose(stats['attn_map'], probs[0].mean(axis=0), rtol=1e-5, atol=1e-6)
  for key, y in (('sdpa_pre_gate', m['extras']['y_pre_gate']),
                 ('sdpa_post_gate', m['extras']['y_post_gate'])):
    a = np.abs(y)
    np.testing.assert_allclose(stats[key]['abs_mean'], a.mean(), rtol=1e-4)
    # thresholds: allow a float32 rounding flip of one element at most
    assert abs(float(stats[key]['frac_below_1e-2']) - (a < 1e-2).mean()) <= 1.0 / a.size
    assert abs(float(stats[key]['frac_below_1e-3']) - (a < 1e-3).mean()) <= 1.0 / a.size
  if m['cfg'].gate.position == 'none':
    assert 'gate' not in stats
    np.testing.assert_allclose(stats['sdpa_post_gate']['abs_mean'],
                               stats['sdpa_pre_gate']['abs_mean'])
  else:
    assert set(stats['gate']) == {'mean', 'frac_below_0.1', 'hist'}


def test_attention_map_is_truncated_to_attn_map_len(modules):
  m = modules('qk_norm')
  attn = attention.Attention(model_config(m['cfg']), rngs=nnx.Rngs(11))
  nnx.update(attn, nnx.state(m['attn'], nnx.Param))
  attn.attn_map_len = 3
  _, stats = layers.capture_stats(attn, m['x'], Context(m['pos']))
  assert stats['attn_map'].shape == (3, 3)        # the top-left corner of the full map
  np.testing.assert_allclose(stats['attn_map'], m['extras']['probs'][0].mean(axis=0)[:3, :3],
                             rtol=1e-5, atol=1e-6)


def test_attention_rejects_heads_not_multiple_of_kv_heads():
  cfg = ref.tiny_model_config('baseline', num_heads=6, num_kv_heads=4)
  with pytest.raises(ValueError, match='num_kv_heads'):
    attention.Attention(model_config(cfg), rngs=nnx.Rngs(0))


def test_softmax_scale_is_inverse_sqrt_head_dim():
  """Two keys whose scores differ by s: the probability ratio is exp(s / sqrt(d))."""
  d = 16
  q = jnp.zeros((1, 2, 1, d)).at[0, 1, 0, 0].set(3.0)
  k = jnp.zeros((1, 2, 1, d)).at[0, 0, 0, 0].set(1.0)
  v = jnp.eye(2, d)[None, :, None, :]
  _, probs = attention.explicit_attention(q, k, v)
  p = np.asarray(probs[0, 0, 1])
  np.testing.assert_allclose(p[0] / p[1], math.exp(3.0 / math.sqrt(d)), rtol=1e-5)


# --------------------------------------------------------------------------------------------
# The gate fused with the query projection (gating.GateSpec.fuses_with_query)
# --------------------------------------------------------------------------------------------

FUSING = ('g1_elementwise', 'g1_headwise')


@pytest.mark.parametrize('variant', ref.gated_variant_names())
def test_only_g1_sigmoid_gates_from_x_fuse_with_the_query_projection(variant):
  cfg = model_config(ref.tiny_model_config(variant))
  attn = attention.Attention(cfg, rngs=nnx.Rngs(0))
  assert cfg.fused_gate_projection                                  # the default
  assert attn.fused_gate == (variant in FUSING)
  if variant not in FUSING and attn.gate.spec.has_params:
    with pytest.raises(ValueError, match='does not fuse'):
      attn.gate.query_columns()


def test_fused_gate_projection_must_be_a_bool():
  m = ref.tiny_model_config('g1_elementwise').to_dict()
  m['fused_gate_projection'] = 'yes'                   # e.g. a hand-edited config.json
  with pytest.raises(ValueError, match=r'config\.model\.fused_gate_projection.*True or False'):
    model_config(m)


def _fused_and_separate(variant, dtype='float32'):
  """Attention with the fused and with the separate gate projection, same (perturbed) params."""
  mods = []
  for fused in (True, False):
    cfg = model_config(ref.tiny_model_config(variant, fused_gate_projection=fused, dtype=dtype))
    attn = attention.Attention(cfg, rngs=nnx.Rngs(3))
    perturb(attn, seed=4, scale=0.3)
    assert attn.fused_gate == fused
    mods.append(attn)
  return mods


@jax.jit
def _out_and_grads(graphdef, params, x, dout):
  """Attention output and the gradients of <output, dout> w.r.t. the parameters and x."""
  pos = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])

  def f(params, x):
    out = nnx.merge(graphdef, params)(x, Context(pos))[0]
    return jnp.sum(out.astype(jnp.float32) * dout), out
  (_, out), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, x)
  return out, grads


def _run(attn, x, dout):
  graphdef, params = nnx.split(attn, nnx.Param)
  return _out_and_grads(graphdef, params, x.astype(attn.dtype), dout)


@pytest.mark.parametrize('variant', FUSING)
def test_fused_gate_projection_equals_separate_in_float32(variant):
  fused, separate = _fused_and_separate(variant)
  D = fused.wq.shape[0]
  x, dout = _randn(5, (B, T, D)), _randn(6, (B, T, D))
  out_f, grads_f = _run(fused, x, dout)
  out_s, grads_s = _run(separate, x, dout)
  flat_f, flat_s = jax.tree.leaves((out_f, grads_f)), jax.tree.leaves((out_s, grads_s))
  assert len(flat_f) == len(flat_s) == 9                  # out; q k v o, 2 norms, gate; x
  for a_f, a_s in zip(flat_f, flat_s):                    # float32 rounding apart
    np.testing.assert_allclose(a_f, a_s, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(a_s))))
  gate_grad = grads_f[0]['gate']['kernel'][...]
  assert float(np.max(np.abs(gate_grad))) > 1e-3                   # the gate is trained


@pytest.mark.parametrize('variant', FUSING)
def test_fused_gate_projection_in_bfloat16_is_close_to_float32(variant):
  ref32, _ = _fused_and_separate(variant)
  bf16, _ = _fused_and_separate(variant, dtype='bfloat16')
  D = ref32.wq.shape[0]
  x, dout = _randn(5, (B, T, D)), _randn(6, (B, T, D))
  out_32, grads_32 = _run(ref32, x, dout)
  out_16, grads_16 = _run(bf16, x, dout)
  assert out_16.dtype == jnp.bfloat16
  for a, b in zip(jax.tree.leaves((out_16, grads_16)), jax.tree.leaves((out_32, grads_32))):
    a, b = _f64(a.astype(jnp.float32)), _f64(b)
    assert np.max(np.abs(a - b)) <= 3e-2 * np.max(np.abs(b)) + 1e-6


@pytest.mark.parametrize('variant', FUSING)
def test_fused_gate_projection_is_one_matmul_fewer(variant):
  counts = []
  for attn in _fused_and_separate(variant):
    x = _randn(5, (B, T, attn.wq.shape[0]))
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    counts.append(str(jax.make_jaxpr(lambda x: attn(x, Context(pos))[0])(x)).count('dot_general'))
  assert counts[0] == counts[1] - 1
