"""The model's configuration as a frozen, typed value, built once from the run config.

    model_cfg = ModelConfig.from_config(config.model)            # ml_collections -> typed
    model = Transformer(model_cfg, rngs=nnx.Rngs(0))

The run config (gated_attention/config/, an ml_collections ConfigDict, saved as RUN/config.json) is what
users edit; `ModelConfig.from_config` turns its `model` section into this frozen dataclass at
the boundary (train.Setup, the analysis, the import), resolving what depends on context (the
FFN width with `ffn_match_baseline`, the MoE grouped-matmul kernel for the platform) and
validating every field in one place, with messages that name the --config field. Modules take
a ModelConfig; it is hashable, so a model's graphdef is too and compiled functions cache on it.

The dataclasses are also the `model` section's one schema: gated_attention/config/schema.py builds the section
from `config_defaults()` (ModelConfig's fields, with GateSpec, MoESpec, RopeScaling and
DeltaNetSpec as its gate, moe, rope_scaling and deltanet sections, and RESOLVED_KEYS), so each field, its default and its
comment are written once, here; each field's metadata says whether a saved run may change it
(`free_fields`, read by runs/rundir.py). `from_config` refuses keys it does not know, by name.
"""

import dataclasses

import jax
import jax.numpy as jnp

from gated_attention.model import attention_kernels
from gated_attention.errors import ConfigError
from gated_attention.model.deltanet import DeltaNetSpec
from gated_attention.model.gating import GateSpec
from gated_attention.model.moe import MoESpec
from gated_attention.model.rope import RopeScaling

REMAT = ('none', 'full', 'save_attention', 'dots', 'dots_no_batch')
ATTENTION_IMPLS = attention_kernels.IMPLS  # auto | xla | cudnn | splash | blockwise | chunked
ROPE_SCALINGS = ('none', 'yarn')
LAYER_TYPES = ('full_attention', 'linear_attention')   # transformers' names (Qwen3-Next, Qwen3.5)
__all__ = ['ModelConfig', 'RopeScaling', 'dense_ffn_size', 'config_defaults', 'free_fields',
           'RESOLVED_KEYS']

# Field metadata: what a run directory's saved config may change (runs/rundir.py). A model field
# without it is fixed by the checkpoint: a resumption or an evaluation with another value is
# refused.
FREE_ON_RESUME = {'free': 'resume'}          # the checkpoint does not depend on it: a resumption
                                             # (and an evaluation) may change it
FREE_IN_EVALUATION = {'free': 'evaluation'}  # no parameter depends on it, but the run trained
                                             # with it: an evaluation may change it, a
                                             # resumption may not
NOT_IN_CONFIG = {'in_config': False}         # resolved by from_config, not a run-config key


def _section(spec, default, **metadata):
  """A field holding a section of the run config whose keys are the fields of the dataclass
  `spec` (the section's defaults are spec's, not `default`)."""
  return dataclasses.field(default=default, metadata=dict(metadata, section=spec))


