"""The decoder: embedding -> scanned pre-norm blocks (attention + FFN) -> logits.

    model = Transformer(ModelConfig.from_config(config.model), rngs=nnx.Rngs(0))
    logits_BxTxV, ffn_aux = model(tokens_BxT)
    logits_BxTxV, ffn_aux = model(tokens_BxT, segment_ids_BxT=document_ids(tokens_BxT, bos_id))
    logits_BxTxV, stats = inspect(model, tokens_BxT)      # + the analysis statistics
    logits_BxTxV, kv = model.decode(tokens_BxT, start_B, kv)  # with a KV cache (generate.py)

Blocks are created once with `nnx.vmap` (parameters stacked on a leading 'layers' axis) and run
with `nnx.scan`, so a 48-layer model compiles like a 1-layer one (`model.scan_layers=False`
unrolls that scan: faster small models on CPU, gated_attention/config/scales.py).

One Context per call (context.py) carries what every layer shares besides the hidden states:
positions, document ids, RoPE's sin / cos (made once here) and the per-layer KV cache and
pooled FFN statistics; `_blocks` scans the per-layer parts with the stacked blocks.

The FFN of a block is a dense SwiGLU (layers.MLP) or a Mixture of Experts (moe.MoE); both follow
one interface: `ffn(x) -> (y, aux)`, with `reduce_aux(aux_L) -> (loss, metrics)` (its auxiliary
training loss and logged metrics from the stacked per-layer `aux`), `pooled_stats(aux_L)`
(statistics that gradient accumulation gathers over all micro-batches first, or None) and
`inactive_params()` (parameters a token does not use). An FFN whose `pooled_stats` are not None
takes them back as `ffn(x, pooled=...)` (the Block passes the context's `pooled` when there are
any; a dense FFN has none and never receives them).

Document masking (data.document_mask, attention_kernels.py): with `segment_ids_BxT` every
attention layer lets a token see only earlier tokens of its own document (train.py passes
`document_ids` of the inputs); positions stay absolute in the window (attention.py says why).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.model import attention_kernels
from gated_attention import sharding
from gated_attention.model.attention import Attention
from gated_attention.model.attention_kernels import document_ids  # noqa: F401 (re-exported)
from gated_attention.model.config import ModelConfig
from gated_attention.model.context import Context
from gated_attention.model.layers import MLP, Embed, Inspectable, RMSNorm, capture_stats, param, project
from gated_attention.model.moe import MoE
from gated_attention.model.rope import RoPE

REMAT_POLICIES = {
    'full': None,  # save nothing: recompute the whole block in the backward pass
    # save only the attention kernel's output and log-sum-exp (splash: 4 KiB per token and layer
    # at 16 x 128 heads), so the backward pass reruns the projections but not the forward kernel
    'save_attention': jax.checkpoint_policies.save_only_these_names(
        attention_kernels.SPLASH_RESIDUALS),
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}
M_ACT_SITES = ('attn_out', 'attn_residual', 'ffn_out', 'ffn_residual')


def _kth_smallest(x_N: jax.Array, ks: tuple[int, ...]) -> jax.Array:
  """The ks-th smallest (0-based) of float32 `x_N`, exactly, without a sort: a bisection over
  the 2^32 float32 bit patterns mapped to unsigned integers in the order of their values (-0
  before +0), 32 counting passes over `x_N`, every k in the same pass."""
  bits = jax.lax.bitcast_convert_type(x_N, jnp.uint32)
  negative = (bits >> 31) == 1
  key_N = jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))
  k_M = jnp.asarray(ks, jnp.uint32)

  def halve(_, bounds):
    lo_M, hi_M = bounds
    mid_M = lo_M + (hi_M - lo_M) // 2
    at_most_M = jnp.sum(key_N[None, :] <= mid_M[:, None], axis=1, dtype=jnp.uint32)
    found_M = at_most_M >= k_M + 1      # the k-th smallest is <= mid
    return jnp.where(found_M, lo_M, mid_M + 1), jnp.where(found_M, mid_M, hi_M)
  lo_M, _ = jax.lax.fori_loop(
      0, 32, halve, (jnp.zeros(len(ks), jnp.uint32), jnp.full(len(ks), 0xFFFFFFFF, jnp.uint32)))
  was_positive = (lo_M >> 31) == 1
  return jax.lax.bitcast_convert_type(
      jnp.where(was_positive, lo_M ^ jnp.uint32(0x80000000), ~lo_M), jnp.float32)


def median(x: jax.Array) -> jax.Array:
  """jnp.median of float32 `x` over all its elements, bit for bit (the same interpolation of the
  two middle values, NaN if any is NaN; a zero median is +0), by selection instead of a sort:
  on CPU a sort of one analysis site's 262k values took 62 ms, most of the analysis's time;
  this takes 3.7 ms."""
  x_N = x.reshape(-1).astype(jnp.float32)
  x_N = jnp.where(x_N == 0, jnp.float32(0), x_N)   # -0 as +0 (a sort keeps either, as found)
  n = x_N.size
  q = np.float32(0.5) * (np.float32(n) - np.float32(1))     # as jnp.quantile computes it
  low, high = int(np.floor(q)), int(np.ceil(q))
  high_weight = np.float32(q - np.floor(q))
  low_weight = np.float32(1) - high_weight
  low_high = _kth_smallest(x_N, (low, high))
  result = low_high[0] * low_weight + low_high[1] * high_weight
  return jnp.where(jnp.any(jnp.isnan(x_N)), jnp.float32(jnp.nan), result)


def _where_max_abs(h_BxTxD: jax.Array) -> dict:
  """M-Act at one site: max |h|, its (batch, token, channel), and the median |h| over every
  element (the scale that makes a maximum "massive": Sun et al. 2024 call activations massive at
  about 1,000 times the median)."""
  a = jnp.abs(h_BxTxD.astype(jnp.float32))
  flat = jnp.argmax(a.reshape(-1))
  return {'max': a.reshape(-1)[flat], 'where': jnp.stack(jnp.unravel_index(flat, a.shape)),
          'median': median(a)}


class Block(Inspectable, nnx.Module):
  """h = h + [Norm](Attn(Norm(h))); h = h + [Norm](FFN(Norm(h))), [Norm] with sandwich norm."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    D, eps = cfg.hidden_size, cfg.norm_eps
    self.attn_norm = RMSNorm(D, eps=eps)
    self.attn = Attention(cfg, rngs=rngs)
    self.ffn_norm = RMSNorm(D, eps=eps)
    if cfg.moe is not None:
      self.ffn = MoE(cfg, rngs=rngs)
    else:
      self.ffn = MLP(D, cfg.ffn_size, std=cfg.init_std, dtype=cfg.compute_dtype, rngs=rngs)
    self.attn_post_norm = RMSNorm(D, eps=eps) if cfg.sandwich_norm else None
    self.ffn_post_norm = RMSNorm(D, eps=eps) if cfg.sandwich_norm else None
    self.inspect = False

  def __call__(self, h_BxTxD, ctx: Context):
    """Returns (h_out, (aux, kv)): the FFN's aux outputs and the attention's KV cache (None
    without one). `ctx`: this layer's view of the call's Context (context.py)."""
    attn_out, kv = self.attn(self.attn_norm(h_BxTxD), ctx)
    if self.attn_post_norm is not None:
      attn_out = self.attn_post_norm(attn_out)
    h_attn = sharding.constrain(h_BxTxD + attn_out, ('batch', 'seq', 'embed'))
    x_BxTxD = self.ffn_norm(h_attn)
    if ctx.pooled is None:
      ffn_out, aux = self.ffn(x_BxTxD)
    else:                                  # only an FFN with pooled_stats gets them back (MoE)
      ffn_out, aux = self.ffn(x_BxTxD, pooled=ctx.pooled)
    if self.ffn_post_norm is not None:
      ffn_out = self.ffn_post_norm(ffn_out)
    h_out = sharding.constrain(h_attn + ffn_out, ('batch', 'seq', 'embed'))
    if self.inspect:  # M-Act (Qiu et al. 2025, Sec. 4.3) at the four sites of the block
      sites = dict(zip(M_ACT_SITES, (attn_out, h_attn, ffn_out, h_out)))
      self.sow(nnx.Intermediate, 'm_act', {k: _where_max_abs(v) for k, v in sites.items()})
    return h_out, (aux, kv)


