"""The decoder: embedding -> scanned pre-norm blocks (attention + SwiGLU MLP or MoE) -> logits.

Blocks are created once with `nnx.vmap` (parameters stacked on a leading 'layers' axis) and run
with `nnx.scan`, so a 48-layer model compiles like a 1-layer one. Each block returns per-layer
auxiliary outputs (MoE losses and routing statistics; with `inspect=True` the analysis
statistics), which the scan stacks to [num_layers, ...].
"""

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention import gating, sharding
from gated_attention.attention import Attention
from gated_attention.layers import MLP, Embed, RMSNorm, param

REMAT_POLICIES = {
    'full': None,  # save nothing: recompute the whole block in the backward pass
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _where_max_abs(h_BxTxD: jax.Array) -> dict:
  """M-Act at one site: max |h| and its (batch, token, channel)."""
  a = jnp.abs(h_BxTxD.astype(jnp.float32))
  flat = jnp.argmax(a.reshape(-1))
  return {'max': a.reshape(-1)[flat], 'where': jnp.stack(jnp.unravel_index(flat, a.shape))}


def dense_ffn_size(cfg) -> int:
  """The SwiGLU width. With `ffn_match_baseline`, the FFN pays for the gate's parameters, so a
  gated dense model has the baseline's parameter count to within 1.5 * D per layer (the paper
  shrinks the FFN of its gated dense models; by how much it does not say)."""
  if not cfg.ffn_match_baseline:
    return cfg.ffn_size
  gate = nnx.eval_shape(lambda: gating.Gate(
      gating.GateSpec.from_config(cfg.gate), hidden_size=cfg.hidden_size,
      num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      init_std=cfg.init_std, rngs=nnx.Rngs(0)))
  gate_params = sum(x.size for x in jax.tree.leaves(nnx.state(gate)))
  return cfg.ffn_size - round(gate_params / (3 * cfg.hidden_size))


class Block(nnx.Module):
  """h = h + [Norm](Attn(Norm(h))); h = h + [Norm](FFN(Norm(h))), [Norm] with sandwich norm."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    D, eps = cfg.hidden_size, cfg.norm_eps
    self.attn_norm = RMSNorm(D, eps=eps)
    self.attn = Attention(cfg, rngs=rngs)
    self.ffn_norm = RMSNorm(D, eps=eps)
    if cfg.moe.num_experts > 0:
      from gated_attention.moe import MoE  # pylint: disable=g-import-not-at-top
      self.ffn = MoE(cfg, rngs=rngs)
    else:
      self.ffn = MLP(D, dense_ffn_size(cfg), std=cfg.init_std, dtype=jnp.dtype(cfg.dtype),
                     rngs=rngs)
    self.attn_post_norm = RMSNorm(D, eps=eps) if cfg.sandwich_norm else None
    self.ffn_post_norm = RMSNorm(D, eps=eps) if cfg.sandwich_norm else None
    self.is_moe = cfg.moe.num_experts > 0

  def __call__(self, h_BxTxD, positions_BxT, load_E=None, *, inspect=False):
    attn_out, stats = self.attn(self.attn_norm(h_BxTxD), positions_BxT, inspect=inspect)
    if self.attn_post_norm is not None:
      attn_out = self.attn_post_norm(attn_out)
    h_attn = sharding.constrain(h_BxTxD + attn_out, ('batch', 'seq', 'embed'))
    if self.is_moe:
      ffn_out, aux = self.ffn(self.ffn_norm(h_attn), global_load_E=load_E)
    else:
      ffn_out, aux = self.ffn(self.ffn_norm(h_attn)), {}
    if self.ffn_post_norm is not None:
      ffn_out = self.ffn_post_norm(ffn_out)
    h_out = sharding.constrain(h_attn + ffn_out, ('batch', 'seq', 'embed'))
    if inspect:
      aux = dict(aux, **stats, m_act={
          'attn_out': _where_max_abs(attn_out), 'attn_residual': _where_max_abs(h_attn),
          'ffn_out': _where_max_abs(ffn_out), 'ffn_residual': _where_max_abs(h_out)})
    return h_out, aux


class Transformer(nnx.Module):

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = jnp.dtype(cfg.dtype)
    self.embed = Embed(cfg.vocab_size, cfg.hidden_size, std=cfg.init_std, dtype=dt, rngs=rngs)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_blocks(r):
      return Block(cfg, rngs=r)

    self.blocks = make_blocks(rngs)
    self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    self.lm_head = None if cfg.tie_embeddings else param(
        rngs, (cfg.hidden_size, cfg.vocab_size), ('embed', 'vocab'), cfg.init_std)

  def __call__(self, tokens_BxT: jax.Array, *, inspect: bool = False,
               moe_load_LxE: jax.Array | None = None,
               return_hidden: bool = False) -> tuple[jax.Array, dict]:
    """Returns float32 logits [B, T, V] (or, with `return_hidden`, the final-normed hidden
    states [B, T, D]) and per-layer aux outputs stacked to [L, ...]."""
    B, T = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    h_BxTxD = sharding.constrain(self.embed(tokens_BxT), ('batch', 'seq', 'embed'))

    def body(h, block, load_E):
      return block(h, positions_BxT, load_E, inspect=inspect)

    if self.cfg.remat != 'none':
      if self.cfg.remat not in REMAT_POLICIES:
        raise ValueError(f'config.model.remat={self.cfg.remat!r} is not one of '
                         f'none, {", ".join(REMAT_POLICIES)}.')
      body = nnx.remat(body, policy=REMAT_POLICIES[self.cfg.remat])
    if moe_load_LxE is None:
      scan = nnx.scan(lambda h, blk: body(h, blk, None), in_axes=(nnx.Carry, 0))
      h_BxTxD, aux = scan(h_BxTxD, self.blocks)
    else:
      scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0))
      h_BxTxD, aux = scan(h_BxTxD, self.blocks, moe_load_LxE)

    h_BxTxD = self.final_norm(h_BxTxD)
    if return_hidden:
      return h_BxTxD, aux
    return self.logits(h_BxTxD, self.head_kernel()), aux

  def head_kernel(self) -> jax.Array:
    """The LM head [D, V] in float32: the embedding table, transposed, when tied."""
    return self.embed.embedding[...].T if self.lm_head is None else self.lm_head[...]

  @staticmethod
  def logits(h_BxTxD: jax.Array, kernel_DxV: jax.Array) -> jax.Array:
    logits = jnp.einsum('btd,dv->btv', h_BxTxD, kernel_DxV.astype(h_BxTxD.dtype))
    return sharding.constrain(logits, ('batch', 'seq', 'vocab')).astype(jnp.float32)


def abstract_model(cfg) -> Transformer:
  """The model with ShapeDtypeStructs for parameters: no memory, no FLOPs."""
  return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def param_report(cfg) -> dict:
  """Parameter counts: total, active per token, embedding, and per module."""
  state = nnx.state(abstract_model(cfg), nnx.Param)
  by_module, expert_params = {}, 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    keys = [str(getattr(p, 'key', getattr(p, 'name', p))) for p in path]
    keys = [k for k in keys if k != 'value']
    n = int(leaf.size)
    group = '.'.join(keys[:3] if keys[0] == 'blocks' else keys[:1])
    by_module[group] = by_module.get(group, 0) + n
    if keys[0] == 'blocks' and keys[1] == 'ffn' and keys[2] in ('wi_gate', 'wi_up', 'wo'):
      if cfg.moe.num_experts > 0:
        expert_params += n
  total = sum(by_module.values())
  inactive = 0
  if cfg.moe.num_experts > 0:
    inactive = expert_params * (cfg.moe.num_experts - cfg.moe.top_k) // cfg.moe.num_experts
  embedding = cfg.vocab_size * cfg.hidden_size
  return {'total': total, 'active': total - inactive, 'embedding': embedding,
          'non_embedding': total - embedding - (0 if cfg.tie_embeddings else embedding),
          'by_module': dict(sorted(by_module.items()))}


def train_flops_per_token(cfg, seq_len: int) -> float:
  """Analytic training FLOPs per token (forward + backward = 3x forward).

  Matmuls: 6 x the active parameters that multiply activations (everything but the embedding
  lookup; a tied table counts once, as the LM head). Attention: QK^T and PV, each 2 * T * d
  FLOPs per query head and token, halved by the causal mask, times 3: 6 * L * H * d * T.
  """
  report = param_report(cfg)
  matmul_params = report['active'] - (0 if cfg.tie_embeddings else report['embedding'])
  attention = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
  return 6.0 * matmul_params + attention