# Keys of the run config's `model` section that are no ModelConfig field: from_config resolves
# each into the field named beside it (and the schema places the key after that field).
RESOLVED_KEYS = {
    # dense: narrow the FFN so a gated model keeps the baseline's size (dense_ffn_size)
    'ffn_match_baseline': (False, 'ffn_size'),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every setting of the decoder: the run config's `model` section (gated_attention/config/schema.py builds it
  from these fields and defaults, plus RESOLVED_KEYS; each scale then overrides a few). The
  defaults are the CPU-sized model that the `tiny` scale trains."""
  vocab_size: int = 384
  num_layers: int = 4
  hidden_size: int = 128
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  ffn_size: int = 384           # the dense SwiGLU width, after ffn_match_baseline (0 with MoE)
  tie_embeddings: bool = True
  qk_norm: bool = True
  sandwich_norm: bool = False
  norm_eps: float = 1e-6
  # The positions' encoding, which no parameter depends on: an evaluation may raise the base or
  # add YaRN (context extension, Qiu et al. 2025, Sec. 4.4).
  rope_base: float = dataclasses.field(default=10_000.0, metadata=FREE_IN_EVALUATION)
  rope_scaling: RopeScaling = _section(RopeScaling, RopeScaling(), **FREE_IN_EVALUATION)
  init_std: float = 0.02
  # compute dtype; parameters are always float32
  dtype: str = dataclasses.field(default='float32', metadata=FREE_ON_RESUME)
  # none | full | save_attention (full, but keep the splash kernel's output and
  # log-sum-exp) | dots (save matmul outputs) | dots_no_batch
  remat: str = dataclasses.field(default='none', metadata=FREE_ON_RESUME)
  # True: the blocks run in a loop (nnx.scan over the stacked [L, ...] parameters), so a
  # 48-layer model compiles like a 1-layer one. False: the same scan unrolled, one copy of the
  # block per layer: XLA fuses and schedules across layers and keeps no stacked per-layer
  # buffers (on CPU, 2 cores: ~10% faster steps for the 4-layer models of benchmarks/
  # shapes.py, same compile time); compile time grows with depth, so the paper's scales scan.
  # Parameters and checkpoints are the same either way, so a resumption may change it.
  scan_layers: bool = dataclasses.field(default=True, metadata=FREE_ON_RESUME)
  # auto (splash on TPU, cudnn on GPU where they fit, chunked / blockwise on CPU, else xla)
  # | xla | cudnn | splash (Pallas, TPU) | blockwise (pure-JAX online softmax) | chunked
  # (pure-JAX causal query chunks); gated_attention/model/attention_kernels.py
  attention_impl: str = dataclasses.field(default='auto', metadata=FREE_ON_RESUME)
  # splash / blockwise query tile, chunked query chunk (0: 512 splash, 128 blockwise and chunked)
  attention_block_q: int = dataclasses.field(default=0, metadata=FREE_ON_RESUME)
  # splash / blockwise key tile; both divide data.seq_len (splash: multiples of 128); capped at
  # data.seq_len
  attention_block_kv: int = dataclasses.field(default=0, metadata=FREE_ON_RESUME)
  # splash: one backward kernel (dq, dk, dv) instead of two
  attention_fused_bwd: bool = dataclasses.field(default=True, metadata=FREE_ON_RESUME)
  # where the model runs (from_config; '': JAX's default backend)
  platform: str = dataclasses.field(default='', metadata=NOT_IN_CONFIG)
  gate: GateSpec = _section(GateSpec, GateSpec())  # gating.py; the default is the ungated baseline
  # G1 sigmoid multiplicative gates computed from X (gate.position='g1', headwise or
  # elementwise, not head-shared): one matmul yields the queries and the gate's logits, as the
  # authors build it (gating.py); False: a separate projection (same numbers in float32).
  # Other gates always use the separate path. The parameters are the same either way (the gate
  # owns its kernel), so a resumption may change it.
  fused_gate_projection: bool = dataclasses.field(default=True, metadata=FREE_ON_RESUME)
  # moe.py; the section's num_experts=0 (its default) is a dense SwiGLU FFN: moe=None
  moe: MoESpec | None = _section(MoESpec, None)
  # The hybrids of Qwen3-Next / Qwen3.5 (beyond the paper; their attention layers carry the
  # paper's gate, `gate`): one entry per layer, full_attention (attention.py, with the gate) or
  # linear_attention (a Gated DeltaNet, deltanet.py, shaped by `deltanet`); () (the default):
  # every layer full attention, the paper's decoder. A periodic pattern (three linear layers,
  # then one attention layer) compiles as a scan over its periods (transformer.py).
  layer_types: tuple = ()
  deltanet: DeltaNetSpec = _section(DeltaNetSpec, DeltaNetSpec())
  # Partial RoPE: the share of head_dim that RoPE rotates (its first dims; the rest carry no
  # position), transformers' partial_rotary_factor (Qwen3-Next / Qwen3.5: 0.25). 1: all of it.
  rope_fraction: float = 1.0
  # Zero-centred RMSNorm: every RMSNorm of the decoder (blocks, final, QK-norm) scales by
  # 1 + w with w initialised to 0 (Qwen3-Next / Qwen3.5), instead of w initialised to 1.
  norm_zero_centered: bool = False

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
    if not isinstance(self.layer_types, tuple):
      object.__setattr__(self, 'layer_types', tuple(self.layer_types))
    unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
    if unknown:
      bad('layer_types', f'{unknown} are not layer types; each entry is one of '
          f'{", ".join(LAYER_TYPES)}.')
    if self.layer_types and len(self.layer_types) != self.num_layers:
      bad('layer_types', f'has {len(self.layer_types)} entries for num_layers={self.num_layers}: '
          'give one per layer, or () for every layer full attention.')
    if self.layer_types and 'full_attention' not in self.layer_types and self.gate.position != 'none':
      bad('gate.position', f'{self.gate.position!r} gates attention, and layer_types has no '
          'full_attention layer: set config.model.gate.position=none or add attention layers.')
    rotary = self.head_dim * self.rope_fraction
    if not 0 < self.rope_fraction <= 1 or rotary != int(rotary) or int(rotary) % 2:
      bad('rope_fraction', f'{self.rope_fraction} must be in (0, 1] and make head_dim x '
          f'rope_fraction an even number of dims (head_dim={self.head_dim}).')
    if self.rope_scaling.type not in ROPE_SCALINGS:
      bad('rope_scaling.type', f'{self.rope_scaling.type!r} is not one of '
          f'{", ".join(ROPE_SCALINGS)}.')
    for field in ('attention_fused_bwd', 'fused_gate_projection', 'scan_layers',
                  'norm_zero_centered'):
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
    backend). A key that is no field of the section (nor a RESOLVED_KEYS key) is refused by
    name; a field the section lacks takes its default."""
    platform = platform or jax.default_backend()
    m = m.to_dict() if hasattr(m, 'to_dict') else dict(m)
    _refuse_unknown('config.model', m, cls)
    sections = {}
    for name, spec in _sections(cls).items():
      sections[name] = dict(m.get(name) or {})
      _refuse_unknown(f'config.model.{name}', sections[name], spec)
    gate = GateSpec.from_config(sections['gate'])
    moe = None
    if sections['moe'].get('num_experts', MoESpec.num_experts) > 0:
      moe = MoESpec.from_config(sections['moe'], platform)
    plain = {k for k in _config_field_names(cls) if k not in sections and k not in RESOLVED_KEYS}
    m = dict(config_defaults()[0], **m)   # what dense_ffn_size reads, defaults included
    return cls(**{k: m[k] for k in plain - {'ffn_size'}},
               rope_scaling=RopeScaling(**sections['rope_scaling']),
               ffn_size=0 if moe else dense_ffn_size(m, gate),
               gate=gate, moe=moe, platform=platform,
               deltanet=DeltaNetSpec.from_config(sections['deltanet']))

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def is_hybrid(self) -> bool:
    """Whether some layers are Gated DeltaNets (`layer_types`)."""
    return 'linear_attention' in self.layer_types

  @property
  def layer_period(self) -> tuple[str, ...]:
    """The shortest run of layer types whose repetition is `layer_types` (the whole list when
    it does not repeat; ('full_attention',) for the paper's decoder): the unit the layer scan
    runs over (transformer.py)."""
    types = self.layer_types or ('full_attention',) * self.num_layers
    for p in range(1, self.num_layers + 1):
      if self.num_layers % p == 0 and types == types[:p] * (self.num_layers // p):
        return types[:p]
    return types

  @property
  def num_attention_layers(self) -> int:
    return self.num_layers if not self.layer_types else self.layer_types.count('full_attention')

  @property
  def pools_ffn_stats(self) -> bool:
    """Whether gradient accumulation gathers the FFNs' statistics over all micro-batches first
    (the MoE's global-batch load-balancing loss, Qiu et al. 2025, Sec. 3.1)."""
    return self.moe is not None and self.moe.pools_stats


def dense_ffn_size(m, gate: GateSpec | None = None) -> int:
  """The SwiGLU width of the `model` section `m`. With `ffn_match_baseline`, the FFN pays for
  the gate's parameters, so a gated dense model has the baseline's parameter count to within
  1.5 * D per layer (the paper shrinks the FFN of its gated dense models, Sec. 3; by how much
  it does not say). In a hybrid only the attention layers have a gate: every FFN pays its
  share of theirs."""
  if not m['ffn_match_baseline']:
    return m['ffn_size']
  gate = gate or GateSpec.from_config(m['gate'])
  gate_params = gate.num_params(hidden_size=m['hidden_size'], num_heads=m['num_heads'],
                                num_kv_heads=m['num_kv_heads'], head_dim=m['head_dim'])
  types = tuple(m.get('layer_types') or ())
  if types:
    gate_params = gate_params * types.count('full_attention') / len(types)
  return m['ffn_size'] - round(gate_params / (3 * m['hidden_size']))


def _sections(cls) -> dict:
  """{field name: the dataclass of that config section} of a schema dataclass."""
  return {f.name: f.metadata['section'] for f in dataclasses.fields(cls)
          if 'section' in f.metadata}


def _config_field_names(cls) -> list[str]:
  """The run-config keys of the schema dataclass `cls`, in order (RESOLVED_KEYS after the
  field each resolves into)."""
  names = []
  for f in dataclasses.fields(cls):
    if f.metadata.get('in_config', True):
      names.append(f.name)
    if cls is ModelConfig:
      names += [k for k, (_, into) in RESOLVED_KEYS.items() if into == f.name]
  return names


def _refuse_unknown(where: str, given: dict, cls):
  known = _config_field_names(cls)
  unknown = sorted(set(given) - set(known))
  if unknown:
    raise ConfigError(
        f'{where} has unknown field(s) {", ".join(unknown)}; known: {", ".join(known)}. Remove '
        'or rename them (a misspelling, or a config written by other code).')


def config_defaults(cls=None) -> tuple[dict, dict]:
  """(defaults, metadata) of the run config's `model` section (or of the section of the schema
  dataclass `cls`): the defaults as a nested dict keyed like the section, and {key: its field's
  metadata} (what a saved run may change; {} for RESOLVED_KEYS). The run config's schema builds its
  `model` section from the defaults."""
  cls = cls or ModelConfig
  fields = {f.name: f for f in dataclasses.fields(cls)}
  sections = _sections(cls)
  defaults, metadata = {}, {}
  for name in _config_field_names(cls):
    if name in sections:
      defaults[name], _ = config_defaults(sections[name])
      metadata[name] = dict(fields[name].metadata)
    elif name in fields:
      defaults[name], metadata[name] = fields[name].default, dict(fields[name].metadata)
    else:
      defaults[name], metadata[name] = RESOLVED_KEYS[name][0], {}
  return defaults, metadata


def free_fields(on: str) -> tuple[str, ...]:
  """The `model` fields (top-level keys; a section counts as a whole) that a saved run may
  change on `on`: 'resume' (FREE_ON_RESUME) or 'evaluation' (FREE_ON_RESUME and
  FREE_IN_EVALUATION)."""
  allowed = {'resume': ('resume',), 'evaluation': ('resume', 'evaluation')}[on]
  _, metadata = config_defaults()
  return tuple(k for k, meta in metadata.items() if meta.get('free') in allowed)
