"""Mixture-of-Experts feed-forward block (top-k softmax router + SwiGLU experts).

Routing: router logits are computed in float32 (`logits_NxE = x @ W_router`),
`probs = softmax(logits)`, the top-k experts of every token are selected and
(optionally, `cfg.moe.renormalize`) their probabilities renormalised to sum to 1.
The routed output is `sum_k w_k * SwiGLU_{e_k}(x)`; shared experts (one SwiGLU of
width `num_shared_experts * expert_ffn_size`) are added on top. Parameters are
float32, expert matmuls run in `cfg.dtype`.

Dispatch (`cfg.moe.dispatch`):
  dropless  The N*K (token, expert) assignments are stably sorted by expert, the
            tokens gathered into that order and the experts applied as grouped
            matmuls (`grouped_matmul`: jax.lax.ragged_dot, or the Pallas megablox kernels on TPU,
            moe.grouped_matmul; group sizes = per-expert counts).
            The outputs are weighted and scatter-added back to their tokens.
            All shapes are static (N*K rows), so it jits; nothing is dropped.
  capacity  Every expert has C = ceil(capacity_factor * N * K / E) slots.
            PRIORITY RULE: assignments are ranked k-major, i.e. all tokens'
            top-1 choices first (in token order), then all top-2 choices, etc.
            An assignment's slot is the number of earlier-ranked assignments
            to the same expert (a cumsum of one-hots over that order); slots
            >= C are dropped (their weight is zeroed, the token keeps only its
            other experts and the shared/residual path). Kept tokens are
            scattered into an [E, C, D] buffer, the experts run as a batched
            SwiGLU and the results are gathered back.

Auxiliary losses (returned, NOT multiplied by their coefficients):
  lb_loss        E * sum_e f_e * P_e with f_e the fraction of the K*N routed
                 assignments sent to expert e (stop-gradient; counted before any
                 capacity drops) and P_e the mean router probability.
                 'global' type: f and P are taken over ALL tokens of the call.
                 Under jit with a data-sharded batch the means are global across
                 data-parallel shards automatically, i.e. this is the global-batch
                 load-balancing loss, which (unlike the per-sequence loss) lets
                 experts specialise within a sequence. With gradient
                 accumulation the trainer can pass `global_load_E` (f averaged
                 over all micro-batches, from each call's `load_E`) to use the
                 whole global batch's f. 'sequence' type: the same loss per
                 sequence (over its T tokens), averaged over sequences;
                 `global_load_E` is ignored there.
  router_z_loss  mean over tokens of logsumexp(logits)^2.
Diagnostics: load_E (local f), prob_E (P), load_cv and load_max_over_mean of the
per-expert assignment counts, dropped_frac (0 for dropless).
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention import moe_parallel, sharding


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


GROUPED_MATMULS = ('auto', 'ragged_dot', 'megablox', 'megablox_interpret')
_GMM_TM = 128  # megablox row tile; rows are zero-padded up to a multiple of it
_GMM_MAX_FULL_TILE = 2048  # largest K/N that is not a multiple of 128 megablox takes as one tile


def resolve_grouped_matmul(impl: str, platform: str) -> str:
  """'auto' -> 'megablox' on TPU devices, else 'ragged_dot'; anything else is validated."""
  if impl not in GROUPED_MATMULS:
    raise ValueError(f'Unknown config.model.moe.grouped_matmul {impl!r}; '
                     f'expected one of {GROUPED_MATMULS}')
  if impl == 'auto':
    return 'megablox' if platform == 'tpu' else 'ragged_dot'
  return impl


def resolve_model_config(model_cfg, mesh):
  """A copy of the model config with moe.grouped_matmul='auto' resolved for the mesh's devices."""
  if model_cfg.moe.get('grouped_matmul', 'auto') != 'auto':
    return model_cfg
  if isinstance(mesh, jax.sharding.Mesh):
    platform = mesh.devices.flat[0].platform
  else:  # an AbstractMesh (memory estimates) has no devices
    platform = jax.default_backend()
  model_cfg = model_cfg.copy_and_resolve_references()
  with model_cfg.unlocked():
    model_cfg.moe.grouped_matmul = resolve_grouped_matmul('auto', platform)
  return model_cfg


