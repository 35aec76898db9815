"""Small building blocks: parameter init, RMSNorm, SwiGLU MLP, embedding."""

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention import sharding
from gated_attention.model import quantization


def param(rngs: nnx.Rngs, shape, axes, std: float) -> nnx.Param:
  """A float32 kernel ~ truncated normal(std), carrying its logical axis names."""
  w = std * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, shape, jnp.float32)
  return nnx.Param(w, logical_axes=tuple(axes))


def project(x: jax.Array, w: jax.Array, *, preferred_element_type=None) -> jax.Array:
  """Contracts x's last axis with w's first: [..., D] x [D, ...] -> [..., *w.shape[1:]].

  The token-wise projections of the model, as one 2D matmul over the flattened leading (token)
  axes and flattened output axes, [N, D] x [D, O]. Same numbers as `jnp.einsum('btd,d...->bt...')`,
  but the backward's weight gradient then contracts one axis (N) instead of two (b, t): XLA:CPU
  canonicalises a dot with two contracting axes by transposing both operands in memory (a copy
  of every [B, T, F] activation per layer; issue 14's profile: 20% of the d=512 step), while a
  2D matmul takes its transposes as flags. On TPU and GPU the reshapes are free (b, t are the
  major axes, never split across devices differently: 'seq' is never sharded).
  """
  lead, out = x.shape[:-1], w.shape[1:]
  y = jnp.matmul(x.reshape(-1, x.shape[-1]), w.reshape(w.shape[0], -1),
                 preferred_element_type=preferred_element_type)
  return y.reshape(*lead, *out)


def project_in(x: jax.Array, w: jax.Array) -> jax.Array:
  """Contracts x's last two axes with w's first two: [..., H, d] x [H, d, D] -> [..., D]
  (the attention output projection): `project` over the flattened (H, d)."""
  return project(x.reshape(*x.shape[:-2], -1), w.reshape(-1, w.shape[-1]))


class RMSNorm(nnx.Module):
  """x / rms(x) * scale over the last axis, computed in float32. Zero-centred
  (config.model.norm_zero_centered; Qwen3-Next / Qwen3.5): x / rms(x) * (1 + scale), the scale
  initialised to 0 (the same function at init; weight decay pulls it to 1, not 0)."""

  def __init__(self, dim: int, *, eps: float, axis_name: str = 'embed',
               zero_centered: bool = False):
    init = jnp.zeros if zero_centered else jnp.ones
    self.scale = nnx.Param(init((dim,), jnp.float32), logical_axes=(axis_name,))
    self.eps = eps
    self.zero_centered = zero_centered

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    scale = 1.0 + self.scale[...] if self.zero_centered else self.scale[...]
    return (x32 * jax.lax.rsqrt(ms + self.eps) * scale).astype(x.dtype)


class Inspectable:
  """A module that records analysis statistics with `sow` when viewed with `inspect=True`
  (see `capture_stats`); set `self.inspect = False` in `__init__`. Viewed with
  `linear_inputs=quantization.LinearInputs(...)`, a module with linears quantizes their inputs
  and / or records their moments (quantization.linear_input; absent: untouched)."""

  def set_view(self, inspect: bool | None = None, linear_inputs=None):
    if inspect is not None:
      self.inspect = inspect
    if linear_inputs is not None:
      self.linear_inputs = linear_inputs


class MLP(Inspectable, nnx.Module):
  """SwiGLU feed-forward: (silu(x W_gate) * x W_up) W_down.

  The FFN interface of transformer.py (shared with moe.MoE): `mlp(x) -> (y, aux)`, and
  `reduce_aux`, `pooled_stats`, `inactive_params`; a dense FFN has no auxiliary outputs and
  pools no statistics (so it takes no `pooled`).
  """

  def __init__(self, dim: int, ffn: int, *, std: float, dtype, rngs: nnx.Rngs):
    self.wi_gate = param(rngs, (dim, ffn), ('embed', 'mlp'), std)
    self.wi_up = param(rngs, (dim, ffn), ('embed', 'mlp'), std)
    self.wo = param(rngs, (ffn, dim), ('mlp', 'embed'), std)
    self.dtype = dtype
    self.inspect = False

  def __call__(self, x_BxTxD: jax.Array) -> tuple[jax.Array, dict]:
    dt = self.dtype
    x_BxTxD = quantization.linear_input(self, 'ffn_in', x_BxTxD)
    g_BxTxF = project(x_BxTxD, self.wi_gate[...].astype(dt))
    u_BxTxF = project(x_BxTxD, self.wi_up[...].astype(dt))
    h_BxTxF = sharding.constrain(jax.nn.silu(g_BxTxF) * u_BxTxF, ('batch', 'seq', 'mlp'))
    h_BxTxF = quantization.linear_input(self, 'ffn_down_in', h_BxTxF)
    return project(h_BxTxF, self.wo[...].astype(dt)), {}

  def reduce_aux(self, aux_L: dict) -> tuple[float, dict]:
    del aux_L
    return 0.0, {}

  def pooled_stats(self, aux_L: dict):
    del aux_L

  def inactive_params(self) -> int:
    return 0


def capture_stats(module: nnx.Module, *args, **kwargs) -> tuple:
  """(module(*args, **kwargs), {name: statistic}) with every Inspectable inside viewed with
  `inspect=True`: what they `sow` is collected by name (inside `nnx.scan`, stacked per layer).
  In a hybrid (transformer.LayerPeriod) the blocks `layer_<i>` of a period sow the same names,
  each stacked over the periods [N, ...]: they are interleaved into layer order [N * n, ...]
  (n the period's blocks that sow it: an attention statistic has one row per attention layer)."""
  view = nnx.view(module, inspect=True)
  out, sown = nnx.capture(view, nnx.Intermediate)(*args, **kwargs)
  by_name = {}
  for path, value in nnx.to_flat_state(sown):
    position = next((int(p[len('layer_'):]) for p in path
                     if isinstance(p, str) and p.startswith('layer_')), None)
    value = (value.get_value() if isinstance(value, nnx.Variable) else value)[0]
    by_name.setdefault(path[-1], []).append((position, value))
  stats = {}
  for name, entries in by_name.items():
    positions = [p for p, _ in entries]
    if len(entries) > 1 and (None in positions or len(set(positions)) < len(positions)):
      raise ValueError(f'Two modules sow the statistic {name!r}.')
    values = [v for _, v in sorted(entries, key=lambda e: e[0] or 0)]
    stats[name] = values[0] if len(values) == 1 else jax.tree.map(
        lambda *a: jnp.stack(a, axis=1).reshape((-1,) + a[0].shape[1:]), *values)
  return out, stats


class Embed(nnx.Module):
  """Token embedding (the table is also the LM head when embeddings are tied: model.py)."""

  def __init__(self, vocab: int, dim: int, *, std: float, dtype, rngs: nnx.Rngs):
    self.embedding = param(rngs, (vocab, dim), ('vocab', 'embed'), std)
    self.dtype = dtype

  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    # Gather from a table that is whole along 'embed' (FSDP all-gathers it here, as for any
    # weight): a lookup into an embed-sharded table cannot be partitioned by batch.
    table = sharding.constrain(self.embedding[...], ('vocab', None))
    return jnp.take(table, tokens_BxT, axis=0).astype(self.dtype)
