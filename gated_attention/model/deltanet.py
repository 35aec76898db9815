"""Gated DeltaNet (Yang et al., ICLR 2025): the linear-attention layer of the Qwen3-Next and
Qwen3.5 hybrids, whose other layers are the paper's gated attention (Qiu et al. 2025).

    layer = GatedDeltaNet(spec, hidden_size=D, norm_eps=1e-6, init_std=0.02, dtype=jnp.float32,
                          rngs=nnx.Rngs(0))
    out_BxTxD, cache = layer(x_BxTxD, ctx)        # ctx: context.Context (positions, segments, cache)

Shapes: B batch, T sequence, D hidden, Kh key heads (q and k), Hv value heads (a multiple of
Kh: value head j reads key head j // (Hv / Kh), group-major, as transformers' repeat_interleave),
dk / dv the key / value head dims, W the conv kernel (4).

Per token t and value head (float32 from the projections on):
    q, k, v  = SiLU(causal depthwise conv_W(x W_q | x W_k | x W_v))   (each its own kernel)
    q, k     = q / |q|, k / |k|  (L2, eps 1e-6 inside the root);  q *= dk^-1/2
    g_t      = -exp(A_log) * softplus(x W_a + dt_bias)        (log decay, <= 0)
    beta_t   = sigmoid(x W_b)
    S_t      = exp(g_t) S_{t-1} + k_t beta_t (v_t - exp(g_t) S_{t-1}^T k_t)^T     [dk, dv]
    o_t      = S_t^T q_t
    y_t      = RMSNorm(o_t) * w_norm * SiLU(x W_z)              (per head over dv)
    out      = sum over heads of y_t W_o

Two forms of the same recurrence (tests/test_deltanet.py: both equal a float64 numpy loop):
  recurrent  a scan over tokens (`recurrent_delta_rule`): decoding, one token per call.
  chunked    training and prefill (`chunked_delta_rule`): the WY representation of the delta
             rule (Schlag et al. 2021; Yang et al. 2024) per chunk of C tokens. Within a chunk,
             with gamma_t the decay accumulated since the chunk's start, the writes u of the
             chunk solve one unit lower-triangular system
                 (I + A) u = beta v - beta gamma K S_0,  A_tj = beta_t (gamma_t/gamma_j) k_t.k_j  (j < t)
             (solved once for all chunks at once: `unit_lower_inverse`, forward substitution
             over the chunk's rows), so u = W_v - W_k S_0; the
             only sequential part is a scan over the T / C chunks carrying S [B, Hv, dk, dv]:
                 o = (gamma q) S_0 + [(gamma_t/gamma_j) q_t.k_j]_{j<=t} u,
                 S_C = gamma_C S_0 + sum_j (gamma_C/gamma_j) k_j u_j^T.
The recurrent state is float32 whatever the compute dtype (its decay products need it).

Document masking (ctx.segment_ids_BxT, data.document_mask): the state restarts at every
document's first token, as attention does not look past a document's start. In the chunked form
the pairs (t, j) of different documents are masked out of A and of the intra-chunk scores, the
state read from a previous chunk only by tokens of the document that continues, and the chunk's
final state only from tokens of its last document; the conv does not read inputs of another
document either. (Each is what the token loop does with S reset to 0 at a boundary.)

The cache (generation, ctx.kv of this layer): {'conv_q', 'conv_k', 'conv_v': the last W-1
projected inputs before the conv [B, W-1, heads, dim] in the compute dtype, 'state': S
[B, Hv, dk, dv] float32}, `init_cache`. Tokens beyond a sequence's valid prefix
(ctx.valid_BxT: a right-padded prompt's padding, generate.py) leave both untouched (beta = 0,
g = 0, and the conv state keeps the valid prefix's last inputs).

Design for import / export (transformers' Qwen3NextGatedDeltaNet and Qwen3_5GatedDeltaNet):
every projection is its own kernel [in, *out] with head axes, so the packings of a checkpoint are
a matter of slicing in runs/hf/:
    wq, wk [D, Kh, dk]; wv, wz [D, Hv, dv]; wb, wa [D, Hv]   <- Qwen3.5: in_proj_qkv (rows
        q | k | v, head-major), in_proj_z, in_proj_b, in_proj_a; Qwen3-Next: in_proj_qkvz (per
        key head: [q (dk) | k (dk) | v (G dv) | z (G dv)]) and in_proj_ba (per key head:
        [b (G) | a (G)])
    conv_q, conv_k [W, Kh, dk]; conv_v [W, Hv, dv]           <- conv1d.weight [2 Kh dk + Hv dv,
        1, W], channels q | k | v; tap w multiplies the input W-1-w tokens back (no bias)
    A_log, dt_bias [Hv]                                      <- A_log, dt_bias
    norm.scale [dv]  (the gated RMSNorm's plain weight, w, not 1 + w)   <- norm.weight
    wo [Hv, dv, D]                                           <- out_proj.weight [D, Hv dv]
Analysis (`inspect`, analysis/metrics.py): the layer sows `linear_gate`, the output gate SiLU(z)'s
mean, mean |.|, share below 0.1 in magnitude and histogram (`summarize_output_gate`), beside the
attention layers' gate scores.
Logical axes: key heads 'kv_heads', value heads 'heads' (both over the `tensor` mesh axis under
fsdp_tensor: value head j and its key head j // G sit on the same shard), dims 'head_dim'.
Initialisation as the authors' (flash-linear-attention): A ~ U(0, 16) (kept above 0.01),
dt = exp(U(log 1e-3, log 1e-1)) stored as dt_bias = softplus^-1(dt), the conv as PyTorch's
default (U(+-1/sqrt(W))), the gated norm's weight ones, every matmul kernel N(0, init_std).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention import sharding
from gated_attention.errors import ConfigError
from gated_attention.model import gating
from gated_attention.model.layers import Inspectable, param, project, project_in

IMPLS = ('chunked', 'recurrent')
L2_EPS = 1e-6   # inside the root, as transformers' and flash-linear-attention's l2norm


@dataclasses.dataclass(frozen=True)
class DeltaNetSpec:
  """The Gated DeltaNet layers' shapes: the run config's `model.deltanet` section, field for
  field (used by the layers that `model.layer_types` names linear_attention). Defaults: a
  CPU-sized layer (hybrid_tiny, gated_attention/config/scales.py)."""
  num_key_heads: int = 2        # Kh: heads of q and k (transformers: linear_num_key_heads)
  num_value_heads: int = 4      # Hv: heads of v, z, beta, g; a multiple of num_key_heads
  key_head_dim: int = 32        # dk (linear_key_head_dim)
  value_head_dim: int = 32      # dv (linear_value_head_dim)
  conv_kernel: int = 4          # W: the short causal depthwise conv (linear_conv_kernel_dim)
  # chunked (training, prefill) | recurrent (a scan over tokens: the reference form); a call
  # with one token always runs the recurrent step. No parameter depends on either (a saved run
  # fixes the model.deltanet section as a whole, as it does the other model sections).
  impl: str = 'chunked'
  chunk_size: int = 64          # tokens a chunk of the chunked form

  def __post_init__(self):
    def bad(field, msg):
      raise ConfigError(f'config.model.deltanet.{field}: {msg}')
    for field in ('num_key_heads', 'num_value_heads', 'key_head_dim', 'value_head_dim',
                  'conv_kernel', 'chunk_size'):
      if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
        bad(field, f'must be a positive integer, got {getattr(self, field)!r}.')
    if self.num_value_heads % self.num_key_heads:
      bad('num_value_heads', f'{self.num_value_heads} must be a multiple of num_key_heads='
          f'{self.num_key_heads} (value heads are grouped over key heads).')
    if self.impl not in IMPLS:
      bad('impl', f'{self.impl!r} is not one of {", ".join(IMPLS)}.')

  @classmethod
  def from_config(cls, section) -> 'DeltaNetSpec':
    return cls(**dict(section))

  @property
  def groups(self) -> int:
    return self.num_value_heads // self.num_key_heads

  def num_params(self, hidden_size: int) -> int:
    """Parameters of one layer."""
    D, Kh, Hv, dk, dv, W = (hidden_size, self.num_key_heads, self.num_value_heads,
                            self.key_head_dim, self.value_head_dim, self.conv_kernel)
    projections = D * (2 * Kh * dk + 2 * Hv * dv + 2 * Hv) + Hv * dv * D
    return projections + W * (2 * Kh * dk + Hv * dv) + 2 * Hv + dv

  def flops_per_token(self, seq_len: int) -> float:
    """Forward FLOPs per token of the delta rule itself (the projections are matmuls of the
    parameters, counted with them), per value head, as the chunked form computes them, with
    C = min(chunk_size, seq_len): A and the intra-chunk scores (2 x 2 C dk, both whole C x C
    blocks), the inverse of I + A by forward substitution (2 C^2: each row a [C] x [C, C]
    product), its product with the dv + dk right-hand sides (2 C (dk + dv)), W_k S, q S and the
    state update (3 x 2 dk dv), the intra-chunk output (2 C dv)."""
    C = min(self.chunk_size, seq_len)
    dk, dv = self.key_head_dim, self.value_head_dim
    per_head = 4 * C * dk + 2 * C * C + 2 * C * (dk + dv) + 6 * dk * dv + 2 * C * dv
    return float(self.num_value_heads * per_head)


# ----------------------------------------------------------------------------------------------
# The short causal conv


def causal_conv(x_BxTxNxd: jax.Array, kernel_WxNxd: jax.Array,
                segment_ids_BxT: jax.Array | None = None,
                conv_state_BxW1xNxd: jax.Array | None = None) -> jax.Array:
  """Depthwise causal conv (no activation): out_t = sum_w kernel[w] * x_{t - (W-1) + w}, the
  inputs before the window's start taken from `conv_state` (the previous call's last W-1
  inputs) or zero, and, with `segment_ids_BxT`, only inputs of token t's own document."""
  W = kernel_WxNxd.shape[0]
  B, T = x_BxTxNxd.shape[:2]
  if conv_state_BxW1xNxd is None:
    past = jnp.zeros((B, W - 1) + x_BxTxNxd.shape[2:], x_BxTxNxd.dtype)
  else:
    past = conv_state_BxW1xNxd.astype(x_BxTxNxd.dtype)
  x_ext = jnp.concatenate([past, x_BxTxNxd], axis=1)             # [B, W-1+T, N, d]
  kernel = kernel_WxNxd.astype(x_BxTxNxd.dtype)
  out = jnp.zeros_like(x_BxTxNxd)
  for w in range(W):
    tap = x_ext[:, w:w + T]                                       # x_{t - (W-1) + w}
    if segment_ids_BxT is not None and w < W - 1:
      shift = W - 1 - w
      seg_back = jnp.pad(segment_ids_BxT, ((0, 0), (shift, 0)), constant_values=-1)[:, :T]
      tap = jnp.where((seg_back == segment_ids_BxT)[:, :, None, None], tap, 0)
    out = out + tap * kernel[w]
  return out


