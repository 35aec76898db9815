"""The decoder: embedding -> scanned pre-norm blocks (attention + FFN) -> logits.

    model = Transformer(ModelConfig.from_config(config.model), rngs=nnx.Rngs(0))
    logits_BxTxV, ffn_aux = model(tokens_BxT)
    logits_BxTxV, ffn_aux = model(tokens_BxT, segment_ids_BxT=document_ids(tokens_BxT, bos_id))
    logits_BxTxV, stats = inspect(model, tokens_BxT)      # + the analysis statistics
    logits_BxTxV, kv = model.decode(tokens_BxT, start_B, kv)  # with a KV cache (generate.py)
    logits_Bx1xV, kv = model.decode(tokens_Bx1, pos_B, kv, window=kv_cache.Window(256, 4))
                                                          # a sliding-window cache (kv_cache.py)

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

Hybrids (config.model.layer_types; Qwen3-Next / Qwen3.5, beyond the paper): a block's mixer is
the gated attention or a Gated DeltaNet (deltanet.py). The blocks of one period of the layer
pattern form a LayerPeriod (three DeltaNet blocks, then an attention block), and the periods
are stacked and scanned as the paper's blocks are, so the 48 layers of Qwen3-Next compile as
one period: layer l is `blocks.layer_<l % P>` at index l // P of the stacked axis. The FFNs'
aux outputs come back in layer order [L, ...]; the cache (generate.py) is a tuple over the
period's positions (`hybrid_cache`). The paper's decoder (layer_types empty) is unchanged.

Where transformers' Qwen3-Next / Qwen3.5 tensors live (for runs/hf/; [out, in] weights become
[in, *out] kernels; model.layers.<l> is blocks.layer_<l % P>[l // P]; the DeltaNet's own tensors
are listed in deltanet.py):
  input_layernorm, post_attention_layernorm   -> attn_norm.scale, ffn_norm.scale (both 1 + w:
                                                 norm_zero_centered; the same for q_norm /
                                                 k_norm and model.norm -> final_norm.scale)
  self_attn.q_proj [H (d + d), D], per head [q_h | g_h] (gate.packing='head')
                                              -> attn.wq [D, H, d], attn.gate.kernel [D, H, d]
  self_attn.k_proj / v_proj / o_proj          -> attn.wk / wv [D, K, d], attn.wo [H, d, D]
  linear_attn.*                               -> linear_attn.* (deltanet.py)
  mlp.gate.weight [E, D]                      -> ffn.router [D, E]
  mlp.experts.gate_up_proj [E, 2F, D]         -> ffn.wi_gate = [:, :F]^T, ffn.wi_up = [:, F:]^T
  mlp.experts.down_proj [E, D, F]             -> ffn.wo [E, F, D]
  mlp.shared_expert.{gate,up,down}_proj       -> ffn.shared_wi_gate / shared_wi_up / shared_wo
  mlp.shared_expert_gate.weight [1, D]        -> ffn.shared_gate [D]
  mlp.{gate,up,down}_proj (Qwen3.5 dense)     -> ffn.wi_gate / wi_up / wo
(tests/test_deltanet.py and tests/test_moe.py check these against transformers' layers.)
RoPE: partial (rope_fraction, transformers' partial_rotary_factor) on the first dims of q and k;
Qwen3.5's interleaved multimodal RoPE is this RoPE for text (its three position streams equal).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.model import attention_kernels, deltanet, kv_cache
from gated_attention import sharding
from gated_attention.model.attention import Attention
from gated_attention.model.deltanet import GatedDeltaNet
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
  """h = h + [Norm](Mixer(Norm(h))); h = h + [Norm](FFN(Norm(h))), [Norm] with sandwich norm.

  The mixer is the gated attention (`attn`, attention.py) or, in a hybrid's linear_attention
  layers, a Gated DeltaNet (`linear_attn`, deltanet.py): transformers' self_attn / linear_attn."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, layer_type: str = 'full_attention'):
    D, eps = cfg.hidden_size, cfg.norm_eps
    norm = lambda: RMSNorm(D, eps=eps, zero_centered=cfg.norm_zero_centered)  # noqa: E731
    self.attn_norm = norm()
    if layer_type == 'linear_attention':
      self.linear_attn = GatedDeltaNet(cfg.deltanet, hidden_size=D, norm_eps=eps,
                                       init_std=cfg.init_std, dtype=cfg.compute_dtype, rngs=rngs)
    else:
      self.attn = Attention(cfg, rngs=rngs)
    self.ffn_norm = norm()
    if cfg.moe is not None:
      self.ffn = MoE(cfg, rngs=rngs)
    else:
      self.ffn = MLP(D, cfg.ffn_size, std=cfg.init_std, dtype=cfg.compute_dtype, rngs=rngs)
    self.attn_post_norm = norm() if cfg.sandwich_norm else None
    self.ffn_post_norm = norm() if cfg.sandwich_norm else None
    self.inspect = False

  @property
  def mixer(self):
    """The token mixer: the attention, or the Gated DeltaNet of a linear_attention layer."""
    return self.linear_attn if hasattr(self, 'linear_attn') else self.attn

  def __call__(self, h_BxTxD, ctx: Context):
    """Returns (h_out, (aux, kv)): the FFN's aux outputs and the mixer's cache (None
    without one). `ctx`: this layer's view of the call's Context (context.py)."""
    attn_out, kv = self.mixer(self.attn_norm(h_BxTxD), ctx)
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


