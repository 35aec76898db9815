"""layers.py (RMSNorm, SwiGLU MLP, embedding / tied head, init) against numpy float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.model import layers, transformer as model
from tests import reference as ref

B, T, D, F, V = 2, 8, 32, 48, 61
TOL = dict(rtol=1e-5, atol=1e-5)


def _randn(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _f64(a):
  return np.asarray(a, np.float64)


@pytest.mark.parametrize('w_shape', [(D, F), (D, 4, 8), (D,)])
def test_project_matches_numpy_einsum(w_shape):
  x, w = _randn(11, (B, T, D)), _randn(12, w_shape, 0.2)
  got = layers.project(x, w)
  want = np.einsum('btd,d...->bt...', _f64(x), _f64(w))
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, **TOL)
  # bfloat16 inputs, float32 accumulation (the fused query-and-gate projection)
  got16 = layers.project(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                         preferred_element_type=jnp.float32)
  assert got16.dtype == jnp.float32
  want16 = np.einsum('btd,d...->bt...', _f64(x.astype(jnp.bfloat16)), _f64(w.astype(jnp.bfloat16)))
  np.testing.assert_allclose(got16, want16, rtol=1e-4, atol=1e-4)


def test_project_in_and_gradients_match_numpy():
  """project_in contracts [.., H, d] with [H, d, D]; both projections' gradients (the weight
  gradient contracts the flattened tokens) match the float64 einsum's."""
  y, wo = _randn(13, (B, T, 4, 8)), _randn(14, (4, 8, D), 0.2)
  np.testing.assert_allclose(layers.project_in(y, wo),
                             np.einsum('bthk,hkd->btd', _f64(y), _f64(wo)), **TOL)
  x, w, ct = _randn(15, (B, T, D)), _randn(16, (D, 4, 8), 0.2), _randn(17, (B, T, D))

  def loss(x, w, wo):
    return jnp.sum(layers.project_in(jnp.tanh(layers.project(x, w)), wo) * ct)

  gx, gw, gwo = jax.grad(loss, argnums=(0, 1, 2))(x, w, wo)
  x64, w64, wo64, ct64 = map(_f64, (x, w, wo, ct))
  h = np.tanh(np.einsum('btd,dhk->bthk', x64, w64))
  dh = np.einsum('btd,hkd->bthk', ct64, wo64) * (1 - h ** 2)
  np.testing.assert_allclose(gwo, np.einsum('bthk,btd->hkd', h, ct64), **TOL)
  np.testing.assert_allclose(gw, np.einsum('btd,bthk->dhk', x64, dh), **TOL)
  np.testing.assert_allclose(gx, np.einsum('bthk,dhk->btd', dh, w64), **TOL)


@pytest.mark.parametrize('eps', [1e-6, 1e-2])
def test_rmsnorm_matches_numpy(eps):
  norm = layers.RMSNorm(D, eps=eps)
  norm.scale[...] = 1.0 + _randn(1, (D,), 0.3)                 # not the all-ones init
  x = _randn(2, (B, T, D), 3.0)
  got = norm(x)
  assert got.dtype == jnp.float32 and got.shape == (B, T, D)
  want = ref.rms_norm(_f64(x), _f64(norm.scale[...]), eps)
  np.testing.assert_allclose(got, want, **TOL)


def test_rmsnorm_bfloat16_input_computes_in_float32():
  norm = layers.RMSNorm(D, eps=1e-6)
  x = _randn(3, (B, T, D), 50.0).astype(jnp.bfloat16)
  got = norm(x)
  assert got.dtype == jnp.bfloat16
  want = ref.rms_norm(_f64(x), 1.0, 1e-6)
  np.testing.assert_allclose(_f64(got), want, rtol=1e-2, atol=1e-2)


def test_rmsnorm_axis_metadata():
  norm = layers.RMSNorm(8, eps=1e-6, axis_name='head_dim')
  assert norm.scale.get_metadata()['logical_axes'] == ('head_dim',)
  np.testing.assert_array_equal(norm.scale[...], np.ones(8))


def test_swiglu_mlp_matches_numpy():
  mlp = layers.MLP(D, F, std=0.2, dtype=jnp.float32, rngs=nnx.Rngs(0))
  assert mlp.wi_gate[...].shape == (D, F) and mlp.wi_up[...].shape == (D, F)
  assert mlp.wo[...].shape == (F, D)
  x = _randn(4, (B, T, D))
  got, aux = mlp(x)
  assert aux == {}
  want = ref.swiglu(_f64(x), _f64(mlp.wi_gate[...]), _f64(mlp.wi_up[...]), _f64(mlp.wo[...]))
  np.testing.assert_allclose(got, want, **TOL)
  # silu is applied to the gate branch, not the up branch
  swapped = ref.swiglu(_f64(x), _f64(mlp.wi_up[...]), _f64(mlp.wi_gate[...]), _f64(mlp.wo[...]))
  assert not np.allclose(got, swapped, rtol=1e-3, atol=1e-3)


def test_embedding_and_tied_head_match_numpy():
  emb = layers.Embed(V, D, std=0.5, dtype=jnp.float32, rngs=nnx.Rngs(1))
  table = _f64(emb.embedding[...])
  assert table.shape == (V, D)
  tokens = jax.random.randint(jax.random.key(5), (B, T), 0, V)
  h = emb(tokens)
  np.testing.assert_array_equal(h, ref.embed(table, tokens))
  x = _randn(6, (B, T, D))
  logits = model.Transformer.logits(x, emb.embedding[...].T)
  assert logits.shape == (B, T, V)
  np.testing.assert_allclose(logits, _f64(x) @ table.T, **TOL)


def test_embedding_compute_dtype():
  emb = layers.Embed(V, D, std=0.5, dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
  assert emb.embedding[...].dtype == jnp.float32            # parameters stay float32
  tokens = jnp.arange(T)[None]
  assert emb(tokens).dtype == jnp.bfloat16


def test_param_init_truncated_normal_with_axes():
  p = layers.param(nnx.Rngs(3), (256, 64), ('embed', 'mlp'), std=0.02)
  w = np.asarray(p[...])
  assert w.dtype == np.float32 and w.shape == (256, 64)
  assert p.get_metadata()['logical_axes'] == ('embed', 'mlp')
  assert np.abs(w).max() <= 2 * 0.02 + 1e-7                  # truncated at 2 std
  # truncated normal (-2, 2) has std 0.8796 of the untruncated one
  assert abs(w.std() / (0.02 * 0.8796) - 1) < 0.05
  assert abs(w.mean()) < 1e-3