def next_conv_state(x_BxTxNxd: jax.Array, conv_state_BxW1xNxd: jax.Array,
                    valid_BxT: jax.Array | None) -> jax.Array:
  """The conv state after this call: the last W-1 inputs of each sequence's valid prefix."""
  W1 = conv_state_BxW1xNxd.shape[1]
  T = x_BxTxNxd.shape[1]
  x_ext = jnp.concatenate([conv_state_BxW1xNxd, x_BxTxNxd.astype(conv_state_BxW1xNxd.dtype)],
                          axis=1)
  if valid_BxT is None:
    return x_ext[:, T:]
  n_B = jnp.sum(valid_BxT.astype(jnp.int32), axis=1)
  return jax.vmap(lambda xe, n: jax.lax.dynamic_slice_in_dim(xe, n, W1, axis=0))(x_ext, n_B)


# ----------------------------------------------------------------------------------------------
# The delta rule: recurrent and chunked forms


def l2_normalize(x: jax.Array) -> jax.Array:
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def recurrent_delta_rule(q_BxTxHxk, k_BxTxHxk, v_BxTxHxv, g_BxTxH, beta_BxTxH,
                         state_BxHxkxv=None, segment_ids_BxT=None):
  """The gated delta rule token by token (float32): (o [B, T, H, dv], final state
  [B, H, dk, dv]). q, k: normalised and scaled, with one head per value head. With segment ids
  the state restarts at each document's first token (the first token of the window continues
  `state`)."""
  B, T, H, dk = q_BxTxHxk.shape
  dv = v_BxTxHxv.shape[-1]
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  if state_BxHxkxv is None:
    state_BxHxkxv = jnp.zeros((B, H, dk, dv), jnp.float32)
  if segment_ids_BxT is None:
    restart_BxT = jnp.zeros((B, T), bool)
  else:
    restart_BxT = jnp.pad(segment_ids_BxT[:, 1:] != segment_ids_BxT[:, :-1], ((0, 0), (1, 0)))

  def step(S, xs):
    q, k, v, g, beta, restart = xs                 # [B, H, dk] ... [B, H], [B]
    S = jnp.where(restart[:, None, None, None], 0.0, S) * jnp.exp(g)[..., None, None]
    delta = beta[..., None] * (v - jnp.einsum('bhkv,bhk->bhv', S, k))
    S = S + k[..., :, None] * delta[..., None, :]
    return S, jnp.einsum('bhkv,bhk->bhv', S, q)

  xs = tuple(jnp.moveaxis(f32(a), 1, 0) for a in (q_BxTxHxk, k_BxTxHxk, v_BxTxHxv, g_BxTxH,
                                                   beta_BxTxH))
  S, o_TxBxHxv = jax.lax.scan(step, f32(state_BxHxkxv), xs + (restart_BxT.T,))
  return jnp.moveaxis(o_TxBxHxv, 0, 1), S