class LayerPeriod(nnx.Module):
  """One period of a hybrid's layer pattern (ModelConfig.layer_period, e.g. three Gated DeltaNet
  layers then one attention layer): its blocks in order, `layers[i]` the period's i-th. The
  Transformer stacks N = num_layers / P periods and scans over them, so layer l is the block
  `blocks.layer_{l % P}` at index l // P of the stacked axis (parameter paths
  blocks/layer_<i>/linear_attn/..., blocks/layer_<i>/attn/...; `layers` lists them in order).

  Per-layer parts of the Context (context.py) arrive here as one period's: `kv` a tuple of P
  caches (attention {'k', 'v'}, DeltaNet deltanet.init_cache's), `pooled` [P, ...]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.period = len(cfg.layer_period)
    for i, layer_type in enumerate(cfg.layer_period):
      setattr(self, f'layer_{i}', Block(cfg, rngs=rngs, layer_type=layer_type))

  @property
  def layers(self) -> list[Block]:
    return [getattr(self, f'layer_{i}') for i in range(self.period)]

  def __call__(self, h_BxTxD, ctx: Context):
    auxes, caches = [], []
    for i, block in enumerate(self.layers):
      layer = {'kv': None if ctx.kv is None else ctx.kv[i],
               'pooled': None if ctx.pooled is None else jax.tree.map(lambda a: a[i], ctx.pooled)}
      h_BxTxD, (aux, kv) = block(h_BxTxD, ctx.at_layer(layer))
      auxes.append(aux)
      caches.append(kv)
    aux_P = jax.tree.map(lambda *a: jnp.stack(a), *auxes)
    return h_BxTxD, (aux_P, None if ctx.kv is None else tuple(caches))


class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    if not isinstance(cfg, ModelConfig):
      raise TypeError('Transformer takes a config.ModelConfig: '
                      'Transformer(ModelConfig.from_config(config.model), rngs=...).')
    self.cfg = cfg
    self.embed = Embed(cfg.vocab_size, cfg.hidden_size, std=cfg.init_std,
                       dtype=cfg.compute_dtype, rngs=rngs)
    # The paper's decoder stacks Blocks [L, ...]; a hybrid stacks LayerPeriods [L / P, ...].
    unit = LayerPeriod if cfg.is_hybrid else Block
    self.num_stacked = cfg.num_layers // len(cfg.layer_period) if cfg.is_hybrid else cfg.num_layers

    @nnx.split_rngs(splits=self.num_stacked)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_blocks(r):
      return unit(cfg, rngs=r)

    self.blocks = make_blocks(rngs)
    self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps,
                              zero_centered=cfg.norm_zero_centered)
    # every attention layer's (attention.py)
    self.rope = RoPE(cfg.head_dim, cfg.rope_base, cfg.rope_scaling, cfg.rope_fraction)
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

  def decode(self, tokens_BxT: jax.Array, start_B: jax.Array, kv: dict,
             lengths_B: jax.Array | None = None, *, window: kv_cache.Window | None = None,
             write_B: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """With a KV cache (generate.py): sequence b's tokens sit at positions start_B[b] + t; the
    cache {'k', 'v'} [L, B, S, K, d] has every slot before start_B[b] written. Returns float32
    logits [B, T, V] and the cache with these tokens written. `lengths_B`: how many of the T
    tokens of each sequence are real (a right-padded prompt's chunk), or None (all): a Gated
    DeltaNet's state passes the rest through (deltanet.py); attention masks them by causality.

    With `window` (kv_cache.py), the cache is a sliding window of window.capacity slots holding
    keys before RoPE, and each call feeds one token per sequence (T = 1) at start_B; `write_B`
    (bool [B], default all) says which sequences write theirs (attention-only models)."""
    T = tokens_BxT.shape[1]
    positions_BxT = start_B[:, None].astype(jnp.int32) + jnp.arange(T, dtype=jnp.int32)
    if window is not None:
      if self.cfg.is_hybrid:
        raise ConfigError('The sliding-window cache is for attention-only models; a hybrid '
                          '(model.layer_types with linear_attention) keeps its Gated DeltaNet '
                          'state whole: use the full cache.')
      write_B = jnp.ones(start_B.shape, bool) if write_B is None else write_B
      ring = window.view(start_B.astype(jnp.int32), write_B, self.rope)
      ctx = Context(positions_BxT, rope_tables=ring.query_tables, kv=kv, ring=ring)
    else:
      valid_BxT = None
      if lengths_B is not None:
        valid_BxT = jnp.arange(T, dtype=jnp.int32)[None, :] < lengths_B[:, None]
      ctx = Context(positions_BxT, rope_tables=self.rope.tables(positions_BxT), kv=kv,
                    valid_BxT=valid_BxT)
    h_BxTxD, (_, kv) = self._blocks(tokens_BxT, ctx)
    return self.logits(self.final_norm(h_BxTxD), self.head_kernel()), kv

  def _blocks(self, tokens_BxT, ctx: Context):
    """Embedding and the scanned blocks: (h [B, T, D], (aux [L, ...], kv [L, ...] or None)).
    The scan runs over the stacked blocks and the context's per-layer parts (the KV cache and
    pooled statistics, [L, ...]); its shared parts (positions, document ids, RoPE's tables, made
    once for every layer) are closed over (context.py)."""
    h_BxTxD = sharding.constrain(self.embed(tokens_BxT), ('batch', 'seq', 'embed'))
    shared, per_layer = ctx.split_layers()
    N, L = self.num_stacked, self.cfg.num_layers
    if self.cfg.is_hybrid and per_layer['pooled'] is not None:   # [L, ...] -> [N, P, ...]
      per_layer['pooled'] = jax.tree.map(lambda a: a.reshape((N, L // N) + a.shape[1:]),
                                         per_layer['pooled'])

    def body(h, block, layer):
      return block(h, shared.at_layer(layer))

    if self.cfg.remat != 'none':
      body = nnx.remat(body, policy=REMAT_POLICIES[self.cfg.remat])
    # scan_layers=False unrolls the loop (unroll=True): the parameters stay stacked [L, ...].
    scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), unroll=not self.cfg.scan_layers)
    h_BxTxD, (aux, kv) = scan(h_BxTxD, self.blocks, per_layer)
    if self.cfg.is_hybrid:                                       # [N, P, ...] -> [L, ...]
      aux = jax.tree.map(lambda a: a.reshape((L,) + a.shape[2:]), aux)
    return h_BxTxD, (aux, kv)

  def head_kernel(self) -> jax.Array:
    """The LM head [D, V] in float32: the embedding table, transposed, when tied."""
    return self.embed.embedding[...].T if self.lm_head is None else self.lm_head[...]

  @staticmethod
  def logits(h_BxTxD: jax.Array, kernel_DxV: jax.Array) -> jax.Array:
    logits = project(h_BxTxD, kernel_DxV.astype(h_BxTxD.dtype))
    return sharding.constrain(logits, ('batch', 'seq', 'vocab')).astype(jnp.float32)

  @property
  def layer_blocks(self) -> list[Block]:
    """The stacked Blocks: one (every layer) in the paper's decoder, one per position of the
    layer period in a hybrid (each stacked over the periods)."""
    return self.blocks.layers if self.cfg.is_hybrid else [self.blocks]

  def ffn_loss_and_metrics(self, aux_L: dict) -> tuple[jax.Array, dict]:
    """The FFNs' auxiliary training loss and their metrics (MoE: load balancing, z-loss)."""
    return self.layer_blocks[0].ffn.reduce_aux(aux_L)

  def ffn_pooled_stats(self, aux_L: dict):
    """What gradient accumulation pools over micro-batches for the FFNs (or None)."""
    return self.layer_blocks[0].ffn.pooled_stats(aux_L)


