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
  """Context extension: 'none', or YaRN by `factor` over `original_max_len` positions (the run
  config's `model.rope_scaling` section, field for field; gated_attention/config/schema.py builds it from these
  defaults)."""
  type: str = 'none'            # none | yarn (context extension, Qiu et al. 2025, Sec. 4.4)
  factor: float = 1.0           # yarn: the context extension factor
  original_max_len: int = 4096  # yarn: the context length the model was trained at


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
  """`apply(x_BxTxNxd, positions_BxT)` rotates queries or keys; `rotate(x, *tables(positions))`
  is the same with the sin / cos tables made once for several calls (`constant_tables` for the
  positions 0 .. T-1 of a training window). A hashable value (it lives in the model's
  graphdef); the frequencies are computed in float64 numpy when a function is traced.

  Partial RoPE (`fraction` < 1, config.model.rope_fraction; Qwen3-Next / Qwen3.5: 0.25): the
  first rotary_dim = fraction x head_dim dims are rotated, rotate-half within them, with the
  frequencies of a head of rotary_dim dims; the other dims pass through (transformers'
  partial_rotary_factor)."""
  head_dim: int
  base: float
  scaling: RopeScaling | None = None
  fraction: float = 1.0

  def __post_init__(self):
    if isinstance(self.scaling, dict):
      object.__setattr__(self, 'scaling', RopeScaling(**self.scaling))
    inverse_frequencies(self.rotary_dim, self.base, self.scaling)  # validates

  @property
  def rotary_dim(self) -> int:
    return int(round(self.head_dim * self.fraction))

  def tables(self, positions_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sin, cos) [B, T, 1, rotary_dim // 2] float32 (YaRN's scale folded in) for `rotate`, at
    any positions (a KV cache's)."""
    inv_freq, mscale = inverse_frequencies(self.rotary_dim, self.base, self.scaling)
    angles_BxTxh = positions_BxT[..., None].astype(jnp.float32) * inv_freq.astype(np.float32)
    sin = (jnp.sin(angles_BxTxh) * mscale)[:, :, None, :]
    cos = (jnp.cos(angles_BxTxh) * mscale)[:, :, None, :]
    return sin, cos

  def constant_tables(self, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """`tables` at positions 0 .. seq_len - 1, as constants [1, T, 1, head_dim // 2]
    (computed in float64, stored in float32): what every training and evaluation window uses
    (model.py). As constants they cost a read: computed in the graph, XLA fuses sin and cos into
    each rotation and evaluates them once per element of [B, T, N, head_dim], not of
    [T, head_dim / 2] (on CPU that made q and k's rotation 4x as slow, forward and backward;
    an optimization barrier does not stop it: XLA:CPU removes barriers before fusing)."""
    inv_freq, mscale = inverse_frequencies(self.rotary_dim, self.base, self.scaling)
    angles_Txh = np.arange(seq_len, dtype=np.float64)[:, None] * inv_freq
    table = lambda f: (f(angles_Txh) * mscale).astype(np.float32)[None, :, None, :]  # noqa: E731
    return table(np.sin), table(np.cos)

  @staticmethod
  def rotate(x_BxTxNxd: jax.Array, sin_BxTx1xh: jax.Array, cos_BxTx1xh: jax.Array) -> jax.Array:
    """Rotates queries or keys by the angles of `tables` (rotate-half layout, in float32): the
    first 2 x (the tables' last dim) dims of x, the rest unchanged (partial RoPE)."""
    rot = 2 * sin_BxTx1xh.shape[-1]
    x32 = x_BxTxNxd.astype(jnp.float32)
    x1, x2 = jnp.split(x32[..., :rot], 2, axis=-1)
    s, c = sin_BxTx1xh, cos_BxTx1xh
    parts = [x1 * c - x2 * s, x2 * c + x1 * s]
    if rot < x_BxTxNxd.shape[-1]:
      parts.append(x32[..., rot:])
    return jnp.concatenate(parts, axis=-1).astype(x_BxTxNxd.dtype)

  def apply(self, x_BxTxNxd: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    """Rotates queries or keys [B, T, N, head_dim] at `positions_BxT`."""
    return self.rotate(x_BxTxNxd, *self.tables(positions_BxT))