class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    if not isinstance(cfg, ModelConfig):
      raise TypeError('Transformer takes a config.ModelConfig: '
                      'Transformer(ModelConfig.from_config(config.model), rngs=...).')
    self.cfg = cfg
    self.embed = Embed(cfg.vocab_size, cfg.hidden_size, std=cfg.init_std,
                       dtype=cfg.compute_dtype, rngs=rngs)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_blocks(r):
      return Block(cfg, rngs=r)

    self.blocks = make_blocks(rngs)
    self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    self.rope = RoPE(cfg.head_dim, cfg.rope_base, cfg.rope_scaling)  # every layer's (attention.py)
    self.lm_head = None if cfg.tie_embeddings else param(
        rngs, (cfg.hidden_size, cfg.vocab_size), ('embed', 'vocab'), cfg.init_std)

  def __call__(self, tokens_BxT: jax.Array, *, pooled=None, return_hidden: bool = False,
               segment_ids_BxT: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """Returns float32 logits [B, T, V] (or, with `return_hidden`, the final-normed hidden
    states [B, T, D]) and the FFNs' aux outputs stacked to [L, ...]. `pooled`: the FFNs'
    pooled statistics [L, ...] over all micro-batches (train.py), or None. `segment_ids_BxT`:
    document ids for document masking (`document_ids`), or None."""
    B, T = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    ctx = Context(positions_BxT, rope_tables=self.rope.constant_tables(T),
                  segment_ids_BxT=segment_ids_BxT, pooled=pooled)
    h_BxTxD, (aux, _) = self._blocks(tokens_BxT, ctx)
    h_BxTxD = self.final_norm(h_BxTxD)
    if return_hidden:
      return h_BxTxD, aux
    return self.logits(h_BxTxD, self.head_kernel()), aux

  def decode(self, tokens_BxT: jax.Array, start_B: jax.Array, kv: dict) -> tuple[jax.Array, dict]:
    """With a KV cache (generate.py): sequence b's tokens sit at positions start_B[b] + t; the
    cache {'k', 'v'} [L, B, S, K, d] has every slot before start_B[b] written. Returns float32
    logits [B, T, V] and the cache with these tokens written."""
    T = tokens_BxT.shape[1]
    positions_BxT = start_B[:, None].astype(jnp.int32) + jnp.arange(T, dtype=jnp.int32)
    ctx = Context(positions_BxT, rope_tables=self.rope.tables(positions_BxT), kv=kv)
    h_BxTxD, (_, kv) = self._blocks(tokens_BxT, ctx)
    return self.logits(self.final_norm(h_BxTxD), self.head_kernel()), kv

  def _blocks(self, tokens_BxT, ctx: Context):
    """Embedding and the scanned blocks: (h [B, T, D], (aux [L, ...], kv [L, ...] or None)).
    The scan runs over the stacked blocks and the context's per-layer parts (the KV cache and
    pooled statistics, [L, ...]); its shared parts (positions, document ids, RoPE's tables, made
    once for every layer) are closed over (context.py)."""
    h_BxTxD = sharding.constrain(self.embed(tokens_BxT), ('batch', 'seq', 'embed'))
    shared, per_layer = ctx.split_layers()

    def body(h, block, layer):
      return block(h, shared.at_layer(layer))

    if self.cfg.remat != 'none':
      body = nnx.remat(body, policy=REMAT_POLICIES[self.cfg.remat])
    # scan_layers=False unrolls the loop (unroll=True): the parameters stay stacked [L, ...].
    scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), unroll=not self.cfg.scan_layers)
    return scan(h_BxTxD, self.blocks, per_layer)

  def head_kernel(self) -> jax.Array:
    """The LM head [D, V] in float32: the embedding table, transposed, when tied."""
    return self.embed.embedding[...].T if self.lm_head is None else self.lm_head[...]

  @staticmethod
  def logits(h_BxTxD: jax.Array, kernel_DxV: jax.Array) -> jax.Array:
    logits = project(h_BxTxD, kernel_DxV.astype(h_BxTxD.dtype))
    return sharding.constrain(logits, ('batch', 'seq', 'vocab')).astype(jnp.float32)

  def ffn_loss_and_metrics(self, aux_L: dict) -> tuple[jax.Array, dict]:
    """The FFNs' auxiliary training loss and their metrics (MoE: load balancing, z-loss)."""
    return self.blocks.ffn.reduce_aux(aux_L)

  def ffn_pooled_stats(self, aux_L: dict):
    """What gradient accumulation pools over micro-batches for the FFNs (or None)."""
    return self.blocks.ffn.pooled_stats(aux_L)


