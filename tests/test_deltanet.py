"""deltanet.py: chunked == recurrent == a float64 numpy token loop (tests/reference.py), document
restarts, the cache, and transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.errors import ConfigError
from gated_attention.model import deltanet
from gated_attention.model.context import Context
from tests import reference as ref
from tests.jax_helpers import perturb

B, T, D = 2, 19, 16
SPEC = deltanet.DeltaNetSpec(num_key_heads=2, num_value_heads=4, key_head_dim=8,
                             value_head_dim=6, conv_kernel=4, chunk_size=8)
# Documents starting at 0, 5 (inside the first chunk), 8 (a chunk's first token) and 13; the
# second sequence is one document.
SEGMENTS = np.array([[0] * 5 + [1] * 3 + [2] * 5 + [3] * 6, [0] * T], np.int32)


def _randn(seed, shape, scale=1.0):
  return np.asarray(scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32))


def _core_inputs(seed, H=4, dk=8, dv=6, strong_decay=False):
  q = np.asarray(deltanet.l2_normalize(_randn(seed, (B, T, H, dk)))) * dk ** -0.5
  k = np.asarray(deltanet.l2_normalize(_randn(seed + 1, (B, T, H, dk))))
  v = _randn(seed + 2, (B, T, H, dv))
  g = -np.abs(_randn(seed + 3, (B, T, H), 3.0 if strong_decay else 0.3))
  beta = 1 / (1 + np.exp(-_randn(seed + 4, (B, T, H))))
  state = _randn(seed + 5, (B, H, dk, dv), 0.5)
  return q, k, v, g, beta, state


@functools.partial(jax.jit, static_argnames=('chunk', 'with_segments'))
def _both_rules(q, k, v, g, beta, state, segments, chunk, with_segments):
  seg = segments if with_segments else None
  return (deltanet.chunked_delta_rule(q, k, v, g, beta, state, seg, chunk),
          deltanet.recurrent_delta_rule(q, k, v, g, beta, state, seg))


@pytest.mark.parametrize('with_segments', [False, True])
@pytest.mark.parametrize('chunk', [8, 64])
def test_chunked_equals_recurrent_equals_numpy(chunk, with_segments):
  q, k, v, g, beta, state = _core_inputs(0)
  (o_c, s_c), (o_r, s_r) = _both_rules(q, k, v, g, beta, state, SEGMENTS, chunk, with_segments)
  seg = SEGMENTS if with_segments else None
  o_ref, s_ref = ref.gated_delta_rule(*(np.float64(a) for a in (q, k, v, g, beta, state)),
                                      segment_ids_BxT=seg)
  for o, s in ((o_c, s_c), (o_r, s_r)):
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)
  assert np.abs(o_ref).max() > 0.1 and np.abs(s_ref).max() > 0.1      # not a test of zeros


def test_chunked_holds_under_strong_decay():
  """Decays that underflow within a chunk (exp(sum g) ~ 0) give no NaN and the same numbers."""
  q, k, v, g, beta, state = _core_inputs(10, strong_decay=True)
  (o_c, s_c), _ = _both_rules(q, k, v, g, beta, state, SEGMENTS, 8, True)
  o_ref, s_ref = ref.gated_delta_rule(*(np.float64(a) for a in (q, k, v, g, beta, state)),
                                      segment_ids_BxT=SEGMENTS)
  assert np.isfinite(o_c).all()
  np.testing.assert_allclose(o_c, o_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s_c, s_ref, rtol=1e-5, atol=1e-5)


def test_chunked_holds_for_repeated_keys_without_decay():
  """The hardest case for the chunk's triangular system: every key the same, beta near 1, no
  decay (the powers of A grow binomially; forward substitution does not form them)."""
  q, _, v, _, _, state = _core_inputs(30)
  k = np.broadcast_to(np.asarray(deltanet.l2_normalize(_randn(31, (1, 1, 4, 8)))), q.shape)
  g, beta = np.zeros(q.shape[:3], np.float32), np.full(q.shape[:3], 0.99, np.float32)
  (o_c, s_c), _ = _both_rules(q, np.array(k), v, g, beta, state, SEGMENTS, 8, True)
  o_ref, s_ref = ref.gated_delta_rule(*(np.float64(a) for a in (q, k, v, g, beta, state)),
                                      segment_ids_BxT=SEGMENTS)
  np.testing.assert_allclose(o_c, o_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s_c, s_ref, rtol=1e-5, atol=1e-5)


def test_chunked_gradients_equal_recurrent():
  q, k, v, g, beta, state = _core_inputs(20)
  w = _randn(26, (B, T, 4, 6))

  def loss(fn, *args):
    o, s = fn(*args)
    return jnp.sum(o * w) + jnp.sum(s ** 2)

  args = tuple(jnp.asarray(a) for a in (q, k, v, g, beta, state))
  chunked = functools.partial(deltanet.chunked_delta_rule, segment_ids_BxT=jnp.asarray(SEGMENTS),
                              chunk_size=8)
  recurrent = functools.partial(deltanet.recurrent_delta_rule,
                                segment_ids_BxT=jnp.asarray(SEGMENTS))
  grads_c = jax.jit(jax.grad(functools.partial(loss, chunked), argnums=tuple(range(6))))(*args)
  grads_r = jax.jit(jax.grad(functools.partial(loss, recurrent), argnums=tuple(range(6))))(*args)
  for gc, gr in zip(grads_c, grads_r):
    np.testing.assert_allclose(gc, gr, rtol=1e-4, atol=1e-5)
    assert np.abs(gr).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# The layer


def _layer(seed=0, spec=SPEC):
  layer = deltanet.GatedDeltaNet(spec, hidden_size=D, norm_eps=1e-6, init_std=0.3,
                                 dtype=jnp.float32, rngs=nnx.Rngs(seed))
  perturb(layer, seed + 100, scale=0.2)   # the norm's ones and the decay's init made generic
  return layer


@functools.partial(jax.jit, static_argnums=0)
def _run(graphdef, state, x, segments, kv, valid):
  layer = nnx.merge(graphdef, state)
  positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
  return layer(x, Context(positions, segment_ids_BxT=segments, kv=kv, valid_BxT=valid))


def _call(layer, x, segments=None, kv=None, valid=None):
  graphdef, state = nnx.split(layer)
  return _run(graphdef, state, jnp.asarray(x), segments, kv, valid)


def _params64(layer):
  return ref.to_float64(nnx.to_pure_dict(nnx.state(layer, nnx.Param)))


@pytest.mark.parametrize('impl', ['chunked', 'recurrent'])
@pytest.mark.parametrize('with_segments', [False, True])
def test_layer_equals_numpy(impl, with_segments):
  layer = _layer(1, dataclasses_replace(SPEC, impl=impl))
  x = _randn(2, (B, T, D))
  seg = jnp.asarray(SEGMENTS) if with_segments else None
  out, cache = _call(layer, x, seg)
  want, _ = ref.deltanet_layer(_params64(layer), x, SEGMENTS if with_segments else None)
  assert cache is None
  np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
  assert np.abs(want).max() > 0.05


def dataclasses_replace(spec, **kw):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(spec, **kw)


def test_document_in_a_packed_window_equals_the_document_alone():
  """Document masking: each document's outputs in the window are those of the document run by
  itself (its state and conv restart at its first token)."""
  layer = _layer(3)
  x = _randn(4, (B, T, D))
  out, _ = _call(layer, x, jnp.asarray(SEGMENTS))
  for start, end in ((0, 5), (5, 8), (8, 13), (13, 19)):
    alone, _ = _call(layer, x[:1, start:end])
    np.testing.assert_allclose(out[0, start:end], alone[0], rtol=2e-5, atol=2e-5)
  unmasked, _ = _call(layer, x)
  assert np.abs(np.asarray(unmasked)[0, 5:] - np.asarray(out)[0, 5:]).max() > 1e-3


def test_cache_continues_the_window():
  """Prefill 11 tokens then decode one token at a time == one call over the window == numpy with
  its cache; a padded tail (valid=False) leaves the cache as the valid prefix left it."""
  layer = _layer(5)
  x = _randn(6, (B, T, D))
  full, _ = _call(layer, x)
  cache = deltanet.init_cache(SPEC, B, jnp.float32)
  outs = []
  pre, cache = _call(layer, x[:, :11], kv=cache)
  outs.append(pre)
  for t in range(11, T):
    o, cache = _call(layer, x[:, t:t + 1], kv=cache)
    outs.append(o)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=2e-5, atol=2e-5)
  _, ref_cache = ref.deltanet_layer(_params64(layer), x)
  for name in ('conv_q', 'conv_k', 'conv_v', 'state'):
    np.testing.assert_allclose(cache[name], ref_cache[name], rtol=2e-5, atol=2e-5)

  # Sequence 0 has 7 valid tokens of a 11-token chunk, sequence 1 all 11.
  valid = jnp.asarray(np.arange(11)[None, :] < np.array([[7], [11]]))
  padded_x = np.where(np.asarray(valid)[..., None], x[:, :11], _randn(7, (B, 11, D)))
  _, cache_pad = _call(layer, padded_x, kv=deltanet.init_cache(SPEC, B, jnp.float32),
                       valid=valid)
  _, cache7 = _call(layer, x[:1, :7], kv=deltanet.init_cache(SPEC, 1, jnp.float32))
  _, cache11 = _call(layer, x[1:, :11], kv=deltanet.init_cache(SPEC, 1, jnp.float32))
  for name in ('conv_q', 'conv_k', 'conv_v', 'state'):
    np.testing.assert_allclose(cache_pad[name][0], cache7[name][0], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cache_pad[name][1], cache11[name][0], rtol=2e-5, atol=2e-5)


def test_spec_validation():
  with pytest.raises(ConfigError, match='num_value_heads.*multiple of num_key_heads'):
    deltanet.DeltaNetSpec(num_key_heads=3, num_value_heads=4)
  with pytest.raises(ConfigError, match='impl'):
    deltanet.DeltaNetSpec(impl='fast')
  with pytest.raises(ConfigError, match='chunk_size'):
    deltanet.DeltaNetSpec(chunk_size=0)
  layer = _layer(0)
  n = sum(int(p.size) for p in jax.tree_util.tree_leaves(nnx.state(layer, nnx.Param)))
  assert n == SPEC.num_params(D)


# ----------------------------------------------------------------------------------------------
# transformers' layers (float32, random weights)


def _hf_config(cls_name):
  import transformers  # pylint: disable=g-import-not-at-top
  kw = dict(hidden_size=D, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=8, linear_num_key_heads=SPEC.num_key_heads,
            linear_num_value_heads=SPEC.num_value_heads, linear_key_head_dim=SPEC.key_head_dim,
            linear_value_head_dim=SPEC.value_head_dim, linear_conv_kernel_dim=SPEC.conv_kernel,
            rms_norm_eps=1e-6, vocab_size=32)
  return getattr(transformers, cls_name)(**kw)


def _from_hf(layer, hf, packed: bool):
  """The HF layer's weights into `layer` (Qwen3.5's split projections, or Qwen3-Next's per key
  head packing when `packed`)."""
  Kh, Hv, dk, dv, W = (SPEC.num_key_heads, SPEC.num_value_heads, SPEC.key_head_dim,
                       SPEC.value_head_dim, SPEC.conv_kernel)
  G = Hv // Kh
  t = lambda p: p.detach().numpy().astype(np.float32)  # noqa: E731
  if packed:
    qkvz = t(hf.in_proj_qkvz.weight).reshape(Kh, 2 * dk + 2 * G * dv, D)
    ba = t(hf.in_proj_ba.weight).reshape(Kh, 2 * G, D)
    wq, wk = qkvz[:, :dk], qkvz[:, dk:2 * dk]
    wv, wz = qkvz[:, 2 * dk:2 * dk + G * dv], qkvz[:, 2 * dk + G * dv:]
    wb, wa = ba[:, :G], ba[:, G:]
    wq, wk = (w.reshape(Kh * dk, D) for w in (wq, wk))
    wv, wz = (w.reshape(Hv * dv, D) for w in (wv, wz))
    wb, wa = (w.reshape(Hv, D) for w in (wb, wa))
  else:
    qkv = t(hf.in_proj_qkv.weight)
    wq, wk, wv = qkv[:Kh * dk], qkv[Kh * dk:2 * Kh * dk], qkv[2 * Kh * dk:]
    wz, wb, wa = t(hf.in_proj_z.weight), t(hf.in_proj_b.weight), t(hf.in_proj_a.weight)
  conv = t(hf.conv1d.weight)[:, 0, :].T                  # [W, C], channels q | k | v
  values = {
      'wq': wq.T.reshape(D, Kh, dk), 'wk': wk.T.reshape(D, Kh, dk),
      'wv': wv.T.reshape(D, Hv, dv), 'wz': wz.T.reshape(D, Hv, dv), 'wb': wb.T, 'wa': wa.T,
      'conv_q': conv[:, :Kh * dk].reshape(W, Kh, dk),
      'conv_k': conv[:, Kh * dk:2 * Kh * dk].reshape(W, Kh, dk),
      'conv_v': conv[:, 2 * Kh * dk:].reshape(W, Hv, dv),
      'A_log': t(hf.A_log), 'dt_bias': t(hf.dt_bias), 'norm': {'scale': t(hf.norm.weight)},
      'wo': t(hf.out_proj.weight).T.reshape(Hv, dv, D)}
  nnx.update(layer, nnx.State(jax.tree_util.tree_map(jnp.asarray, values)))


@pytest.mark.parametrize('cls_name,module,packed', [
    ('Qwen3NextConfig', 'qwen3_next.modeling_qwen3_next.Qwen3NextGatedDeltaNet', True),
    ('Qwen3_5TextConfig', 'qwen3_5.modeling_qwen3_5.Qwen3_5GatedDeltaNet', False)])
def test_matches_transformers(cls_name, module, packed):
  """Random weights; 70 tokens (two of transformers' 64-token chunks); both our forms."""
  import importlib  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  mod_name, cls = module.rsplit('.', 1)
  hf_cls = getattr(importlib.import_module(f'transformers.models.{mod_name}'), cls)
  hf = hf_cls(_hf_config(cls_name), layer_idx=0).float().eval()
  with torch.no_grad():
    for p in (hf.dt_bias, hf.A_log, hf.norm.weight):
      p.add_(0.3 * torch.randn_like(p))
  x = _randn(8, (B, 70, D))
  with torch.no_grad():
    want = hf(torch.from_numpy(np.array(x))).numpy()
  for impl in ('chunked', 'recurrent'):
    layer = _layer(0, dataclasses_replace(SPEC, impl=impl))
    _from_hf(layer, hf, packed)
    out, _ = _call(layer, x)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
  assert np.abs(want).max() > 1e-2
