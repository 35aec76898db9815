"""Grouped expert matmuls and the sorted (dropless) SwiGLU dispatch that both MoE paths use.

`grouped_matmul(x, w, group_sizes, impl)`: rows of `x` sorted by group, each group multiplied by
its own weight matrix; `impl` is 'ragged_dot' (jax.lax.ragged_dot, any backend) or 'megablox'
(the Pallas TPU kernels: ragged_dot's weight gradient compiles to a dense product over all
groups on TPU, megablox's tgmm touches only each group's rows; 'megablox_interpret' runs them in
the Pallas interpreter, for tests on CPU).

`sorted_swiglu`: the dropless dispatch: the (token, expert) assignments are stably sorted by
expert, the tokens gathered in that order, the experts applied as three grouped matmuls, the
outputs weighted and scatter-added back to their tokens. The single-device path (moe.py) calls it
for all experts; the sharded path (moe_parallel.py) for the experts one device holds, the other
devices' assignments sorting last as a tail that the grouped matmuls leave at zero.
"""

import jax
import jax.numpy as jnp

from gated_attention.errors import ConfigError

IMPLS = ('auto', 'ragged_dot', 'megablox', 'megablox_interpret')
# Megablox tiles. Rows: a [tk, tn] weight tile is read once per visited row tile, and a row tile
# straddling a group boundary is computed once per group (at most G - 1 extra visits), so a
# larger row tile reads the weights fewer times for a little more MXU work: the MoE at 16
# sequences per chip (524288 rows, 128 experts) reads 3.6 GB of expert weights per call at
# 512 rows (12% repeated tiles) against 13.3 GB at 128 (3%), and is HBM-bound (docs/tpu_aot.md).
# Columns: the rows are read once per output tile, so N is tiled up to _GMM_MAX_TN.
_GMM_TM = 128       # the smallest row tile; rows are zero-padded up to a multiple of the tile
_GMM_MAX_TM = 512
_GMM_MAX_TK = 512
_GMM_MAX_TN = 1024
_GMM_MAX_FULL_TILE = 2048  # largest K/N that is not a multiple of 128 megablox takes as one tile


def resolve(impl: str, platform: str) -> str:
  """'auto' -> 'megablox' on TPU devices, else 'ragged_dot'; anything else is validated."""
  if impl not in IMPLS:
    raise ConfigError(f'Unknown config.model.moe.grouped_matmul {impl!r}; expected one of {IMPLS}')
  if impl == 'auto':
    return 'megablox' if platform == 'tpu' else 'ragged_dot'
  return impl


def row_tile(m: int) -> int:
  """Megablox row tile for m rows: _GMM_MAX_TM, or m rounded up to 128 rows when smaller."""
  return min(_GMM_MAX_TM, -(-m // _GMM_TM) * _GMM_TM)


def _gmm_tile(dim: int, name: str, cap: int = _GMM_MAX_TK) -> int:
  """Megablox K/N tile: the largest multiple of 128 up to `cap` dividing dim, else (Mosaic
  allows a block spanning the whole dimension) dim itself while it is small enough for VMEM."""
  for t in range(cap, 0, -128):
    if dim % t == 0:
      return t
  if dim <= _GMM_MAX_FULL_TILE:
    return dim
  raise ConfigError(f'config.model.moe.grouped_matmul=megablox needs the {name} dimension of the '
                   f'(per-shard) expert matmuls to be a multiple of 128 or at most '
                   f'{_GMM_MAX_FULL_TILE}, got {dim}; use '
                   f"config.model.moe.grouped_matmul='ragged_dot' for these shapes.")


def _gmm_tiling(m, k, n):
  """Per call (gmm forward, its transposed input-gradient gmm, tgmm) (tm, tk, tn); m is the
  padded row count, a multiple of row_tile(m)."""
  return row_tile(m), _gmm_tile(k, 'K'), _gmm_tile(n, 'N', _GMM_MAX_TN)


def grouped_matmul(x_MxK, w_GxKxN, group_sizes_G, impl: str, all_rows_grouped: bool = False):
  """out[rows of group g] = x[rows of group g] @ w[g]; rows past sum(group_sizes) are zero.
  `all_rows_grouped`: the caller guarantees sum(group_sizes) == M (no tail), so megablox needs
  no masking: only its padding rows are left uninitialised, and slicing drops them."""
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
  tm = row_tile(M)
  Mp = -(-M // tm) * tm
  group_sizes_G = group_sizes_G.astype(jnp.int32)
  x = jnp.pad(x_MxK, ((0, Mp - M), (0, 0))) if Mp != M else x_MxK
  if not all_rows_grouped:
    # gmm leaves rows past sum(group_sizes) (the padding, the other devices' tail) uninitialised,
    # in the output and in its input gradient: zero them on the way in and out (select,
    # NaN-safe). Two passes over [M, K] and [M, N]; with every row grouped, the padding rows
    # are sliced off (out[:M], and pad's transpose for the gradient) and nothing is needed.
    valid_M = jnp.arange(Mp, dtype=jnp.int32) < jnp.sum(group_sizes_G)
    x = jnp.where(valid_M[:, None], x, jnp.zeros((), x.dtype))
  out = gmm(x, w_GxKxN.astype(x.dtype), group_sizes_G, x.dtype, _gmm_tiling,
            interpret=impl == 'megablox_interpret')
  if not all_rows_grouped:
    out = jnp.where(valid_M[:, None], out, jnp.zeros((), out.dtype))
  return out[:M]


def sorted_swiglu(x_NxD, weights_NxK, experts_NxK, wi_gate_ExDxF, wi_up_ExDxF, wo_ExFxD, *,
                  impl: str, first_expert=0, all_experts: bool = False) -> jax.Array:
  """sum_k w_k SwiGLU_{e_k}(x) over the assignments to experts [first_expert, first_expert + E),
  E = the kernels' leading size (the others contribute nothing). Kernels in the compute dtype.
  `all_experts`: the kernels hold every expert (first_expert 0): no assignment sorts into the
  tail, so nothing is masked."""
  N, K = experts_NxK.shape
  E = wi_gate_ExDxF.shape[0]
  M = N * K                                       # assignments, token-major
  local_M = experts_NxK.reshape(M) - first_expert
  mine_M = (local_M >= 0) & (local_M < E)
  key_M = jnp.where(mine_M, local_M, E)           # other experts sort last
  order_M = jnp.argsort(key_M, stable=True)
  token_M = order_M // K
  group_sizes_E = jnp.bincount(key_M, length=E + 1)[:E].astype(jnp.int32)
  x_MxD = x_NxD[token_M]
  g = grouped_matmul(x_MxD, wi_gate_ExDxF, group_sizes_E, impl, all_experts)
  u = grouped_matmul(x_MxD, wi_up_ExDxF, group_sizes_E, impl, all_experts)
  y_MxD = grouped_matmul(jax.nn.silu(g) * u, wo_ExFxD, group_sizes_E, impl, all_experts)
  w_M = weights_NxK.reshape(M)[order_M]
  if all_experts:
    y_MxD = y_MxD * w_M.astype(y_MxD.dtype)[:, None]
  else:
    mine_sorted_M = mine_M[order_M]
    w_M = jnp.where(mine_sorted_M, w_M, 0).astype(y_MxD.dtype)
    y_MxD = jnp.where(mine_sorted_M[:, None], y_MxD, 0) * w_M[:, None]
  return jax.ops.segment_sum(y_MxD, token_M, num_segments=N)