def hybrid_cache(cfg: ModelConfig, batch: int, max_len: int) -> tuple:
  """An empty cache of a hybrid (LayerPeriod's layout): one entry per position of the layer
  period, stacked over the periods [N, ...]: an attention layer's KV cache {'k', 'v'}
  [N, B, max_len, K, d] in the compute dtype, a Gated DeltaNet's conv states and float32 state
  (deltanet.init_cache), whose size does not grow with max_len."""
  N = cfg.num_layers // len(cfg.layer_period)
  stack = lambda tree: jax.tree.map(  # noqa: E731
      lambda a: jnp.broadcast_to(a, (N,) + a.shape), tree)
  out = []
  for layer_type in cfg.layer_period:
    if layer_type == 'linear_attention':
      out.append(stack(deltanet.init_cache(cfg.deltanet, batch, cfg.compute_dtype)))
    else:
      shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
      out.append(stack({'k': jnp.zeros(shape, cfg.compute_dtype),
                        'v': jnp.zeros(shape, cfg.compute_dtype)}))
  return tuple(out)


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
    depth = 3 if keys[0] == 'blocks' else 1
    group = '.'.join(keys[:depth])
    by_module[group] = by_module.get(group, 0) + int(leaf.size)
  total = sum(by_module.values())
  embedding = cfg.vocab_size * cfg.hidden_size
  inactive = sum(b.ffn.inactive_params() for b in model.layer_blocks)
  return {'total': total, 'active': total - inactive,
          'embedding': embedding,
          'non_embedding': total - embedding - (0 if cfg.tie_embeddings else embedding),
          'by_module': dict(sorted(by_module.items()))}


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Analytic training FLOPs per token (forward + backward = 3x forward).

  Matmuls: 6 x the active parameters that multiply activations (everything but the embedding
  lookup; a tied table counts once, as the LM head). Attention: QK^T and PV, each 2 * T * d
  FLOPs per query head and token, halved by the causal mask, times 3: 6 * L * H * d * T, over
  the attention layers. A hybrid's Gated DeltaNet layers add their chunked delta rule's
  (deltanet.DeltaNetSpec.flops_per_token, times 3), which grows with the chunk, not with T.
  """
  report = param_report(cfg)
  matmul_params = report['active'] - (0 if cfg.tie_embeddings else report['embedding'])
  attention = 6 * cfg.num_attention_layers * cfg.num_heads * cfg.head_dim * seq_len
  linear_layers = cfg.num_layers - cfg.num_attention_layers
  delta_rule = linear_layers * deltanet.layer_flops_per_token(cfg.deltanet, seq_len)
  return 6.0 * matmul_params + attention + delta_rule