def _gmm_tile(dim: int, name: str) -> int:
  """Megablox K/N tile: a multiple of 128 dividing dim, else (Mosaic allows a block spanning the
  whole dimension) dim itself while it is small enough for VMEM."""
  for t in (512, 256, 128):
    if dim % t == 0:
      return t
  if dim <= _GMM_MAX_FULL_TILE:
    return dim
  raise ValueError(f'config.model.moe.grouped_matmul=megablox needs the {name} dimension of the '
                   f'(per-shard) expert matmuls to be a multiple of 128 or at most '
                   f'{_GMM_MAX_FULL_TILE}, got {dim}; use '
                   f"config.model.moe.grouped_matmul='ragged_dot' for these shapes.")


def _gmm_tiling(m, k, n):
  """Per call (gmm forward, its transposed input-gradient gmm, tgmm) (tm, tk, tn)."""
  del m  # rows are padded to a multiple of _GMM_TM
  return _GMM_TM, _gmm_tile(k, 'K'), _gmm_tile(n, 'N')


def grouped_matmul(x_MxK, w_GxKxN, group_sizes_G, impl: str):
  """out[rows of group g] = x[rows of group g] @ w[g]; rows past sum(group_sizes) are zero.

  impl: 'ragged_dot' (jax.lax.ragged_dot) or 'megablox' (Pallas TPU grouped matmul, whose custom
  VJP computes the weight gradient with tgmm over the groups' rows only; ragged_dot's weight
  gradient compiles to a dense product over all groups on TPU). 'megablox_interpret' runs the
  megablox kernels in the Pallas interpreter (any backend; tests).
  """
  if impl == 'ragged_dot':
    return jax.lax.ragged_dot(x_MxK, w_GxKxN, group_sizes_G)
  if impl not in ('megablox', 'megablox_interpret'):
    raise ValueError(f'grouped_matmul impl {impl!r} must be resolved to ragged_dot or megablox '
                     '(config.model.moe.grouped_matmul)')
  from jax.experimental.pallas.ops.tpu.megablox import gmm  # pylint: disable=g-import-not-at-top
  M, K = x_MxK.shape
  N = w_GxKxN.shape[-1]
  _gmm_tile(K, 'contraction (K)')   # clear errors up front, before gmm's own
  _gmm_tile(N, 'output (N)')
  Mp = -(-M // _GMM_TM) * _GMM_TM
  group_sizes_G = group_sizes_G.astype(jnp.int32)
  # gmm leaves rows past sum(group_sizes) (the padding, moe_parallel's tail) uninitialised, in the
  # output and in its input gradient: zero them on the way in and out (select, NaN-safe).
  valid_M = jnp.arange(Mp, dtype=jnp.int32) < jnp.sum(group_sizes_G)
  x = jnp.pad(x_MxK, ((0, Mp - M), (0, 0))) if Mp != M else x_MxK
  x = jnp.where(valid_M[:, None], x, jnp.zeros((), x.dtype))
  out = gmm(x, w_GxKxN.astype(x.dtype), group_sizes_G, x.dtype, _gmm_tiling,
            interpret=impl == 'megablox_interpret')
  out = jnp.where(valid_M[:, None], out, jnp.zeros((), out.dtype))
  return out[:M]


class MoE(nnx.Module):
  """Top-k routed SwiGLU experts (+ optional shared experts). See module doc."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    m = cfg.moe
    self.num_experts, self.top_k = m.num_experts, m.top_k
    self.renormalize, self.lb_loss_type = m.renormalize, m.lb_loss_type
    self.dispatch, self.capacity_factor = m.dispatch, m.capacity_factor
    self.dtype = jnp.dtype(cfg.dtype)
    # 'auto' is resolved for the mesh's devices by train.Setup (resolve_model_config); a model
    # built directly from a config with 'auto' uses the default backend.
    self.grouped_matmul = resolve_grouped_matmul(m.get('grouped_matmul', 'auto'),
                                                 jax.default_backend())
    if self.dispatch not in ('dropless', 'capacity'):
      raise ValueError(f'Unknown moe.dispatch {self.dispatch!r}')
    if self.lb_loss_type not in ('global', 'sequence'):
      raise ValueError(f'Unknown moe.lb_loss_type {self.lb_loss_type!r}')
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
    self.has_shared = bool(S)

  def _dropless(self, x_NxD, weights_NxK, experts_NxK):
    if moe_parallel.active():  # sharded: per-shard sort, expert parallelism (moe_parallel.py)
      return moe_parallel.dropless(
          x_NxD, weights_NxK, experts_NxK, self.wi_gate[...], self.wi_up[...], self.wo[...],
          num_experts=self.num_experts, dtype=self.dtype,
          impl=self.grouped_matmul), jnp.zeros((), jnp.float32)
    N, K = experts_NxK.shape
    E, dt = self.num_experts, self.dtype
    experts_M = experts_NxK.reshape(N * K)  # M = N*K assignments, token-major
    order_M = jnp.argsort(experts_M, stable=True)
    token_M = order_M // K
    group_sizes_E = jnp.bincount(experts_M, length=E).astype(jnp.int32)
    x_MxD = x_NxD[token_M]
    impl = self.grouped_matmul
    g = grouped_matmul(x_MxD, self.wi_gate[...].astype(dt), group_sizes_E, impl)
    u = grouped_matmul(x_MxD, self.wi_up[...].astype(dt), group_sizes_E, impl)
    y_MxD = grouped_matmul(jax.nn.silu(g) * u, self.wo[...].astype(dt), group_sizes_E, impl)
    w_M = weights_NxK.reshape(N * K)[order_M].astype(dt)
    y_NxD = jax.ops.segment_sum(y_MxD * w_M[:, None], token_M, num_segments=N)
    return y_NxD, jnp.zeros((), jnp.float32)

  def _capacity(self, x_NxD, weights_NxK, experts_NxK):
    N, K = experts_NxK.shape
    E, D, dt = self.num_experts, x_NxD.shape[-1], self.dtype
    C = math.ceil(self.capacity_factor * N * K / E)
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

  def __call__(self, x_BxTxD, global_load_E=None):
    B, T, D = x_BxTxD.shape
    N, E, K = B * T, self.num_experts, self.top_k
    x_NxD = x_BxTxD.reshape(N, D)
    logits_NxE = x_NxD.astype(jnp.float32) @ self.router[...]
    probs_NxE, weights_NxK, experts_NxK = sharding.per_batch_shard(  # per token: split by batch
        route, logits_NxE, K, self.renormalize)

    x_c = x_NxD.astype(self.dtype)
    routed = self._dropless if self.dispatch == 'dropless' else self._capacity
    y_NxD, dropped_frac = routed(x_c, weights_NxK, experts_NxK)
    if self.has_shared:
      y_NxD = y_NxD + _swiglu(x_c, self.shared_wi_gate[...], self.shared_wi_up[...],
                              self.shared_wo[...], self.dtype)

    # Statistics and auxiliary losses (float32).
    onehot_NxE = jnp.sum(jax.nn.one_hot(experts_NxK, E, dtype=jnp.float32), axis=1)
    counts_E = jnp.sum(onehot_NxE, axis=0)
    load_E = counts_E / (N * K)
    prob_E = jnp.mean(probs_NxE, axis=0)
    if self.lb_loss_type == 'global':
      f_E = load_E if global_load_E is None else global_load_E.astype(jnp.float32)
      lb_loss = E * jnp.sum(jax.lax.stop_gradient(f_E) * prob_E)
    else:
      f_BxE = jnp.sum(onehot_NxE.reshape(B, T, E), axis=1) / (T * K)
      P_BxE = jnp.mean(probs_NxE.reshape(B, T, E), axis=1)
      lb_loss = E * jnp.mean(jnp.sum(jax.lax.stop_gradient(f_BxE) * P_BxE, axis=-1))
    z = jax.nn.logsumexp(logits_NxE, axis=-1)
    mean_count = jnp.mean(counts_E)
    aux = dict(
        lb_loss=lb_loss,
        router_z_loss=jnp.mean(z ** 2),
        load_E=load_E,
        prob_E=prob_E,
        load_cv=jnp.std(counts_E) / mean_count,
        load_max_over_mean=jnp.max(counts_E) / mean_count,
        dropped_frac=dropped_frac,
    )
    return y_NxD.reshape(B, T, D).astype(x_BxTxD.dtype), aux