@jax.custom_vjp
def unit_lower_inverse(A_xCxC: jax.Array) -> jax.Array:
  """(I + A)^-1 for strictly lower triangular A [..., C, C] (float32), by forward substitution
  over the C rows, every batch entry at once: row i of the inverse is e_i - A[i, :i] X[:i].
  Plain XLA ops (no LAPACK call: XLA:CPU runs its batched triangular solve one matrix at a
  time, and the loop keeps nothing for the backward); its gradient is the matrix inverse's,
  -X^T dX X^T (masked to A's strictly lower part), two matmuls."""
  C = A_xCxC.shape[-1]
  eye = jnp.eye(C, dtype=A_xCxC.dtype)

  def row(i, X):
    a_i = jax.lax.dynamic_index_in_dim(A_xCxC, i, axis=-2, keepdims=False)      # [..., C]
    x_i = jax.lax.dynamic_index_in_dim(eye, i, axis=0, keepdims=False) - jnp.einsum(
        '...j,...jc->...c', a_i, X)
    return jax.lax.dynamic_update_index_in_dim(X, x_i, i, axis=-2)

  return jax.lax.fori_loop(1, C, row, jnp.broadcast_to(eye, A_xCxC.shape))


def _unit_lower_inverse_fwd(A_xCxC):
  X = unit_lower_inverse(A_xCxC)
  return X, X


