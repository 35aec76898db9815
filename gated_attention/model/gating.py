"""The gate: every gated-attention variant of Qiu et al. (2025) in one module.

    Y' = Y * act(X W)        (multiplicative)       Y' = Y + act(X W)   (additive)

X is the block's normalised input (the tensor that feeds Q, K, V); the gate is computed from it
in float32 (Qiu et al. 2025, Sec. 2.2, Eq. 5). Attention calls `gate(hook, y, x)` at each of its
hook points; only the hook that the spec resolves to acts, every other call returns `y`
unchanged, so attention.py calls the gate the same way for every variant and each variant is a
few lines of config (see configs/). With `inspect` set (model.inspect), the gate records its
scores' summary with `sow`.

Hooks (where attention calls the gate) and the tensors they see:
  'q', 'q_rope'  query projection, before / after QK-norm and RoPE   [B, T, H, d]   (G4)
  'k', 'k_rope'  key projection, before / after QK-norm and RoPE     [B, T, K, d]   (G3)
  'v'            value projection                                    [B, T, K, d]   (G2)
  'sdpa'         SDPA output, before W_O                             [B, T, H, d]   (G1)
  'out'          output of W_O                                       [B, T, D]      (G5)

Choices where the paper is silent (each is a config switch):
  * head-shared gates average post-activation scores over heads (`shared_reduce='score'`), or
    logits (`'logit'`); G2 head-shared (values) averages over the KV heads, the heads G2 has;
  * G3/G4 gate the projection output directly (`after_qk_norm_rope=False`), or after QK-norm
    and RoPE;
  * G5 gates the model dimension, which has no heads: headwise or head-shared G5 is rejected.
The gate has no bias (the authors widen a bias-free q_proj).

Fused with the query projection (`GateSpec.fuses_with_query`): a G1 sigmoid multiplicative gate
computed from X is, as the authors and Megatron build it, extra output columns of q_proj: one
matmul produces each head's queries and its gate logits together (here [q_h | g_h] per head, as
Qwen3-Next's q_proj; the authors' released checkpoints order them per KV group, hf/layout.py).
The parameters stay separate (checkpoints, hf/ and the sharding rules see the same `kernel`);
Attention asks the gate for its queries (`Gate.queries(x, W_q)`, for every variant: the plain
query projection unless the gate is `fused`), which concatenates `query_columns()` to the query
kernel per head at compute time, in the compute dtype with float32 accumulation, and Attention
passes the gate's share of the product back as `logits` at the 'sdpa' hook; the sigmoid and the
product stay in float32 as before. In float32 it computes the same function as the separate
projection, to rounding (tests/test_attention.py).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.errors import ConfigError
from gated_attention.model.layers import Inspectable, project

POSITIONS = ('none', 'g1', 'g2', 'g3', 'g4', 'g5')
PACKINGS = ('kv_group', 'head')
KINDS = ('gate', 'rmsnorm', 'silu_noparam')
ACTIVATIONS = {
    'sigmoid': jax.nn.sigmoid,
    'silu': jax.nn.silu,
    'ns_sigmoid': lambda z: 0.5 + 0.5 * jax.nn.sigmoid(z),  # non-sparse: in [0.5, 1]
    'identity': lambda z: z,
}
# Hook and the head count name of the gated tensor, per position (None: no head axis).
_SITES = {'g1': ('sdpa', 'heads'), 'g2': ('v', 'kv_heads'), 'g3': ('k', 'kv_heads'),
          'g4': ('q', 'heads'), 'g5': ('out', None)}


@dataclasses.dataclass(frozen=True)
class GateSpec:
  """The gate: the run config's `model.gate` section, field for field (gated_attention/config/ builds
  that section from these fields and defaults). The default, `position='none'`, is the ungated
  baseline."""
  # none | g1 (SDPA out) | g2 (value) | g3 (key) | g4 (query) | g5 (W_O out)
  position: str = 'none'
  # gate | rmsnorm (per-head RMSNorm of Y) | silu_noparam (SiLU(Y)); the last two G1 only
  kind: str = 'gate'
  granularity: str = 'elementwise'  # elementwise | headwise (one scalar per head)
  head_shared: bool = False     # average the per-head gate over heads and apply it to every head
  # head-shared: average post-activation scores ('score') or logits ('logit')
  shared_reduce: str = 'score'
  mode: str = 'multiplicative'  # multiplicative: Y * act(XW) | additive: Y + act(XW)
  activation: str = 'sigmoid'   # sigmoid | silu | ns_sigmoid (0.5 + 0.5 sigmoid) | identity
  input_dependent: bool = True  # False: a learnable zero-initialised parameter, no dependence on X
  # G3/G4 only: gate after QK-norm and RoPE instead of on the projection
  after_qk_norm_rope: bool = False
  # How a G1 gate computed from X is packed into a widened q_proj in Hugging Face checkpoints
  # (runs/hf/): kv_group (the authors' release: per KV group [G*d queries | G*g gate logits]) |
  # head (Qwen3-Next / Qwen3.5: [q_h | g_h] per query head, as the fused projection computes
  # it). The model computes the same function either way: the gate owns its kernel.
  packing: str = 'kv_group'

  def __post_init__(self):
    self.validate()

  @classmethod
  def from_config(cls, gate_cfg) -> 'GateSpec':
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(dict(gate_cfg)) - fields)
    if unknown:
      raise ConfigError(f'config.model.gate has unknown field(s) {unknown}; known: '
                        f'{", ".join(sorted(fields))}.')
    return cls(**dict(gate_cfg))

  def validate(self):
    """Rejects meaningless combinations, naming the config field (runs on construction)."""
    def bad(field, msg):
      raise ConfigError(f'config.model.gate.{field}: {msg}')
    choices = dict(position=POSITIONS, kind=KINDS, granularity=('elementwise', 'headwise'),
                   shared_reduce=('score', 'logit'), mode=('multiplicative', 'additive'),
                   activation=tuple(ACTIVATIONS), packing=PACKINGS)
    for field, allowed in choices.items():
      if getattr(self, field) not in allowed:
        bad(field, f'{getattr(self, field)!r} is not one of {", ".join(allowed)}.')
    if self.position == 'none':
      return
    if self.kind != 'gate' and self.position != 'g1':
      bad('kind', f'{self.kind!r} transforms the SDPA output, so it needs position g1, '
          f'not {self.position!r}.')
    if self.position == 'g5' and self.granularity == 'headwise':
      bad('granularity', 'G5 gates the model dimension, which has no heads; use elementwise.')
    if self.position == 'g5' and self.head_shared:
      bad('head_shared', 'G5 gates the model dimension, which has no heads; set it to False.')
    if self.after_qk_norm_rope and self.position not in ('g3', 'g4'):
      bad('after_qk_norm_rope', 'only G3 (keys) and G4 (queries) pass through QK-norm and '
          f'RoPE; set it to False for {self.position!r}.')

  def check_model(self, *, qk_norm: bool):
    """Rejects a gate that the rest of the model cancels: a headwise multiplicative gate on the
    raw query/key projection is undone by the per-head QK-norm that follows it."""
    if (qk_norm and self.hook in ('q', 'k') and self.granularity == 'headwise'
        and self.mode == 'multiplicative'):
      raise ConfigError('config.model.gate.granularity: a headwise multiplicative gate on the raw '
                        'query/key projection is cancelled by the per-head QK-norm that follows '
                        'it; set config.model.gate.after_qk_norm_rope=True or '
                        'config.model.qk_norm=False.')

  def param_shape(self, *, hidden_size: int, num_heads: int, num_kv_heads: int,
                  head_dim: int) -> tuple[str, tuple, tuple] | None:
    """(name, shape, logical axes) of the gate's one parameter, or None when it has none."""
    if not self.has_params:
      return None
    head_axis = _SITES[self.position][1]
    if head_axis is None:                                   # G5: [D]
      shape, axes = (hidden_size,), ('gate_out',)
    else:
      n = num_heads if head_axis == 'heads' else num_kv_heads
      shape, axes = (n, head_dim), (head_axis, 'head_dim')
    if self.kind == 'rmsnorm':                              # per-head RMSNorm with a learned scale
      return 'scale', shape, axes
    if self.granularity == 'headwise':                      # one scalar per head
      shape, axes = shape[:1], axes[:1]
    if self.input_dependent:
      return 'kernel', (hidden_size, *shape), ('embed', *axes)
    return 'bias', shape, axes                              # zero-initialised: sigmoid(0) = 0.5

  def num_params(self, **dims) -> int:
    """Parameters of one layer's gate (dims as for `param_shape`)."""
    p = self.param_shape(**dims)
    return 0 if p is None else math.prod(p[1])

  @property
  def hook(self) -> str | None:
    if self.position == 'none':
      return None
    hook = _SITES[self.position][0]
    return hook + '_rope' if self.after_qk_norm_rope else hook

  @property
  def has_params(self) -> bool:
    return self.position != 'none' and self.kind != 'silu_noparam'

  @property
  def fuses_with_query(self) -> bool:
    """Whether the gate's logits can come out of the query projection (module docstring):
    a per-head (not head-shared) sigmoid multiplicative G1 gate computed from X."""
    return (self.position == 'g1' and self.kind == 'gate' and self.mode == 'multiplicative'
            and self.activation == 'sigmoid' and self.input_dependent and not self.head_shared)


