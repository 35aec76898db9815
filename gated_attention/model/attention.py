"""Grouped-query attention with QK-norm, RoPE and the gate's hook points.

Shapes: B batch, T sequence, D hidden, H query heads, K KV heads, G = H // K, d head_dim.
Query head h uses KV head h // G (group-major), as jax.nn.dot_product_attention does.

Training calls a fused core of attention_kernels.py (config.model.attention_impl). Viewed with
`inspect=True` (model.inspect) the probabilities are computed explicitly and summarised with
`sow`: F-Attn per head, a head-averaged attention map and the SDPA output's sparsity before and
after the gate (Qiu et al. 2025, Sec. 4.2 and 4.3).

Attention reads the call's context.Context (positions, RoPE tables, document ids, this layer's
KV cache), which the Transformer builds once for every layer.

With a KV cache (`ctx.kv` = {'k', 'v'}: [B, S, K, d] each, generate.py), the new tokens' keys and
values are written at their positions and the queries attend to cache slots at or before their
own position: chunked prefill and one-token decoding, with per-sequence positions. Slots after a
query's position (unwritten, or a right-padded prompt's padding) are masked by causality alone,
because every slot up to the largest position in a call has been written by then.

Document masking (`ctx.segment_ids_BxT`, from data.document_mask; attention_kernels.py): a query
sees only keys of its own document. RoPE positions stay absolute in the window rather than
restarting at each BOS: RoPE makes a score depend on the distance between query and key only (Su
et al. 2021), so within a document the scores are the same either way, and keeping positions
leaves the unmasked path, the KV cache and YaRN untouched (tests/test_model.py checks that a
document's logits in a masked window equal those of the document alone).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model import attention_kernels, gating, kv_cache, quantization
from gated_attention import sharding
from gated_attention.errors import ConfigError
from gated_attention.model.context import Context
from gated_attention.model.layers import Inspectable, RMSNorm, param, project, project_in
from gated_attention.model.rope import RoPE

ATTN_MAP_LEN = 128  # the inspect path records attention maps of the first positions only


def explicit_attention(q_BxTxHxd, k_BxSxKxd, v_BxSxKxd, q_positions_BxT=None,
                       segment_ids_BxT=None, visible_BxTxS=None):
  """Causal softmax attention written out; returns (output, probs_BxHxTxS in float32).

  Key s sits at position s. Without `q_positions_BxT`, query t sits at position t (S == T);
  with it, each query attends to the keys at or before its position (a KV cache). With
  `segment_ids_BxT` (S == T), only to keys of its own document. `visible_BxTxS` (bool, or
  broadcastable to it): which keys each query sees, instead of causality (kv_cache.py's ring)."""
  B, T, H, d = q_BxTxHxd.shape
  S, K = k_BxSxKxd.shape[1], k_BxSxKxd.shape[2]
  q_BxTxKxGxd = q_BxTxHxd.reshape(B, T, K, H // K, d)
  logits = jnp.einsum('btkgd,bskd->bkgts', q_BxTxKxGxd, k_BxSxKxd,
                      preferred_element_type=jnp.float32) / jnp.sqrt(d).astype(jnp.float32)
  if visible_BxTxS is not None:
    causal = jnp.broadcast_to(visible_BxTxS, (B, T, S))[:, None, None]
  elif q_positions_BxT is None:
    causal = attention_kernels.causal_mask(T, S)
  else:
    causal = (jnp.arange(S)[None, None, :] <= q_positions_BxT[:, :, None])[:, None, None]
  if segment_ids_BxT is not None:
    same = attention_kernels.same_document_BxTxS(segment_ids_BxT, segment_ids_BxT)
    causal = causal & same[:, None, None]
  logits = jnp.where(causal, logits, jnp.finfo(jnp.float32).min)
  probs_BxKxGxTxS = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum('bkgts,bskd->btkgd', probs_BxKxGxTxS.astype(v_BxSxKxd.dtype), v_BxSxKxd)
  return out.reshape(B, T, H, d), probs_BxKxGxTxS.reshape(B, H, T, S)


def write_cache(cache_BxSxKxd: jax.Array, new_BxTxKxd: jax.Array, start_B: jax.Array):
  """The cache with sequence b's T new entries written at slots start_B[b] .. start_B[b]+T-1."""
  def write_one(cache_SxKxd, new_TxKxd, start):
    return jax.lax.dynamic_update_slice(cache_SxKxd, new_TxKxd.astype(cache_SxKxd.dtype),
                                        (start, 0, 0))
  return jax.vmap(write_one)(cache_BxSxKxd, new_BxTxKxd, start_B)


def sparsity(y: jax.Array) -> dict:
  a = jnp.abs(y.astype(jnp.float32))
  return {'abs_mean': jnp.mean(a), 'frac_below_1e-2': jnp.mean(a < 1e-2),
          'frac_below_1e-3': jnp.mean(a < 1e-3)}


class Attention(Inspectable, nnx.Module):

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    """`cfg`: a config.ModelConfig."""
    D, H, K, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    std = cfg.init_std
    self.wq = param(rngs, (D, H, d), ('embed', 'heads', 'head_dim'), std)
    self.wk = param(rngs, (D, K, d), ('embed', 'kv_heads', 'head_dim'), std)
    self.wv = param(rngs, (D, K, d), ('embed', 'kv_heads', 'head_dim'), std)
    self.wo = param(rngs, (H, d, D), ('heads', 'head_dim', 'embed'), std)
    norm = lambda: RMSNorm(d, eps=cfg.norm_eps, axis_name='head_dim',  # noqa: E731
                           zero_centered=cfg.norm_zero_centered)
    self.q_norm = norm() if cfg.qk_norm else None
    self.k_norm = norm() if cfg.qk_norm else None
    self.rope = RoPE(d, cfg.rope_base, cfg.rope_scaling, cfg.rope_fraction)
    self.gate = gating.Gate(cfg.gate, hidden_size=D, num_heads=H, num_kv_heads=K, head_dim=d,
                            init_std=std, rngs=rngs, norm_eps=cfg.norm_eps,
                            fuse_with_query=cfg.fused_gate_projection)
    self.dtype = cfg.compute_dtype
    self.impl, self.platform = cfg.attention_impl, cfg.platform
    self.blocks = (cfg.attention_block_q, cfg.attention_block_kv)
    self.fused_bwd = cfg.attention_fused_bwd
    self.attn_map_len = ATTN_MAP_LEN
    self.inspect = False

  @property
  def fused_gate(self) -> bool:
    """Whether the gate's logits come out of the query projection (gating.Gate.queries)."""
    return self.gate.fused

  def __call__(self, x_BxTxD: jax.Array, ctx: Context):
    """Returns (output [B, T, D], kv): this layer's cache `ctx.kv` with this call's keys and
    values written at `ctx.positions_BxT` (consecutive per sequence), or None without a cache
    (training). Reads `ctx.segment_ids_BxT` (document masking, not with a cache) and
    `ctx.rope_tables` (made once for all layers by the Transformer; None: computed here).
    With `ctx.ring` (kv_cache.py's sliding-window cache), `ctx.kv` is that ring of keys before
    RoPE: `_ring_step`."""
    dt, gate, positions_BxT, kv = self.dtype, self.gate, ctx.positions_BxT, ctx.kv
    segment_ids_BxT = ctx.segment_ids_BxT
    x_BxTxD = quantization.linear_input(self, 'attn_in', x_BxTxD)   # W_q, W_k, W_v, the gate
    q, gate_logits = gate.queries(x_BxTxD, self.wq[...], dt)
    k = project(x_BxTxD, self.wk[...].astype(dt))
    v = project(x_BxTxD, self.wv[...].astype(dt))
    q, k, v = gate('q', q, x_BxTxD), gate('k', k, x_BxTxD), gate('v', v, x_BxTxD)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    if ctx.ring is not None:
      y_BxTxHxd, kv = self._ring_step(q, k, v, x_BxTxD, ctx.ring, kv)
      return self._output(y_BxTxHxd, x_BxTxD, gate_logits), kv
    sin_cos = self.rope.tables(positions_BxT) if ctx.rope_tables is None else ctx.rope_tables
    q, k = self.rope.rotate(q, *sin_cos), self.rope.rotate(k, *sin_cos)
    q, k = gate('q_rope', q, x_BxTxD), gate('k_rope', k, x_BxTxD)
    q = sharding.constrain(q, ('batch', 'seq', 'act_heads', 'head_dim'))

    if kv is not None:
      if segment_ids_BxT is not None:
        raise ValueError('Document masking (segment_ids_BxT) is not supported with a KV cache.')
      start_B = positions_BxT[:, 0]
      kv = {'k': write_cache(kv['k'], k, start_B), 'v': write_cache(kv['v'], v, start_B)}
      y_BxTxHxd, _ = explicit_attention(q, kv['k'], kv['v'], positions_BxT)
    elif self.inspect:
      y_BxTxHxd = self._inspected_attention(q, k, v, segment_ids_BxT)
    else:
      y_BxTxHxd = attention_kernels.attend(q, k, v, self.impl, segment_ids_BxT,
                                           block_q=self.blocks[0], block_kv=self.blocks[1],
                                           platform=self.platform, fused_bwd=self.fused_bwd)
    return self._output(y_BxTxHxd, x_BxTxD, gate_logits), kv

  def _output(self, y_BxTxHxd, x_BxTxD, gate_logits):
    """The gate at the SDPA output (G1), W_O, the gate at its output (G5)."""
    gate = self.gate
    y_BxTxHxd = gate('sdpa', y_BxTxHxd, x_BxTxD, gate_logits)
    if self.inspect:
      self.sow(nnx.Intermediate, 'sdpa_post_gate', sparsity(y_BxTxHxd))
    y_BxTxHxd = quantization.linear_input(self, 'attn_out_proj_in', y_BxTxHxd, feature_axes=2)
    out_BxTxD = project_in(y_BxTxHxd, self.wo[...].astype(self.dtype))
    return gate('out', out_BxTxD, x_BxTxD)

  def _ring_step(self, q, k, v, x_BxTxD, ring, kv):
    """One token per sequence through the sliding-window cache (kv_cache.py): its key (before
    RoPE) and value written at its slot, then attention over the visible slots, the query and
    every key rotated by their places in the cache. Returns (y [B, 1, H, d], kv)."""
    if q.shape[1] != 1:
      raise ValueError(f'The sliding-window cache takes one token per sequence a call, not '
                       f'{q.shape[1]} (inference/generate.py feeds prompts token by token).')
    if self.gate.spec.hook == 'k_rope':
      raise ConfigError('The sliding-window cache keeps keys before RoPE and rotates them at '
                        'every step, so a gate on the rotated keys (G3 with '
                        'model.gate.after_qk_norm_rope=True) cannot be applied to them; use the '
                        'full cache (no window) for this variant.')
    q = self.gate('q_rope', self.rope.rotate(q, *ring.query_tables), x_BxTxD)
    q = sharding.constrain(q, ('batch', 'seq', 'act_heads', 'head_dim'))
    kv = {'k': kv_cache.write_slot(kv['k'], k, ring), 'v': kv_cache.write_slot(kv['v'], v, ring)}
    k_rot = self.rope.rotate(kv['k'], *ring.key_tables)
    y_BxTxHxd, _ = explicit_attention(q, k_rot, kv['v'], visible_BxTxS=ring.valid_BxC[:, None])
    return y_BxTxHxd, kv

  def _inspected_attention(self, q, k, v, segment_ids_BxT) -> jax.Array:
    """Explicit attention, sowing F-Attn per head (queries 1..T-1), the head-averaged map of
    sample 0 and the SDPA output's sparsity before the gate. (With document masking, F-Attn is
    still the attention to the window's first token, which later documents cannot see.)"""
    y_BxTxHxd, probs_BxHxTxT = explicit_attention(q, k, v, segment_ids_BxT=segment_ids_BxT)
    n = min(self.attn_map_len, probs_BxHxTxT.shape[-1])
    self.sow(nnx.Intermediate, 'f_attn_H', jnp.mean(probs_BxHxTxT[:, :, 1:, 0], axis=(0, 2)))
    self.sow(nnx.Intermediate, 'attn_map', jnp.mean(probs_BxHxTxT[0, :, :n, :n], axis=0))
    self.sow(nnx.Intermediate, 'sdpa_pre_gate', sparsity(y_BxTxHxd))
    return y_BxTxHxd
