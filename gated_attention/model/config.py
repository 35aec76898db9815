"""The model's configuration as a frozen, typed value, built once from the run config.

    model_cfg = ModelConfig.from_config(config.model)            # ml_collections -> typed
    model = Transformer(model_cfg, rngs=nnx.Rngs(0))

The run config (configs/base.py, an ml_collections ConfigDict, saved as RUN/config.json) is what
users edit; `ModelConfig.from_config` turns its `model` section into this frozen dataclass at
the boundary (train.Setup, the analysis, the import), resolving what depends on context (the
FFN width with `ffn_match_baseline`, the MoE grouped-matmul kernel for the platform) and
validating every field in one place, with messages that name the --config field. Modules take
a ModelConfig; it is hashable, so a model's graphdef is too and compiled functions cache on it.
"""

import dataclasses

import jax
import jax.numpy as jnp

from gated_attention.model import attention_kernels
from gated_attention.errors import ConfigError
from gated_attention.model.gating import GateSpec
from gated_attention.model.moe import MoESpec
from gated_attention.model.rope import RopeScaling

REMAT = ('none', 'full', 'save_attention', 'dots', 'dots_no_batch')
ATTENTION_IMPLS = attention_kernels.IMPLS  # auto | xla | cudnn | splash | blockwise | chunked
ROPE_SCALINGS = ('none', 'yarn')
__all__ = ['ModelConfig', 'RopeScaling', 'dense_ffn_size']


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every setting of the decoder (configs/base.py `model_config` documents each field)."""
  vocab_size: int
  num_layers: int
  hidden_size: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  ffn_size: int                 # the dense SwiGLU width, after ffn_match_baseline (0 with MoE)
  tie_embeddings: bool = True
  qk_norm: bool = True
  sandwich_norm: bool = False
  norm_eps: float = 1e-6
  rope_base: float = 10_000.0
  rope_scaling: RopeScaling = RopeScaling()
  init_std: float = 0.02
  dtype: str = 'float32'        # compute dtype; parameters are always float32
  remat: str = 'none'
  scan_layers: bool = True      # False: the layer loop unrolled (CPU-scale models: faster steps)
  attention_impl: str = 'auto'
  attention_block_q: int = 0    # splash / blockwise tiles (0: the kernel's default; capped at T)
  attention_block_kv: int = 0
  attention_fused_bwd: bool = True  # splash: one backward kernel for dq, dk, dv
  platform: str = ''            # where the model runs (from_config; '': JAX's default backend)
  gate: GateSpec = GateSpec()
  fused_gate_projection: bool = True  # queries and gate logits from one matmul where the gate fuses
  moe: MoESpec | None = None    # None: a dense SwiGLU FFN

  def __post_init__(self):
    def bad(field, msg):
      raise ConfigError(f'config.model.{field}: {msg}')
    for field in ('vocab_size', 'num_layers', 'hidden_size', 'num_heads', 'num_kv_heads',
                  'head_dim'):
      if getattr(self, field) < 1:
        bad(field, f'must be a positive integer, got {getattr(self, field)}.')
    if self.num_heads % self.num_kv_heads:
      bad('num_heads', f'{self.num_heads} must be a multiple of num_kv_heads='
          f'{self.num_kv_heads} (grouped-query attention).')
    if self.head_dim % 2:
      bad('head_dim', f'{self.head_dim} must be even for RoPE.')
    if self.moe is None and self.ffn_size < 1:
      bad('ffn_size', f'must be positive for a dense model, got {self.ffn_size}.')
    if self.remat not in REMAT:
      bad('remat', f'{self.remat!r} is not one of {", ".join(REMAT)}.')
    for field in ('attention_block_q', 'attention_block_kv'):
      if getattr(self, field) < 0:
        bad(field, f'must be 0 (the kernel\'s default) or positive, got {getattr(self, field)}.')
    if self.attention_impl not in ATTENTION_IMPLS:
      bad('attention_impl', f'{self.attention_impl!r} is not one of '
          f'{", ".join(ATTENTION_IMPLS)} (attention_kernels.py describes each).')
    if self.rope_scaling.type not in ROPE_SCALINGS:
      bad('rope_scaling.type', f'{self.rope_scaling.type!r} is not one of '
          f'{", ".join(ROPE_SCALINGS)}.')
    for field in ('attention_fused_bwd', 'fused_gate_projection', 'scan_layers'):
      if not isinstance(getattr(self, field), bool):
        bad(field, f'must be True or False, got {getattr(self, field)!r}.')
    try:
      jnp.dtype(self.dtype)
    except TypeError:
      bad('dtype', f'{self.dtype!r} is not a dtype (float32, bfloat16, ...).')
    self.gate.check_model(qk_norm=self.qk_norm)

  @classmethod
  def from_config(cls, m, *, platform: str | None = None) -> 'ModelConfig':
    """From the run config's `model` section (a ConfigDict or dict). `platform` picks the MoE
    grouped-matmul kernel and the attention kernel for 'auto' (default: JAX's default
    backend)."""
    platform = platform or jax.default_backend()
    m = m.to_dict() if hasattr(m, 'to_dict') else dict(m)
    gate = GateSpec.from_config(m['gate'])
    moe = None
    if m['moe']['num_experts'] > 0:
      moe = MoESpec.from_config(m['moe'], platform)
    fields = {f.name for f in dataclasses.fields(cls)} - {'gate', 'moe', 'rope_scaling',
                                                          'ffn_size', 'platform'}
    scaling = dict(m.get('rope_scaling') or {})
    return cls(**{k: m[k] for k in fields if k in m},
               rope_scaling=RopeScaling(**scaling),
               ffn_size=0 if moe else dense_ffn_size(m, gate),
               gate=gate, moe=moe, platform=platform)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def pools_ffn_stats(self) -> bool:
    """Whether gradient accumulation gathers the FFNs' statistics over all micro-batches first
    (the MoE's global-batch load-balancing loss, Qiu et al. 2025, Sec. 3.1)."""
    return self.moe is not None and self.moe.pools_stats


def dense_ffn_size(m, gate: GateSpec | None = None) -> int:
  """The SwiGLU width of the `model` section `m`. With `ffn_match_baseline`, the FFN pays for
  the gate's parameters, so a gated dense model has the baseline's parameter count to within
  1.5 * D per layer (the paper shrinks the FFN of its gated dense models, Sec. 3; by how much
  it does not say)."""
  if not m['ffn_match_baseline']:
    return m['ffn_size']
  gate = gate or GateSpec.from_config(m['gate'])
  gate_params = gate.num_params(hidden_size=m['hidden_size'], num_heads=m['num_heads'],
                                num_kv_heads=m['num_kv_heads'], head_dim=m['head_dim'])
  return m['ffn_size'] - round(gate_params / (3 * m['hidden_size']))
