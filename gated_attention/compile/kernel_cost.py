"""FLOPs and HBM bytes of the Pallas TPU kernels in a compiled step (for hlo_cost / aot.py).

A Pallas kernel compiles to a `tpu_custom_call`. XLA's cost analysis takes its FLOPs and bytes
from the kernel's own `cost_estimate` when the kernel gives one (megablox gmm / tgmm do), and
otherwise counts NOTHING for it: no FLOPs, no bytes (checked on libtpu 0.0.42.1: a module
holding only a splash attention call costs the bytes of its iota and constants). The report
adds what XLA misses (`flops - xla_flops`, `bytes - xla_bytes` of `custom_call_cost`):

Megablox (gmm, tgmm): its estimate's bytes (row tiles once per n tile, the [k, n] weight tile
  once per visited row tile, the output), and 2 m k n FLOPs plus the repeated tiles: a row tile
  that straddles a group boundary is computed once per group, so the kernel visits up to
  tiles_m + G - 1 tiles (the length of its group_ids operand); FLOPs are charged per visit,
  2 m k n x visits / tiles_m (an upper bound: 3% over 2 m k n for 128 groups, 4096 tiles).
Splash attention (no estimate):

  FLOPs: 2 x bq x bkv x d per matmul per computed tile, tiles of the causal block-sparse mask
    (a tile is skipped when all its keys follow all its queries; diagonal tiles are computed
    whole). Matmuls per tile: forward 2 (QK^T, PV); dq kernel 3 (QK^T, dO V^T, dS K); dkv
    kernel 4 (QK^T, P^T dO, dO V^T, dS^T Q), 5 with the fused backward (dq in the dkv kernel).
    Per query head: grouped-query heads each do their own.
  bytes: every operand and output once, plus the re-reads of the streamed side: the forward and
    dq kernels fetch the K and V tile of every computed tile (each query head its own), the dkv
    kernel the Q and dO tile of every computed tile.

Only the causal mask is modelled (attention_kernels.splash_attention builds nothing else; a
document mask does not skip tiles). Any other tpu_custom_call without a cost estimate is
reported as `uncounted` so the gap is visible, never silently zero.
"""

import json
import math
import re

SPLASH_MATMULS = {'fwd': 2, 'dq': 3, 'dkv': 4, 'dkv_fused': 5}
_BLOCKS = {'fwd': ('block_q', 'block_kv'), 'dq': ('block_q_dq', 'block_kv_dq'),
           'dkv': ('block_q_dkv', 'block_kv_dkv'), 'dkv_fused': ('block_q_dkv', 'block_kv_dkv')}