def inspect(model: Transformer, tokens_BxT: jax.Array,
            segment_ids_BxT: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """Logits and the per-layer analysis statistics, each stacked to [L, ...]:
  f_attn_H [L, H], attn_map [L, n, n], sdpa_pre_gate / sdpa_post_gate {abs_mean,
  frac_below_1e-2, frac_below_1e-3}, gate {mean, frac_below_0.1, hist} (gated runs only) and
  m_act {site: {max, where}} (analysis/metrics.py documents them). Runs the explicit-attention
  path on a view of `model` and collects what its modules `sow` (layers.capture_stats)."""
  (logits, _), stats = capture_stats(model, tokens_BxT, segment_ids_BxT=segment_ids_BxT)
  return logits, stats


def abstract_model(cfg: ModelConfig) -> Transformer:
  """The model with ShapeDtypeStructs for parameters: no memory, no FLOPs."""
  return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def param_report(cfg: ModelConfig) -> dict:
  """Parameter counts: total, active per token, embedding, and per module."""
  model = abstract_model(cfg)
  by_module = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
    keys = [str(getattr(p, 'key', getattr(p, 'name', p))) for p in path]
    keys = [k for k in keys if k != 'value']
    group = '.'.join(keys[:3] if keys[0] == 'blocks' else keys[:1])
    by_module[group] = by_module.get(group, 0) + int(leaf.size)
  total = sum(by_module.values())
  embedding = cfg.vocab_size * cfg.hidden_size
  return {'total': total, 'active': total - model.blocks.ffn.inactive_params(),
          'embedding': embedding,
          'non_embedding': total - embedding - (0 if cfg.tie_embeddings else embedding),
          'by_module': dict(sorted(by_module.items()))}


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Analytic training FLOPs per token (forward + backward = 3x forward).

  Matmuls: 6 x the active parameters that multiply activations (everything but the embedding
  lookup; a tied table counts once, as the LM head). Attention: QK^T and PV, each 2 * T * d
  FLOPs per query head and token, halved by the causal mask, times 3: 6 * L * H * d * T.
  """
  report = param_report(cfg)
  matmul_params = report['active'] - (0 if cfg.tie_embeddings else report['embedding'])
  attention = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
  return 6.0 * matmul_params + attention