def _unit_lower_inverse_bwd(X, dX):
  C = X.shape[-1]
  Xt = jnp.swapaxes(X, -1, -2)
  dA = -jnp.einsum('...ij,...jk,...kl->...il', Xt, dX, Xt)
  return (dA * jnp.tril(jnp.ones((C, C), dX.dtype), -1),)


unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def chunked_delta_rule(q_BxTxHxk, k_BxTxHxk, v_BxTxHxv, g_BxTxH, beta_BxTxH,
                       state_BxHxkxv=None, segment_ids_BxT=None, chunk_size: int = 64):
  """`recurrent_delta_rule` computed chunk by chunk (module docstring): the same (o, state)."""
  B, T, H, dk = q_BxTxHxk.shape
  dv = v_BxTxHxv.shape[-1]
  C = min(chunk_size, T)
  N = -(-T // C)
  pad = N * C - T
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  if segment_ids_BxT is None:
    segment_ids_BxT = jnp.zeros((B, T), jnp.int32)
  # Padding tokens decay nothing and write nothing (g = beta = 0, q = k = 0), in the last
  # document: the output is cut and the state is unchanged by them.
  padded = lambda a: jnp.pad(f32(a), ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2))  # noqa: E731
  q, k, v, g, beta = (padded(a) for a in (q_BxTxHxk, k_BxTxHxk, v_BxTxHxv, g_BxTxH, beta_BxTxH))
  seg = jnp.pad(segment_ids_BxT, ((0, 0), (0, pad)), mode='edge')
  # The segment of the token before each chunk (the first chunk: its own first token's, so the
  # window's first document continues `state`).
  seg_NxC = seg.reshape(B, N, C)
  seg_before_BxN = jnp.concatenate([seg_NxC[:, :1, 0], seg_NxC[:, :-1, -1]], axis=1)

  # [B, N, H, C, ...]: chunk-major, heads as a batch axis of every product.
  chunks = lambda a: jnp.moveaxis(a.reshape(B, N, C, H, -1), 3, 2)  # noqa: E731
  q, k, v = chunks(q), chunks(k), chunks(v)
  g_BxNxHxC = jnp.moveaxis(g.reshape(B, N, C, H), 3, 2)
  beta_BxNxHxC = jnp.moveaxis(beta.reshape(B, N, C, H), 3, 2)
  cum = jnp.cumsum(g_BxNxHxC, axis=-1)                             # log gamma_t
  same_BxNx1xCxC = (seg_NxC[:, :, :, None] == seg_NxC[:, :, None, :])[:, :, None]
  carry_BxNx1xC = (seg_NxC == seg_before_BxN[:, :, None])[:, :, None]   # reads the old state
  tail_BxNx1xC = (seg_NxC == seg_NxC[:, :, -1:])[:, :, None]            # writes the final state
  lower = jnp.tril(jnp.ones((C, C), bool))
  visible = lower & same_BxNx1xCxC
  diff = cum[..., :, None] - cum[..., None, :]                     # log gamma_t / gamma_j
  decay_CxC = jnp.where(visible, jnp.exp(jnp.where(visible, diff, 0.0)), 0.0)

  kk = jnp.einsum('bnhtk,bnhjk->bnhtj', k, k)
  strictly = ~jnp.eye(C, dtype=bool)
  A = beta_BxNxHxC[..., None] * kk * decay_CxC * strictly
  gamma = jnp.exp(cum) * carry_BxNx1xC
  rhs = jnp.concatenate([beta_BxNxHxC[..., None] * v,
                         (beta_BxNxHxC * gamma)[..., None] * k], axis=-1)
  solved = jnp.einsum('bnhtj,bnhjd->bnhtd', unit_lower_inverse(A), rhs)
  w_v, w_k = solved[..., :dv], solved[..., dv:]                   # u = w_v - w_k S_0
  scores = jnp.einsum('bnhtk,bnhjk->bnhtj', q, k) * decay_CxC
  q_state = q * gamma[..., None]
  to_end = jnp.where(tail_BxNx1xC, jnp.exp(cum[..., -1:] - cum), 0.0)
  k_state = k * to_end[..., None]
  chunk_decay = (jnp.exp(cum[..., -1]) * carry_BxNx1xC[..., -1])[..., None, None]

  def step(S, xs):
    w_v, w_k, scores, q_state, k_state, chunk_decay = xs
    u = w_v - jnp.einsum('bhck,bhkv->bhcv', w_k, S)
    o = jnp.einsum('bhck,bhkv->bhcv', q_state, S) + jnp.einsum('bhcj,bhjv->bhcv', scores, u)
    S = chunk_decay * S + jnp.einsum('bhck,bhcv->bhkv', k_state, u)
    return S, o

  if state_BxHxkxv is None:
    state_BxHxkxv = jnp.zeros((B, H, dk, dv), jnp.float32)
  by_chunk = lambda a: jnp.moveaxis(a, 1, 0)  # noqa: E731
  S, o_NxBxHxCxv = jax.lax.scan(
      step, f32(state_BxHxkxv),
      tuple(by_chunk(a) for a in (w_v, w_k, scores, q_state, k_state, chunk_decay)))
  o = jnp.moveaxis(o_NxBxHxCxv, 3, 2).transpose(1, 0, 2, 3, 4).reshape(B, N * C, H, dv)
  return o[:, :T], S


