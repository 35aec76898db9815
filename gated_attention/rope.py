"""Rotary position embeddings (non-interleaved "rotate half" layout, as Qwen/LLaMA), with YaRN.

YaRN (Peng et al., 2023) as in the Hugging Face implementation: frequencies whose wavelength is
shorter than original_max_len / beta_fast are kept, those longer than original_max_len / beta_slow
are divided by `factor`, a linear ramp blends between; sin/cos are scaled by
0.1 * ln(factor) + 1 (the attention temperature).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from gated_attention.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Context extension: 'none', or YaRN by `factor` over `original_max_len` positions."""
  type: str = 'none'
  factor: float = 1.0
  original_max_len: int = 4096


def inverse_frequencies(head_dim: int, base: float, scaling=None) -> tuple[np.ndarray, float]:
  """Returns (inv_freq [head_dim // 2] float64, attention scale for sin/cos). `scaling`: None,
  a RopeScaling or a dict with its fields."""
  if isinstance(scaling, RopeScaling):
    scaling = dataclasses.asdict(scaling)
  if head_dim % 2:
    raise ConfigError(f'config.model.head_dim={head_dim} must be even for RoPE.')
  inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  kind = 'none' if scaling is None else scaling.get('type', 'none')
  if kind == 'none':
    return inv_freq, 1.0
  if kind != 'yarn':
    raise ConfigError(f'config.model.rope_scaling.type={kind!r} is not one of none, yarn.')
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


@dataclasses.dataclass(frozen=True)
class RoPE:
  """`apply(x_BxTxNxd, positions_BxT)` rotates queries or keys. A hashable value (it lives in the
  model's graphdef); the frequencies are computed in float64 numpy when a function is traced."""
  head_dim: int
  base: float
  scaling: RopeScaling | None = None

  def __post_init__(self):
    if isinstance(self.scaling, dict):
      object.__setattr__(self, 'scaling', RopeScaling(**self.scaling))
    inverse_frequencies(self.head_dim, self.base, self.scaling)  # validates

  def apply(self, x_BxTxNxd: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    inv_freq, mscale = inverse_frequencies(self.head_dim, self.base, self.scaling)
    angles_BxTxh = positions_BxT[..., None].astype(jnp.float32) * inv_freq.astype(np.float32)
    sin = (jnp.sin(angles_BxTxh) * mscale)[:, :, None, :]
    cos = (jnp.cos(angles_BxTxh) * mscale)[:, :, None, :]
    x1, x2 = jnp.split(x_BxTxNxd.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxTxNxd.dtype)