def causal_tiles(q_len: int, kv_len: int, bq: int, bkv: int) -> int:
  """Tiles [bq, bkv] a causal mask leaves to compute: key tile j is needed by query tile i when
  its first key is at or before the tile's last query."""
  return sum(min(((i + 1) * bq - 1) // bkv + 1, kv_len // bkv) for i in range(q_len // bq))


def splash_flops(kind: str, batch_heads: int, q_len: int, kv_len: int, head_dim: int, bq: int,
                 bkv: int) -> float:
  """Matmul FLOPs of one splash kernel call over `batch_heads` (sequences x query heads)."""
  tiles = causal_tiles(q_len, kv_len, bq, bkv)
  return 2.0 * SPLASH_MATMULS[kind] * bq * bkv * head_dim * tiles * batch_heads


def splash_kind(op_name: str, fused: bool) -> str | None:
  """'fwd' | 'dq' | 'dkv' | 'dkv_fused' from a splash kernel's name, None if not splash."""
  m = re.search(r'splash_mha_(fwd|dq|dkv)', op_name)
  if not m:
    return None
  return 'dkv_fused' if m.group(1) == 'dkv' and fused else m.group(1)


def _xprof(attrs: str) -> dict:
  m = re.search(r'"xprof_metadata":"(\{.*?\})"', attrs)
  return json.loads(m.group(1).replace('\\"', '"')) if m else {}


def cost_estimate(attrs: str) -> dict | None:
  """The kernel's own estimate in its backend config (which XLA's cost analysis uses)."""
  m = re.search(r'"cost_estimate":\s*(\{[^}]*\})', attrs)
  return json.loads(m.group(1)) if m else None


def _megablox(est: dict, op_name: str, operands: list) -> dict:
  """Megablox gmm / tgmm: the estimate, FLOPs per visited row tile (module doc)."""
  flops, nbytes = float(est.get('flops', 0)), float(est.get('bytes_accessed', 0))
  ints = [s for s, b in operands if len(s) == 1 and b == 4 * s[0]]  # offsets, ids, tile ids, ..
  arrays = [s for s, b in operands if len(s) >= 2]
  visits_per_tile = 1.0
  if len(ints) >= 3 and arrays:
    groups, visits = ints[0][0] - 1, ints[1][0]
    tiles_m = visits - (groups - 1)
    visits_per_tile = visits / tiles_m if tiles_m > 0 else 1.0
  return dict(kernel='megablox', flops=flops * visits_per_tile, bytes=nbytes, xla_flops=flops,
              xla_bytes=nbytes)


def custom_call_cost(name: str, attrs: str, operands: list[tuple[tuple, float]],
                     outputs_bytes: float, output_dims: list[tuple] = ()) -> dict:
  """Cost of one tpu_custom_call: {kernel, flops, bytes, xla_flops, xla_bytes}: what it does
  and what XLA's cost analysis counted for it.

  `operands`: (shape, bytes) of each operand in order; `outputs_bytes`, `output_dims`: its
  results; `attrs`: the instruction's text after its operands (op_name metadata, frontend
  attributes, backend config). A dkv kernel is the fused one when it also returns the partial
  dq (q's shape with an axis of kv tiles; its metadata does not say)."""
  est = cost_estimate(attrs)
  op_name = re.search(r'op_name="([^"]*)"', attrs)
  op_name = (op_name.group(1) if op_name else '') + ' ' + name
  meta = _xprof(attrs)
  q_dims = next((s for s, b in operands if len(s) >= 3 and b >= 2 * math.prod(s)), ())
  fused = bool(meta.get('use_fused_bwd_kernel')) or any(   # q's shape with a kv-tile axis
      len(o) == len(q_dims) + 1 and q_dims in {o[:i] + o[i + 1:] for i in range(len(o))}
      for o in output_dims if q_dims)
  kind = splash_kind(op_name, fused)
  if est is not None and re.search(r'gmm', op_name):
    return _megablox(est, op_name, operands)
  if est is not None:
    flops, nbytes = float(est.get('flops', 0)), float(est.get('bytes_accessed', 0))
    return dict(kernel='other', flops=flops, bytes=nbytes, xla_flops=flops, xla_bytes=nbytes)
  if kind is None:
    return dict(kernel='uncounted', flops=0.0, bytes=outputs_bytes + sum(b for _, b in operands),
                xla_flops=0.0, xla_bytes=0.0)
  if meta.get('q_layout', 1) != 1 or meta.get('k_layout', 1) != 1:
    raise ValueError(f'{name}: splash cost model assumes HEAD_DIM_MINOR layouts, got {meta}')
  floats = [(s, b) for s, b in operands   # q, k, v, (logsumexp, dO, di): not the int tables
            if len(s) >= 3 and b >= 2 * math.prod(s)]
  (q_shape, q_bytes), (k_shape, k_bytes), (_, v_bytes) = floats[:3]
  *lead, q_len, head_dim = q_shape
  kv_len = k_shape[-2]
  # Without the kernel's block sizes, one tile (no skipped work): an over-count, never an under-.
  names = _BLOCKS[kind]
  bq = min(meta.get(names[0]) or meta.get('block_q') or q_len, q_len)
  bkv = min(meta.get(names[1]) or meta.get('block_kv') or kv_len, kv_len)
  tiles = causal_tiles(q_len, kv_len, bq, bkv)
  flops = splash_flops(kind, math.prod(lead), q_len, kv_len, head_dim, bq, bkv)
  once = outputs_bytes + sum(b for _, b in operands)
  if kind in ('fwd', 'dq'):   # K, V tiles re-fetched per computed tile, per query head
    group = math.prod(lead) / math.prod(k_shape[:-2])
    reread = (k_bytes + v_bytes) * (group * tiles / (kv_len // bkv) - 1)
  else:                       # Q and dO tiles re-fetched per computed tile
    reread = 2 * q_bytes * (tiles / (q_len // bq) - 1)
  return dict(kernel='splash_attention', flops=flops, bytes=once + reread, xla_flops=0.0,
              xla_bytes=0.0)