# ----------------------------------------------------------------------------------------------
# The layer


def init_cache(spec: DeltaNetSpec, batch: int, dtype) -> dict:
  """An empty cache of one layer (module docstring)."""
  W1, Kh, Hv, dk, dv = (spec.conv_kernel - 1, spec.num_key_heads, spec.num_value_heads,
                        spec.key_head_dim, spec.value_head_dim)
  return {'conv_q': jnp.zeros((batch, W1, Kh, dk), dtype),
          'conv_k': jnp.zeros((batch, W1, Kh, dk), dtype),
          'conv_v': jnp.zeros((batch, W1, Hv, dv), dtype),
          'state': jnp.zeros((batch, Hv, dk, dv), jnp.float32)}


class GatedRMSNorm(nnx.Module):
  """RMSNorm(o) * w * SiLU(z) over the last axis, in float32 (the weight plain, ones at init:
  transformers' Qwen3NextRMSNormGated)."""

  def __init__(self, dim: int, *, eps: float):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=('head_dim',))
    self.eps = eps

  def __call__(self, o: jax.Array, z: jax.Array) -> jax.Array:
    o32 = o.astype(jnp.float32)
    normed = o32 * jax.lax.rsqrt(jnp.mean(o32 * o32, axis=-1, keepdims=True) + self.eps)
    return normed * self.scale[...] * jax.nn.silu(z.astype(jnp.float32))


