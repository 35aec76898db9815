"""Rotary position embeddings (non-interleaved "rotate half" layout, as Qwen/LLaMA), with YaRN.

YaRN (Peng et al., 2023) as in the Hugging Face implementation: frequencies whose wavelength is
shorter than original_max_len / beta_fast are kept, those longer than original_max_len / beta_slow
are divided by `factor`, a linear ramp blends between; sin/cos are scaled by
0.1 * ln(factor) + 1 (the attention temperature).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, base: float, scaling=None) -> tuple[np.ndarray, float]:
  """Returns (inv_freq [head_dim // 2] float64, attention scale for sin/cos)."""
  if head_dim % 2:
    raise ValueError(f'config.model.head_dim={head_dim} must be even for RoPE.')
  inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  kind = 'none' if scaling is None else scaling.get('type', 'none')
  if kind == 'none':
    return inv_freq, 1.0
  if kind != 'yarn':
    raise ValueError(f'config.model.rope_scaling.type={kind!r} is not one of none, yarn.')
  factor = float(scaling['factor'])
  orig = float(scaling['original_max_len'])
  beta_fast, beta_slow = 32.0, 1.0

  def dim_for_rotations(n_rot):  # the dimension index that completes n_rot rotations over orig
    return head_dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

  low = max(math.floor(dim_for_rotations(beta_fast)), 0)
  high = min(math.ceil(dim_for_rotations(beta_slow)), head_dim - 1)
  span = high - low if high != low else 1e-3  # as the reference implementation
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / span, 0, 1)
  extrapolate = 1.0 - ramp  # 1: keep the original frequency; 0: interpolate (divide by factor)
  inv_freq = inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate
  mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
  return inv_freq, mscale


class RoPE:
  """Precomputed frequencies; `apply(x_BxTxNxd, positions_BxT)` rotates queries or keys."""

  def __init__(self, head_dim: int, base: float, scaling=None):
    inv_freq, self.mscale = inverse_frequencies(head_dim, base, scaling)
    self.inv_freq = inv_freq.astype(np.float32)

  def apply(self, x_BxTxNxd: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    angles_BxTxh = positions_BxT[..., None].astype(jnp.float32) * self.inv_freq
    sin = (jnp.sin(angles_BxTxh) * self.mscale)[:, :, None, :]
    cos = (jnp.cos(angles_BxTxh) * self.mscale)[:, :, None, :]
    x1, x2 = jnp.split(x_BxTxNxd.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxTxNxd.dtype)
