"""layers.py (RMSNorm, SwiGLU MLP, embedding / tied head, init) against numpy float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention import layers, model
from tests import reference as ref

B, T, D, F, V = 2, 8, 32, 48, 61
TOL = dict(rtol=1e-5, atol=1e-5)


def _randn(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _f64(a):
  return np.asarray(a, np.float64)


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