def summarize_output_gate(z: jax.Array) -> dict:
  """The analysis's view of the output gate SiLU(z) (analysis/metrics.py `linear_gate`): its mean,
  mean |SiLU(z)|, the share with |SiLU(z)| < 0.1 (nearly closed) and a histogram over
  gating.HIST_RANGE['silu'] (fractions; values outside clipped in)."""
  s = jax.nn.silu(z.astype(jnp.float32))
  lo, hi = gating.HIST_RANGE['silu']
  hist, _ = jnp.histogram(jnp.clip(s, lo, hi), bins=gating.HIST_BINS, range=(lo, hi))
  return {'mean': jnp.mean(s), 'abs_mean': jnp.mean(jnp.abs(s)),
          'frac_abs_below_0.1': jnp.mean(jnp.abs(s) < 0.1),
          'hist': hist.astype(jnp.float32) / s.size}


def _uniform(rngs, shape, lo, hi, axes):
  return nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32, lo, hi),
                   logical_axes=axes)


class GatedDeltaNet(Inspectable, nnx.Module):
  """One Gated DeltaNet layer (module docstring): `layer(x_BxTxD, ctx) -> (out, cache)`."""

  def __init__(self, spec: DeltaNetSpec, *, hidden_size: int, norm_eps: float, init_std: float,
               dtype, rngs: nnx.Rngs):
    D, Kh, Hv, dk, dv, W = (hidden_size, spec.num_key_heads, spec.num_value_heads,
                            spec.key_head_dim, spec.value_head_dim, spec.conv_kernel)
    self.spec = spec
    self.wq = param(rngs, (D, Kh, dk), ('embed', 'kv_heads', 'head_dim'), init_std)
    self.wk = param(rngs, (D, Kh, dk), ('embed', 'kv_heads', 'head_dim'), init_std)
    self.wv = param(rngs, (D, Hv, dv), ('embed', 'heads', 'head_dim'), init_std)
    self.wz = param(rngs, (D, Hv, dv), ('embed', 'heads', 'head_dim'), init_std)
    self.wb = param(rngs, (D, Hv), ('embed', 'heads'), init_std)
    self.wa = param(rngs, (D, Hv), ('embed', 'heads'), init_std)
    bound = 1.0 / math.sqrt(W)
    self.conv_q = _uniform(rngs, (W, Kh, dk), -bound, bound, ('conv', 'kv_heads', 'head_dim'))
    self.conv_k = _uniform(rngs, (W, Kh, dk), -bound, bound, ('conv', 'kv_heads', 'head_dim'))
    self.conv_v = _uniform(rngs, (W, Hv, dv), -bound, bound, ('conv', 'heads', 'head_dim'))
    A = jax.random.uniform(rngs.params(), (Hv,), jnp.float32, 0.01, 16.0)
    self.A_log = nnx.Param(jnp.log(A), logical_axes=('heads',))
    dt = jnp.exp(jax.random.uniform(rngs.params(), (Hv,), jnp.float32, math.log(1e-3),
                                    math.log(1e-1)))
    dt = jnp.maximum(dt, 1e-4)
    self.dt_bias = nnx.Param(dt + jnp.log(-jnp.expm1(-dt)), logical_axes=('heads',))
    self.norm = GatedRMSNorm(dv, eps=norm_eps)
    self.wo = param(rngs, (Hv, dv, D), ('heads', 'head_dim', 'embed'), init_std)
    self.dtype = dtype
    self.inspect = False

  def __call__(self, x_BxTxD: jax.Array, ctx) -> tuple[jax.Array, dict | None]:
    """Returns (output [B, T, D], this layer's cache after the call, or None without one).
    Reads ctx.segment_ids_BxT (document masking; not with a cache), ctx.kv (this layer's
    cache, `init_cache`) and ctx.valid_BxT (with a cache: each sequence's valid prefix)."""
    spec, dt = self.spec, self.dtype
    cache, segment_ids_BxT = ctx.kv, ctx.segment_ids_BxT
    valid_BxT = getattr(ctx, 'valid_BxT', None)
    if cache is not None and segment_ids_BxT is not None:
      raise ValueError('Document masking (segment_ids_BxT) is not supported with a cache.')
    q = project(x_BxTxD, self.wq[...].astype(dt))
    k = project(x_BxTxD, self.wk[...].astype(dt))
    v = project(x_BxTxD, self.wv[...].astype(dt))
    z = project(x_BxTxD, self.wz[...].astype(dt))
    b = project(x_BxTxD, self.wb[...].astype(dt))
    a = project(x_BxTxD, self.wa[...].astype(dt))
    new_cache = None
    if cache is not None:
      new_cache = {f'conv_{n}': next_conv_state(t, cache[f'conv_{n}'], valid_BxT)
                   for n, t in (('q', q), ('k', k), ('v', v))}
    conv = lambda t, name: jax.nn.silu(causal_conv(  # noqa: E731
        t, getattr(self, name)[...], segment_ids_BxT, None if cache is None else cache[name]))
    q, k, v = conv(q, 'conv_q'), conv(k, 'conv_k'), conv(v, 'conv_v')
    q = sharding.constrain(q, ('batch', 'seq', 'act_heads', 'head_dim'))
    v = sharding.constrain(v, ('batch', 'seq', 'act_heads', 'head_dim'))

    G = spec.groups
    q = jnp.repeat(l2_normalize(q) * spec.key_head_dim ** -0.5, G, axis=2)
    k = jnp.repeat(l2_normalize(k), G, axis=2)
    beta = jax.nn.sigmoid(b.astype(jnp.float32))
    g = -jnp.exp(self.A_log[...]) * jax.nn.softplus(a.astype(jnp.float32) + self.dt_bias[...])
    if valid_BxT is not None:                   # padding: the state passes through unchanged
      beta = jnp.where(valid_BxT[..., None], beta, 0.0)
      g = jnp.where(valid_BxT[..., None], g, 0.0)
    state = None if cache is None else cache['state']
    if spec.impl == 'recurrent' or x_BxTxD.shape[1] == 1:
      o, state = recurrent_delta_rule(q, k, v, g, beta, state, segment_ids_BxT)
    else:
      o, state = chunked_delta_rule(q, k, v, g, beta, state, segment_ids_BxT, spec.chunk_size)
    if new_cache is not None:
      new_cache['state'] = state
    y = self.norm(o, z)
    if self.inspect:   # the output gate's scores, as the analysis reports the attention gate's
      self.sow(nnx.Intermediate, 'linear_gate', summarize_output_gate(z))
    out = project_in(y.astype(dt), self.wo[...].astype(dt))
    return out, new_cache


def layer_flops_per_token(spec: DeltaNetSpec, seq_len: int) -> float:
  """Training FLOPs per token of one layer's delta rule (3x its forward), beside the matmuls of
  its parameters."""
  return 3.0 * spec.flops_per_token(seq_len)


