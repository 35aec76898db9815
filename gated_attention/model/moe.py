"""Mixture-of-Experts feed-forward block (top-k softmax router + SwiGLU experts).

Routing: router logits are computed in float32 (`logits_NxE = x @ W_router`),
`probs = softmax(logits)`, the top-k experts of every token are selected and
(optionally, `cfg.moe.renormalize`) their probabilities renormalised to sum to 1.
The routed output is `sum_k w_k * SwiGLU_{e_k}(x)`; shared experts (one SwiGLU of
width `num_shared_experts * expert_ffn_size`) are added on top, with `shared_expert_gate` times a
per-token sigmoid(x w) (Qwen3-Next and Qwen3.5's sigmoid-gated shared expert). Parameters are
float32, expert matmuls run in `cfg.dtype`.

Dispatch (`cfg.moe.dispatch`):
  dropless  The N*K (token, expert) assignments are stably sorted by expert, the
            tokens gathered into that order and the experts applied as grouped
            matmuls (grouped_matmul.py: jax.lax.ragged_dot, or the Pallas megablox kernels
            on TPU; group sizes = per-expert counts). The outputs are weighted and
            scatter-added back to their tokens. All shapes are static (N*K rows), so it
            jits; nothing is dropped. Sharded over a mesh: moe_parallel.py.
  capacity  Every expert has C = ceil(capacity_factor * N * K / E) slots.
            PRIORITY RULE: assignments are ranked k-major, i.e. all tokens'
            top-1 choices first (in token order), then all top-2 choices, etc.
            An assignment's slot is the number of earlier-ranked assignments
            to the same expert (a cumsum of one-hots over that order); slots
            >= C are dropped (their weight is zeroed, the token keeps only its
            other experts and the shared/residual path). Kept tokens are
            scattered into an [E, C, D] buffer, the experts run as a batched
            SwiGLU and the results are gathered back.

The FFN interface (transformer.py): `moe(x) -> (y, aux)` with per-call auxiliary outputs, or
`moe(x, pooled=...)`; `reduce_aux(aux_L)` turns the layers' outputs into the training loss term
(the losses below times their coefficients) and the logged metrics; `pooled_stats(aux_L)` is
what gradient accumulation gathers over all micro-batches first (train.py) and the Block passes
back as `pooled` (from the call's context.Context).

Auxiliary losses (in `aux`, NOT multiplied by their coefficients):
  lb_loss        E * sum_e f_e * P_e with f_e the fraction of the K*N routed
                 assignments sent to expert e (stop-gradient; counted before any
                 capacity drops) and P_e the mean router probability.
                 'global' type: f and P are taken over ALL tokens of the call.
                 Under jit with a data-sharded batch the means are global across
                 data-parallel shards automatically, i.e. this is the global-batch
                 load-balancing loss (Qiu et al. 2025, Sec. 3.1), which (unlike the
                 per-sequence loss) lets experts specialise within a sequence. With
                 gradient accumulation the trainer passes `pooled` (f averaged over
                 all micro-batches, from each call's `load_E`) to use the whole
                 global batch's f. 'sequence' type: the same loss per sequence
                 (over its T tokens), averaged over sequences; `pooled` is unused.
  router_z_loss  mean over tokens of logsumexp(logits)^2.
Diagnostics: load_E (local f), prob_E (P), load_cv and load_max_over_mean of the
per-expert assignment counts, dropped_frac (0 for dropless).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model import grouped_matmul, moe_parallel, quantization
from gated_attention.model.layers import Inspectable
from gated_attention import sharding
from gated_attention.errors import ConfigError


def _param(rngs, shape, std, axes):
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32),
                   logical_axes=axes)


def _swiglu(x, wi_gate, wi_up, wo, dtype):
  """Dense SwiGLU: x [..., D] -> [..., D]."""
  h = jax.nn.silu(x @ wi_gate.astype(dtype)) * (x @ wi_up.astype(dtype))
  return h @ wo.astype(dtype)


def route(logits_NxE, top_k, renormalize):
  """Softmax router (float32): returns probs_NxE, weights_NxK, experts_NxK."""
  probs_NxE = jax.nn.softmax(logits_NxE.astype(jnp.float32), axis=-1)
  weights_NxK, experts_NxK = jax.lax.top_k(probs_NxE, top_k)
  if renormalize:
    weights_NxK = weights_NxK / jnp.sum(weights_NxK, axis=-1, keepdims=True)
  return probs_NxE, weights_NxK, experts_NxK


def capacity_slots(experts_NxK, num_experts, capacity):
  """Slot of every assignment under the k-major priority rule, and a keep mask.

  Returns slot_NxK (position within its expert's buffer) and keep_NxK
  (slot < capacity).
  """
  N, K = experts_NxK.shape
  onehot_KNxE = jax.nn.one_hot(experts_NxK.T.reshape(K * N), num_experts, dtype=jnp.int32)
  pos_KNxE = jnp.cumsum(onehot_KNxE, axis=0) - 1
  slot_KN = jnp.sum(pos_KNxE * onehot_KNxE, axis=-1)
  slot_NxK = slot_KN.reshape(K, N).T
  return slot_NxK, slot_NxK < capacity


@dataclasses.dataclass(frozen=True)
class MoESpec:
  """The MoE settings: the run config's `model.moe` section, field for field (gated_attention/config/schema.py
  builds that section from these fields and defaults), validated on construction. The defaults,
  `num_experts=0`, are a dense FFN: `ModelConfig.from_config` then builds no MoESpec (moe=None),
  and from a section with experts it resolves `grouped_matmul='auto'` for the platform."""
  num_experts: int = 0
  top_k: int = 0
  expert_ffn_size: int = 0
  num_shared_experts: int = 0
  renormalize: bool = False     # renormalise the selected top-k probabilities to sum to 1
  # The shared experts' output times sigmoid(x w), w [D] a learned per-token scalar gate
  # (Qwen3-Next / Qwen3.5 MoE: shared_expert_gate); needs num_shared_experts >= 1
  shared_expert_gate: bool = False
  lb_loss_coef: float = 1e-3
  lb_loss_type: str = 'global'  # global (statistics over the whole global batch) | sequence
  router_z_loss_coef: float = 1e-3
  dispatch: str = 'dropless'    # dropless (sorted tokens + ragged_dot) | capacity
  capacity_factor: float = 1.25
  # dropless grouped expert matmuls: auto (megablox on TPU meshes, else ragged_dot) |
  # ragged_dot | megablox (Pallas TPU kernels; ragged_dot's weight gradient is dense over all
  # experts on TPU). megablox tiles K/N by 128s, or whole when not a multiple of 128 (<= 2048).
  # A constructed MoESpec holds the resolved kernel (from_config), never 'auto'.
  grouped_matmul: str = 'auto'

  def __post_init__(self):
    def bad(field, msg):
      raise ConfigError(f'config.model.moe.{field}: {msg}')
    if not 1 <= self.top_k <= self.num_experts:
      bad('top_k', f'{self.top_k} must be in [1, num_experts={self.num_experts}].')
    if self.expert_ffn_size < 1:
      bad('expert_ffn_size', f'must be positive, got {self.expert_ffn_size}.')
    if self.shared_expert_gate and self.num_shared_experts < 1:
      bad('shared_expert_gate', 'gates the shared experts\' output, and num_shared_experts is '
          f'{self.num_shared_experts}: set num_shared_experts >= 1 or shared_expert_gate=False.')
    if self.dispatch not in ('dropless', 'capacity'):
      bad('dispatch', f'Unknown moe.dispatch {self.dispatch!r}; expected dropless or capacity.')
    if self.lb_loss_type not in ('global', 'sequence'):
      bad('lb_loss_type', f'Unknown moe.lb_loss_type {self.lb_loss_type!r}; expected global or '
          'sequence.')
    if self.grouped_matmul == 'auto' or self.grouped_matmul not in grouped_matmul.IMPLS:
      bad('grouped_matmul', f'{self.grouped_matmul!r} must be resolved (from_config) to one of '
          f'{", ".join(grouped_matmul.IMPLS[1:])}.')

  @classmethod
  def from_config(cls, moe_cfg, platform: str) -> 'MoESpec':
    m = dict(moe_cfg)
    m['grouped_matmul'] = grouped_matmul.resolve(m.get('grouped_matmul', 'auto'), platform)
    return cls(**m)

  @property
  def pools_stats(self) -> bool:
    """Whether gradient accumulation must gather the expert loads of all micro-batches first."""
    return self.lb_loss_type == 'global'


class MoE(Inspectable, nnx.Module):
  """Top-k routed SwiGLU experts (+ optional shared experts). See module doc."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    """`cfg`: a config.ModelConfig whose `moe` is set."""
    m = self.spec = cfg.moe
    self.inspect = False
    self.dtype = cfg.compute_dtype
    D, E, F, std = cfg.hidden_size, m.num_experts, m.expert_ffn_size, cfg.init_std
    self.router = _param(rngs, (D, E), std, ('embed', 'expert'))
    self.wi_gate = _param(rngs, (E, D, F), std, ('expert', 'embed', 'expert_mlp'))
    self.wi_up = _param(rngs, (E, D, F), std, ('expert', 'embed', 'expert_mlp'))
    self.wo = _param(rngs, (E, F, D), std, ('expert', 'expert_mlp', 'embed'))
    S = m.num_shared_experts * F
    if S:
      self.shared_wi_gate = _param(rngs, (D, S), std, ('embed', 'mlp'))
      self.shared_wi_up = _param(rngs, (D, S), std, ('embed', 'mlp'))
      self.shared_wo = _param(rngs, (S, D), std, ('mlp', 'embed'))
    if m.shared_expert_gate:
      self.shared_gate = _param(rngs, (D,), std, ('embed',))
    self.has_shared = bool(S)

  def _dropless(self, x_NxD, weights_NxK, experts_NxK):
    m, dt = self.spec, self.dtype
    if moe_parallel.active():  # sharded: per-shard sort, expert parallelism (moe_parallel.py)
      y_NxD = moe_parallel.dropless(
          x_NxD, weights_NxK, experts_NxK, self.wi_gate[...], self.wi_up[...], self.wo[...],
          num_experts=m.num_experts, dtype=dt, impl=m.grouped_matmul)
    else:
      y_NxD = grouped_matmul.sorted_swiglu(
          x_NxD, weights_NxK, experts_NxK, self.wi_gate[...].astype(dt),
          self.wi_up[...].astype(dt), self.wo[...].astype(dt), impl=m.grouped_matmul,
          all_experts=True)
    return y_NxD, jnp.zeros((), jnp.float32)

  def _capacity(self, x_NxD, weights_NxK, experts_NxK):
    N, K = experts_NxK.shape
    E, D, dt = self.spec.num_experts, x_NxD.shape[-1], self.dtype
    C = math.ceil(self.spec.capacity_factor * N * K / E)
    slot_NxK, keep_NxK = capacity_slots(experts_NxK, E, C)
    # Flat buffer index; dropped assignments go to a dummy row E*C.
    index_NxK = jnp.where(keep_NxK, experts_NxK * C + slot_NxK, E * C)
    buf = jnp.zeros((E * C + 1, D), dt).at[index_NxK].add(
        jnp.broadcast_to(x_NxD[:, None, :], (N, K, D)))
    x_ExCxD = buf[:E * C].reshape(E, C, D)
    h = (jax.nn.silu(jnp.einsum('ecd,edf->ecf', x_ExCxD, self.wi_gate[...].astype(dt)))
         * jnp.einsum('ecd,edf->ecf', x_ExCxD, self.wi_up[...].astype(dt)))
    y_ExCxD = jnp.einsum('ecf,efd->ecd', h, self.wo[...].astype(dt))
    y_flat = jnp.concatenate([y_ExCxD.reshape(E * C, D), jnp.zeros((1, D), dt)])
    w_NxK = jnp.where(keep_NxK, weights_NxK, 0.0).astype(dt)
    y_NxD = jnp.einsum('nkd,nk->nd', y_flat[index_NxK], w_NxK)
    return y_NxD, 1.0 - jnp.mean(keep_NxK.astype(jnp.float32))

  def __call__(self, x_BxTxD, pooled=None):
    """(y, aux); `pooled`: this layer's pooled_stats over all micro-batches (or None)."""
    m = self.spec
    B, T, D = x_BxTxD.shape
    N, E, K = B * T, m.num_experts, m.top_k
    x_NxD = quantization.linear_input(self, 'ffn_in', x_BxTxD.reshape(N, D))
    logits_NxE = x_NxD.astype(jnp.float32) @ self.router[...]
    probs_NxE, weights_NxK, experts_NxK = sharding.per_batch_shard(  # per token: split by batch
        route, logits_NxE, K, m.renormalize)

    x_c = x_NxD.astype(self.dtype)
    routed = self._dropless if m.dispatch == 'dropless' else self._capacity
    y_NxD, dropped_frac = routed(x_c, weights_NxK, experts_NxK)
    if self.has_shared:
      shared_NxD = _swiglu(x_c, self.shared_wi_gate[...], self.shared_wi_up[...],
                           self.shared_wo[...], self.dtype)
      if m.shared_expert_gate:      # sigmoid(x w) per token, in float32
        gate_N = jax.nn.sigmoid(x_NxD.astype(jnp.float32) @ self.shared_gate[...])
        shared_NxD = (shared_NxD * gate_N[:, None]).astype(self.dtype)
      y_NxD = y_NxD + shared_NxD
    aux = self._aux(logits_NxE, probs_NxE, experts_NxK, (B, T), pooled)
    aux['dropped_frac'] = dropped_frac
    return y_NxD.reshape(B, T, D).astype(x_BxTxD.dtype), aux

  def _aux(self, logits_NxE, probs_NxE, experts_NxK, batch_shape, global_load_E) -> dict:
    """Auxiliary losses and routing statistics (float32)."""
    (B, T), (N, E), K = batch_shape, probs_NxE.shape, experts_NxK.shape[1]
    onehot_NxE = jnp.sum(jax.nn.one_hot(experts_NxK, E, dtype=jnp.float32), axis=1)
    counts_E = jnp.sum(onehot_NxE, axis=0)
    load_E = counts_E / (N * K)
    prob_E = jnp.mean(probs_NxE, axis=0)
    if self.spec.lb_loss_type == 'global':
      f_E = load_E if global_load_E is None else global_load_E.astype(jnp.float32)
      lb_loss = E * jnp.sum(jax.lax.stop_gradient(f_E) * prob_E)
    else:
      f_BxE = jnp.sum(onehot_NxE.reshape(B, T, E), axis=1) / (T * K)
      P_BxE = jnp.mean(probs_NxE.reshape(B, T, E), axis=1)
      lb_loss = E * jnp.mean(jnp.sum(jax.lax.stop_gradient(f_BxE) * P_BxE, axis=-1))
    z = jax.nn.logsumexp(logits_NxE, axis=-1)
    mean_count = jnp.mean(counts_E)
    return dict(lb_loss=lb_loss, router_z_loss=jnp.mean(z ** 2), load_E=load_E, prob_E=prob_E,
                load_cv=jnp.std(counts_E) / mean_count,
                load_max_over_mean=jnp.max(counts_E) / mean_count)

  def reduce_aux(self, aux_L: dict) -> tuple[jax.Array, dict]:
    """The training loss term (coefficients applied, summed over layers) and the metrics."""
    m = self.spec
    loss = (m.lb_loss_coef * jnp.sum(aux_L['lb_loss'])
            + m.router_z_loss_coef * jnp.sum(aux_L['router_z_loss']))
    return loss, dict(moe_lb_loss=jnp.mean(aux_L['lb_loss']),
                      moe_router_z_loss=jnp.mean(aux_L['router_z_loss']),
                      moe_load_cv=jnp.mean(aux_L['load_cv']),
                      moe_load_max_over_mean=jnp.max(aux_L['load_max_over_mean']),
                      moe_dropped_frac=jnp.mean(aux_L['dropped_frac']))

  def pooled_stats(self, aux_L: dict):
    """The per-layer expert loads [L, E] when the load-balancing loss is global, else None."""
    return aux_L['load_E'] if self.spec.pools_stats else None

  def inactive_params(self) -> int:
    """Routed-expert parameters a token does not use: (E - k) / E of them."""
    m = self.spec
    n = sum(int(w.size) for w in (self.wi_gate, self.wi_up, self.wo))
    return n * (m.num_experts - m.top_k) // m.num_experts