HIST_BINS = 20
HIST_RANGE = {'sigmoid': (0.0, 1.0), 'ns_sigmoid': (0.0, 1.0), 'silu': (-0.5, 2.5),
              'identity': (-3.0, 3.0)}


def summarize_scores(s: jax.Array, activation: str) -> dict:
  """Mean gate score, fraction below 0.1 and a histogram (out-of-range values clipped in)."""
  lo, hi = HIST_RANGE[activation]
  hist, _ = jnp.histogram(jnp.clip(s, lo, hi), bins=HIST_BINS, range=(lo, hi))
  return {'mean': jnp.mean(s), 'frac_below_0.1': jnp.mean(s < 0.1),
          'hist': hist.astype(jnp.float32) / s.size}


class Gate(Inspectable, nnx.Module):
  """One gate (or G1 non-linearity ablation) at the hook its spec names."""

  def __init__(self, spec: GateSpec, *, hidden_size: int, num_heads: int, num_kv_heads: int,
               head_dim: int, init_std: float, rngs: nnx.Rngs, norm_eps: float = 1e-6,
               fuse_with_query: bool = False):
    """`fuse_with_query`: config.model.fused_gate_projection; the gate then computes its logits
    in the query projection (`queries`) when `spec.fuses_with_query`."""
    self.spec = spec
    self.norm_eps = norm_eps
    self.fused = bool(fuse_with_query) and spec.fuses_with_query
    self.inspect = False
    p = spec.param_shape(hidden_size=hidden_size, num_heads=num_heads,
                         num_kv_heads=num_kv_heads, head_dim=head_dim)
    if p is None:
      return
    name, shape, axes = p
    if name == 'kernel':
      w = init_std * jax.random.truncated_normal(rngs.params(), -2, 2, shape)
      self.kernel = nnx.Param(w.astype(jnp.float32), logical_axes=axes)
    else:                                                   # rmsnorm scale: ones; bias: zeros
      init = jnp.ones if name == 'scale' else jnp.zeros
      setattr(self, name, nnx.Param(init(shape, jnp.float32), logical_axes=axes))

  def query_columns(self) -> jax.Array:
    """The kernel as extra query-projection columns per head, [D, H, d] (elementwise) or
    [D, H, 1] (headwise), for a gate that `spec.fuses_with_query`."""
    if not self.spec.fuses_with_query:
      raise ValueError(f'The gate {self.spec} does not fuse with the query projection.')
    kernel = self.kernel[...]
    return kernel if self.spec.granularity == 'elementwise' else kernel[..., None]

  def queries(self, x_BxTxD: jax.Array, wq_DxHxd: jax.Array,
              dtype) -> tuple[jax.Array, jax.Array | None]:
    """The query projection X W_q [B, T, H, d] in `dtype`, and, when the gate is `fused`, its
    float32 logits [B, T, H, n] (n = d elementwise, 1 headwise; else None) from the same matmul:
    one product with the per-head concatenation [W_q | W_gate] [D, H, d + n], inputs in `dtype`,
    float32 accumulation (as Qwen3-Next's widened q_proj and Megatron). Attention passes the
    logits back at the 'sdpa' hook (`__call__`)."""
    if not self.fused:
      return project(x_BxTxD, wq_DxHxd.astype(dtype)), None
    d = wq_DxHxd.shape[-1]
    w_DxHxE = jnp.concatenate([wq_DxHxd, self.query_columns()], axis=-1).astype(dtype)
    qg_BxTxHxE = project(x_BxTxD, w_DxHxE, preferred_element_type=jnp.float32)
    return qg_BxTxHxE[..., :d].astype(dtype), qg_BxTxHxE[..., d:]

  def logits(self, x_BxTxD: jax.Array) -> jax.Array:
    """XW (or the bias) in float32, shaped to broadcast against the gated tensor (headwise:
    a trailing axis of 1, the shape `query_columns` yields)."""
    if self.spec.input_dependent:
      logits = project(x_BxTxD.astype(jnp.float32), self.kernel[...])
    else:
      logits = self.bias[...][None, None]
    if self.spec.granularity == 'headwise':
      logits = logits[..., None]                            # broadcast over head_dim
    return logits

  def scores(self, x_BxTxD: jax.Array | None, logits: jax.Array | None = None) -> jax.Array:
    """act(XW) in float32, shaped to broadcast against the gated tensor; from `logits` when
    given (the fused query projection), else computed from `x_BxTxD`."""
    spec = self.spec
    logits = self.logits(x_BxTxD) if logits is None else logits.astype(jnp.float32)
    act = ACTIVATIONS[spec.activation]
    if not spec.head_shared:
      return act(logits)
    if spec.shared_reduce == 'logit':
      return act(jnp.mean(logits, axis=2, keepdims=True))
    return jnp.mean(act(logits), axis=2, keepdims=True)

  def __call__(self, hook: str, y: jax.Array, x_BxTxD: jax.Array,
               logits: jax.Array | None = None) -> jax.Array:
    """Gates `y` if `hook` is this gate's site (with `inspect`, sows the scores' summary).
    `logits`: the gate's logits from the fused query projection, or None (from `x_BxTxD`)."""
    spec = self.spec
    if hook != spec.hook:
      return y
    y32 = y.astype(jnp.float32)
    if spec.kind == 'silu_noparam':
      return jax.nn.silu(y32).astype(y.dtype)
    if spec.kind == 'rmsnorm':
      ms = jnp.mean(jnp.square(y32), axis=-1, keepdims=True)
      return (y32 * jax.lax.rsqrt(ms + self.norm_eps) * self.scale[...]).astype(y.dtype)
    s = self.scores(x_BxTxD, logits)
    if self.inspect:
      self.sow(nnx.Intermediate, 'gate', summarize_scores(s, spec.activation))
    out = y32 * s if spec.mode == 'multiplicative' else y32 + s
    return out.astype(y.dtype)
