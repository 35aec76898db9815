"""rope.py: rotate-half RoPE against numpy, the relative-position property, YaRN against HF."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention.model import rope
from tests import reference as ref

B, T, N, d = 2, 8, 3, 8


def _randn(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


YARN_CASES = [
    # (head_dim, base, factor, original_max_len)
    (8, 10_000.0, 4.0, 4096),          # the tiny shapes: the ramp covers dims 1..3
    (128, 10_000.0, 4.0, 4096),
    (128, 1_000_000.0, 4.0, 32_768),   # the paper's long-context setting: 32k -> 128k
    (64, 500_000.0, 8.0, 8192),
    (32, 10_000.0, 2.0, 64),
    (16, 10_000.0, 16.0, 1_000_000),   # ramp starts past the last dim: every frequency kept
]


@pytest.mark.parametrize('scaling', [None, {'type': 'none', 'factor': 1.0, 'original_max_len': 4096},
                                     {'type': 'yarn', 'factor': 4.0, 'original_max_len': 4096}])
def test_rope_apply_matches_numpy_rotate_half(scaling):
  r = rope.RoPE(d, 10_000.0, scaling)
  x = _randn(0, (B, T, N, d))
  pos = jax.random.randint(jax.random.key(1), (B, T), 0, 5000)   # arbitrary (also large) positions
  got = r.apply(x, pos)
  assert got.shape == x.shape and got.dtype == x.dtype
  inv_freq, mscale = ref.rope_parameters(d, 10_000.0, scaling)
  want = ref.apply_rope(np.asarray(x, np.float64), np.asarray(pos), inv_freq, mscale)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize('scaling', [None, {'type': 'yarn', 'factor': 4.0, 'original_max_len': 64}])
def test_constant_tables_are_the_tables_of_positions_0_to_T(scaling):
  """The constants a training window rotates with (float64 numpy, stored in float32) are the
  traced tables at positions 0 .. T-1, and rotating with them is `apply`."""
  r = rope.RoPE(d, 10_000.0, scaling)
  T_long = 1000                                     # large angles: float32 sin / cos differ a bit
  sin, cos = r.constant_tables(T_long)
  assert sin.shape == cos.shape == (1, T_long, 1, d // 2) and sin.dtype == np.float32
  traced = r.tables(jnp.arange(T_long)[None])
  np.testing.assert_allclose(sin, traced[0], atol=2e-4)
  np.testing.assert_allclose(cos, traced[1], atol=2e-4)
  inv_freq, mscale = ref.rope_parameters(d, 10_000.0, scaling)
  angles = np.arange(T_long)[:, None] * inv_freq
  np.testing.assert_allclose(sin[0, :, 0], np.sin(angles) * mscale, atol=1e-6)
  x = _randn(3, (B, T, N, d))
  np.testing.assert_allclose(r.rotate(x, *r.constant_tables(T)),
                             r.apply(x, jnp.broadcast_to(jnp.arange(T), (B, T))), atol=1e-5)


def test_rope_position_zero_is_identity_and_layout_is_rotate_half():
  r = rope.RoPE(d, 10_000.0)
  x = _randn(2, (1, 2, 1, d))
  out = np.asarray(r.apply(x, jnp.array([[0, 1]])))
  np.testing.assert_allclose(out[0, 0], x[0, 0], rtol=0, atol=1e-7)
  # rotate-half: dimension i pairs with i + d/2, rotated by angle pos * base^(-2i/d)
  x1, x2 = np.asarray(x[0, 1, 0, :d // 2], np.float64), np.asarray(x[0, 1, 0, d // 2:], np.float64)
  theta = 10_000.0 ** (-np.arange(0, d, 2) / d)
  np.testing.assert_allclose(out[0, 1, 0, :d // 2], x1 * np.cos(theta) - x2 * np.sin(theta), atol=1e-6)
  np.testing.assert_allclose(out[0, 1, 0, d // 2:], x2 * np.cos(theta) + x1 * np.sin(theta), atol=1e-6)


def test_rope_preserves_norm():
  r = rope.RoPE(d, 10_000.0)
  x = _randn(3, (B, T, N, d))
  pos = jnp.broadcast_to(jnp.arange(T) * 37, (B, T))
  np.testing.assert_allclose(jnp.linalg.norm(r.apply(x, pos), axis=-1),
                             jnp.linalg.norm(x, axis=-1), rtol=1e-5)


@pytest.mark.parametrize('scaling', [None, {'type': 'yarn', 'factor': 4.0, 'original_max_len': 64}])
def test_relative_position_property(scaling):
  """q.k after RoPE depends only on the position difference (times mscale^2 for YaRN)."""
  r = rope.RoPE(d, 10_000.0, scaling)
  q, k = _randn(4, (1, 1, 1, d)), _randn(5, (1, 1, 1, d))
  _, mscale = ref.rope_parameters(d, 10_000.0, scaling)

  def score(m, n):
    qm = r.apply(q, jnp.array([[m]]))
    kn = r.apply(k, jnp.array([[n]]))
    return float(jnp.sum(qm * kn))

  for delta in (0, 1, 5, 23):
    s = [score(n + delta, n) for n in (0, 3, 17, 100)]
    np.testing.assert_allclose(s, s[0], rtol=1e-4, atol=1e-4)
  assert abs(score(5, 0) - score(0, 5)) > 1e-3      # direction matters
  assert abs(score(1, 0) - score(7, 0)) > 1e-3      # and so does the distance
  np.testing.assert_allclose(score(0, 0), mscale ** 2 * float(jnp.sum(q * k)), rtol=1e-5)


@pytest.mark.parametrize('head_dim,base,factor,orig', YARN_CASES)
def test_yarn_matches_hugging_face(head_dim, base, factor, orig):
  got, mscale = rope.inverse_frequencies(
      head_dim, base, {'type': 'yarn', 'factor': factor, 'original_max_len': orig})
  want, want_mscale = ref.yarn_hf(head_dim, base, factor, orig, beta_fast=32, beta_slow=1)
  assert got.dtype == np.float64 and got.shape == (head_dim // 2,)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  assert mscale == pytest.approx(want_mscale, rel=1e-12)
  assert mscale == pytest.approx(0.1 * math.log(factor) + 1.0)


def test_yarn_interpolates_low_and_keeps_high_frequencies():
  plain, _ = rope.inverse_frequencies(128, 1e6)
  yarn, _ = rope.inverse_frequencies(128, 1e6, {'type': 'yarn', 'factor': 4.0,
                                                 'original_max_len': 32_768})
  ratio = plain / yarn
  assert ratio[0] == pytest.approx(1.0)                 # highest frequency kept
  assert ratio[-1] == pytest.approx(4.0)                # lowest frequency divided by the factor
  assert np.all(np.diff(ratio) >= -1e-12)               # monotone ramp in between


@pytest.mark.parametrize('scaling', [None, {'type': 'none', 'factor': 1.0, 'original_max_len': 4096},
                                     {'type': 'none', 'factor': 8.0, 'original_max_len': 4096},
                                     {'type': 'yarn', 'factor': 1.0, 'original_max_len': 4096}])
def test_factor_one_and_type_none_are_plain_rope(scaling):
  inv_freq, mscale = rope.inverse_frequencies(64, 10_000.0, scaling)
  np.testing.assert_allclose(inv_freq, 1.0 / 10_000.0 ** (np.arange(0, 64, 2) / 64), rtol=1e-14)
  assert mscale == 1.0


def test_rope_config_errors():
  with pytest.raises(ValueError, match='head_dim'):
    rope.inverse_frequencies(7, 10_000.0)
  with pytest.raises(ValueError, match='rope_scaling.type'):
    rope.inverse_frequencies(8, 10_000.0, {'type': 'linear', 'factor': 2.0, 'original_max_len': 8})
