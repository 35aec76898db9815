"""Simulated (fake) quantization: integer grids applied to the weights and to the inputs of every
linear, the numbers dequantized back to floats, so that a checkpoint's loss under W8A8, W4A8,
W4A16 or W8A16 is measured with the float model's own code (inference/quantized.py).

    w_q = quantize_weight(w, input_axes=1, bits=8)            # per output channel
    w_q = quantize_weight(w, input_axes=1, bits=4, group=128)  # per group of 128 inputs
    x_q = quantize_activation(x, bits=8, per='token', feature_axes=1)
    model = nnx.view(model, linear_inputs=LinearInputs(per='token', stats=True))

The grids (round to nearest, ties to even, symmetric, no zero point):
  weights, int8   per output channel: scale = max |w| over the channel's inputs / 127,
                  q = clip(round(w / scale), -127, 127), w_q = q * scale
  weights, int4   per group of `group` consecutive inputs of one output channel: scale =
                  max |w| over the group / 7, q in [-7, 7] (symmetric: -8 is not used, so that
                  the grid is the same on both sides and 0 is exact; the cost is one level of 16)
  activations     int8, dynamic (the scale from the tensor itself, at every call): per tensor
                  (one scale for the whole [batch, tokens, features] input of a linear) or per
                  token (one scale per row over its features); scale = max |x| / 127, q in
                  [-127, 127]
A scale of 0 (an all-zero channel, group or row) is taken as 1: q = 0, w_q = 0. Arithmetic is in
float32 (x / scale, correctly rounded), so tests/test_quantization.py matches numpy exactly.

Where: every linear of the blocks. Weights: the attention projections W_q, W_k, W_v, W_o, the
gate's kernel (it is extra columns of W_q, as the authors build it), the FFN's three kernels (a
MoE's experts per expert, its shared expert); the embedding, the LM head, the norms, the router
and an input-independent gate's bias stay float (as in LLM.int8, SmoothQuant and GPTQ
evaluations). Activations (the `LinearInputs` view): the normalised input X of the attention
(feeding Q, K, V and the gate), the SDPA output after the gate (feeding W_O; per token over all
heads), the FFN's input and the input of its down projection (a dense FFN's; a MoE quantizes its
input, the experts' down-projection inputs stay in the compute dtype: noted in the report). The
same view records, per layer and site, max |x| and the raw moments from which the pooled
kurtosis E[(x - mean)^4] / var^2 (3 for a Gaussian) is formed (Bondarenko et al. 2023 measure
outliers by these two).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.errors import ConfigError

PER = ('tensor', 'token')
SITES = ('attn_in', 'attn_out_proj_in', 'ffn_in', 'ffn_down_in')
# The parameters quantized as weights: path suffix within a block -> the number of input axes
# after the stacked layer axis (and, for a MoE, the expert axis): W_o contracts (heads, head_dim).
LINEAR_KERNELS = {
    ('attn', 'wq'): 1, ('attn', 'wk'): 1, ('attn', 'wv'): 1, ('attn', 'wo'): 2,
    ('attn', 'gate', 'kernel'): 1,
    ('ffn', 'wi_gate'): 1, ('ffn', 'wi_up'): 1, ('ffn', 'wo'): 1,
    ('ffn', 'shared_wi_gate'): 1, ('ffn', 'shared_wi_up'): 1, ('ffn', 'shared_wo'): 1,
}
EXPERT_KERNELS = {('ffn', 'wi_gate'), ('ffn', 'wi_up'), ('ffn', 'wo')}   # [L, E, in, out] in a MoE


def _scale(amax, qmax: int):
  return jnp.where(amax > 0, amax / jnp.float32(qmax), jnp.float32(1))


def fake_quantize(x, reduce_axes, bits: int):
  """x rounded to the symmetric `bits`-bit grid whose scale is max |x| over `reduce_axes` (kept)
  / (2^(bits-1) - 1); returned dequantized, in x's dtype (computed in float32)."""
  qmax = 2 ** (bits - 1) - 1
  x32 = x.astype(jnp.float32)
  scale = _scale(jnp.max(jnp.abs(x32), axis=reduce_axes, keepdims=True), qmax)
  q = jnp.clip(jnp.round(x32 / scale), -qmax, qmax)
  return (q * scale).astype(x.dtype)


def quantize_weight(w, *, input_axes: int, bits: int, group: int = 0, lead_axes: int = 1):
  """A kernel [*lead, *inputs, *outputs] quantized per output channel (group 0) or per group of
  `group` consecutive (flattened) inputs of each output channel. `lead_axes`: the stacked layer
  (and expert) axes in front; `input_axes`: how many axes the linear contracts."""
  lead, ins = w.shape[:lead_axes], w.shape[lead_axes:lead_axes + input_axes]
  outs = w.shape[lead_axes + input_axes:]
  n_in = math.prod(ins)
  flat = w.reshape(*lead, n_in, *outs)
  axis = len(lead)
  if not group:
    return fake_quantize(flat, (axis,), bits).reshape(w.shape)
  if n_in % group:
    raise ConfigError(f'quantization.group_size={group} does not divide a linear\'s {n_in} '
                      f'inputs (a kernel of shape {tuple(w.shape)}); choose a divisor of the '
                      'hidden, head and FFN sizes (e.g. 32, 64 or 128).')
  grouped = flat.reshape(*lead, n_in // group, group, *outs)
  return fake_quantize(grouped, (axis + 1,), bits).reshape(w.shape)


def quantize_activation(x, *, bits: int, per: str, feature_axes: int = 1):
  """A linear's input quantized dynamically: one scale for the whole tensor (per='tensor') or one
  per token over its last `feature_axes` axes (per='token')."""
  if per == 'tensor':
    return fake_quantize(x, tuple(range(x.ndim)), bits)
  if per == 'token':
    return fake_quantize(x, tuple(range(x.ndim - feature_axes, x.ndim)), bits)
  raise ConfigError(f'Activation quantization per {per!r}: choose one of {", ".join(PER)}.')


def input_moments(x) -> dict:
  """max |x| and the count and raw moments sum x^k (k = 1..4) over every element, in float32,
  from which `kurtosis` pools several batches."""
  x32 = x.astype(jnp.float32)
  out = {'absmax': jnp.max(jnp.abs(x32)), 'count': jnp.float32(x32.size)}
  for k in range(1, 5):
    out[f'sum{k}'] = jnp.sum(x32 ** k)
  return out


def kurtosis(count, sum1, sum2, sum3, sum4) -> float:
  """Pearson's kurtosis E[(x - m)^4] / E[(x - m)^2]^2 from raw moments (float64 on the host)."""
  n = float(count)
  m1, m2, m3, m4 = (float(s) / n for s in (sum1, sum2, sum3, sum4))
  var = m2 - m1 * m1
  c4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1 ** 4
  return c4 / (var * var) if var > 0 else float('nan')


@dataclasses.dataclass(frozen=True)
class LinearInputs:
  """What the model does at the inputs of its linears (a view: nnx.view(model, linear_inputs=
  ...)): quantize them (`per` 'tensor' or 'token', `bits`; per '' leaves them float) and/or
  record their moments (`stats`: sown as nnx.Intermediate 'linear_in_<site>')."""
  per: str = ''
  bits: int = 8
  stats: bool = False

  def __post_init__(self):
    if self.per not in ('',) + PER:
      raise ConfigError(f'LinearInputs.per={self.per!r}: choose one of "", {", ".join(PER)}.')


def linear_input(module: nnx.Module, site: str, x, feature_axes: int = 1):
  """`x`, the input of a linear at `site` of `module`, as the module's view says
  (module.linear_inputs: None leaves it as it is)."""
  spec = getattr(module, 'linear_inputs', None)
  if spec is None:
    return x
  if spec.stats:
    module.sow(nnx.Intermediate, f'linear_in_{site}', input_moments(x))
  if spec.per:
    x = quantize_activation(x, bits=spec.bits, per=spec.per, feature_axes=feature_axes)
  return x


def linear_kernels(params: dict, *, moe: bool = False) -> list[tuple[tuple, int, int]]:
  """The block linears of LINEAR_KERNELS that `params` (a pure dict, runs/factory.py) has:
  (path under 'blocks', input axes, leading axes: the layer axis, and a MoE's expert axis)."""
  out = []
  for path, input_axes in LINEAR_KERNELS.items():
    node = params['blocks']
    for key in path:
      node = node.get(key) if isinstance(node, dict) else None
      if node is None:
        break
    if node is not None:
      out.append((path, input_axes, 2 if moe and path in EXPERT_KERNELS else 1))
  return out


def check_group(params: dict, group: int, *, moe: bool = False):
  """Refuses (ConfigError) an int4 group size that does not divide every linear's inputs."""
  for path, input_axes, lead in linear_kernels(params, moe=moe):
    node = params['blocks']
    for key in path:
      node = node[key]
    n_in = math.prod(node.shape[lead:lead + input_axes])
    if n_in % group:
      raise ConfigError(f'quantization.group_size={group} does not divide the {n_in} inputs of '
                        f'blocks.{".".join(path)}; choose a divisor of the hidden, head and FFN '
                        'sizes (e.g. 32, 64 or 128).')


def quantize_params(params: dict, *, bits: int, group: int = 0, moe: bool = False):
  """The model's parameters (a pure dict, runs/factory.py) with every block linear of
  LINEAR_KERNELS quantized (bits 8: per output channel; 4: per group of `group` inputs);
  returns (params, the quantized kernels' dotted names)."""
  out = jax.tree.map(lambda x: x, params)
  names = []
  for path, input_axes, lead in linear_kernels(params, moe=moe):
    node = out['blocks']
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = quantize_weight(node[path[-1]], input_axes=input_axes, bits=bits,
                                     group=group, lead_axes=lead)
    names.append('blocks.' + '.'.join(path))
  return out, names
