"""Causal attention cores for training, one per backend, with optional document masking.

    y_BxTxHxd = attend(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, impl, segment_ids_BxT=None,
                       block_q=0, block_kv=0, platform='cpu')

Shapes as in attention.py: B batch, T sequence, H query heads, K KV heads (query head h reads KV
head h // G, G = H // K), d head_dim. Every core computes the scaled dot-product attention of Qiu
et al. 2025, Sec. 2.1 (softmax(Q K^T / sqrt(d)) V, causal); the gate acts on its inputs or output
in attention.py, never in here.

`impl` (config.model.attention_impl):
  xla        jax.nn.dot_product_attention(implementation='xla'): the [B, H, T, T] scores in memory.
  cudnn      jax.nn.dot_product_attention(implementation='cudnn'): cuDNN flash attention (GPU;
             bfloat16 / float16, head_dim a multiple of 8 up to 128).
  splash     Pallas splash attention (TPU): block-sparse causal kernel over block_q x block_kv
             tiles (multiples of 128 dividing T; default 512). On other platforms it runs in the
             Pallas interpreter (correct and slow: for tests). `fused_bwd`
             (config.model.attention_fused_bwd): one backward kernel computes dq, dk and dv
             (5 matmuls per tile) instead of a dq kernel (3) and a dkv kernel (4), at the price
             of per-key-tile partial dq in bf16 summed afterwards. Its output and log-sum-exp
             carry the checkpoint name SPLASH_RESIDUALS, which remat='save_attention' saves
             (model.py), so the backward pass does not rerun the forward kernel.
  blockwise  pure JAX: a loop over query blocks, each an online softmax over the key blocks at or
             before it (flash attention's recurrence, Dao et al. 2022), with a custom backward that
             recomputes each tile's probabilities from the saved log-sum-exp. At most one
             [block_q, block_kv] tile of scores per head exists at a time, forward and backward,
             and key tiles after the query tile are skipped. Tiles divide T (default 128).
  chunked    pure JAX: the queries in chunks of block_q (default 128), chunk i attending to its key
             prefix [0, (i+1) block_q) in one exact softmax. The causal half of the work (keys after
             a chunk are never touched), no [T, T] buffer, an unrolled loop of static shapes, and
             every matmul over [B, K, G x chunk, ...] with (b, k) batch axes and one contracting
             axis, so XLA:CPU needs no transposed copies, forward or backward. Autodiff saves each
             chunk's probabilities: memory grows as T^2 / 2 per head (blockwise's is linear).
  auto       `choose`: splash on TPU and cudnn on GPU where the shapes and dtype allow, else xla;
             on CPU chunked up to T = 4096 (CHUNKED_MAX_T_CPU), blockwise beyond, where the
             tiles divide T, else xla.

Why chunked on CPU: forward + backward on this project's 2-core CPU, float32, 4096-8192 tokens a
call, best of 5, the implementations interleaved (ms; 128-token tiles / chunks):
  B, T, H, K, d         xla    blockwise   chunked
  16,  128, 4, 2,  32    13.6      16.0        8.5
  16,  256, 4, 2,  64   107.1      98.5       74.0
   8,  512, 8, 4,  64   424.5     354.8      231.8   (issue 14's shape b)
   4, 1024, 8, 4,  64  1002.8     576.2      398.2
   4, 1024, 8, 4, 128  1358.0    1098.4      615.7
   2, 2048, 4, 2,  32   981.4     347.8      236.4
   2, 2048, 8, 4, 128  2699.3    1926.6     1017.6
   1, 4096, 4, 2,  32  1881.0     738.3      516.9
(chunks of 64: within 5% of 128 except at 2048 x d=128 and 4096, where 10-20% slower; of 256:
10-50% slower.) `python benchmarks/attention.py --impls=xla,blockwise:128,chunked:128` repeats it.
Beyond 4096 blockwise takes over on CPU for its linear memory (not timed there).

Document masking (data.document_mask): packed windows hold several documents (input_pipeline
packing.py joins them, each starting with BOS). With `segment_ids_BxT` (int, [B, T]) a query
attends only to keys at or before it *with the same id*; `document_ids` numbers the documents of
a window from its tokens (the count of BOS tokens up to and including each token), so the
pipeline's batches need no extra field. A token always sees itself, so no softmax row is empty.
With xla / cudnn the mask is a boolean [B, 1, T, T] passed as `mask=` (cuDNN turns it into an
additive bias; jax.nn.dot_product_attention has no segment-id argument); splash takes segment ids
natively; blockwise compares the ids of each tile.
"""

import functools
import math

import jax
import jax.numpy as jnp

from gated_attention import sharding
from gated_attention.errors import ConfigError

IMPLS = ('auto', 'xla', 'cudnn', 'splash', 'blockwise', 'chunked')
DEFAULT_BLOCKS = {'splash': 512, 'blockwise': 128, 'chunked': 128}  # config block size 0: these
CHUNKED_MAX_T_CPU = 4096   # 'auto' on CPU: chunked up to this length, blockwise beyond (above)
_NEG = -1e30        # a masked score: finite, so fully masked tiles never give inf - inf
_LANES = 128        # splash tiles are multiples of the TPU lane width
SPLASH_RESIDUALS = 'splash_residuals'  # checkpoint name of splash's output and log-sum-exp


def document_ids(tokens_BxT: jax.Array, bos_id: int) -> jax.Array:
  """int32 [B, T]: the number of BOS tokens at or before each position. A window that starts
  inside a document gives that tail id 0; each BOS starts the next id."""
  return jnp.cumsum(tokens_BxT == bos_id, axis=1, dtype=jnp.int32)


def causal_mask(T: int, S: int | None = None) -> jax.Array:
  """bool [T, S]: query t may see key s <= t."""
  return jnp.tril(jnp.ones((T, S or T), bool))


def same_document_BxTxS(q_segment_ids_BxT: jax.Array, kv_segment_ids_BxS: jax.Array) -> jax.Array:
  """bool [B, T, S]: query t and key s belong to the same document."""
  return q_segment_ids_BxT[:, :, None] == kv_segment_ids_BxS[:, None, :]


# --------------------------------------------------------------------------------------------
# Choosing an implementation
# --------------------------------------------------------------------------------------------

def blocks(impl: str, T: int, block_q: int, block_kv: int) -> tuple[int, int]:
  """The tile sizes `impl` uses at sequence length T: the configured ones (0: DEFAULT_BLOCKS),
  capped at T."""
  return tuple(min(b or DEFAULT_BLOCKS[impl], T) for b in (block_q, block_kv))


def block_problem(impl: str, T: int, block_q: int, block_kv: int) -> str | None:
  """Why `impl` cannot tile a sequence of T tokens with these blocks (None: it can)."""
  if impl not in DEFAULT_BLOCKS:
    return None
  bq, bkv = blocks(impl, T, block_q, block_kv)
  if impl == 'chunked' and T % bq:                  # keys: the whole prefix, block_kv unused
    return f'the query chunk {bq} must divide the sequence length {T}'
  if impl != 'chunked' and (T % bq or T % bkv):
    return f'the blocks ({bq}, {bkv}) must divide the sequence length {T}'
  if impl == 'splash' and (bq % _LANES or bkv % _LANES):
    return f'splash needs blocks that are multiples of {_LANES}, got ({bq}, {bkv})'
  return None


def cudnn_fits(dtype, head_dim: int, T: int, masked: bool) -> bool:
  """Whether cuDNN flash attention takes these inputs (jax's check_is_flash_attention)."""
  return (jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0
          and head_dim <= 128 and not (masked and T % 2))


def choose(impl: str, platform: str, dtype, T: int, head_dim: int, block_q: int,
           block_kv: int, masked: bool = False) -> str:
  """The implementation 'auto' stands for here (any other `impl` is returned as it is)."""
  if impl != 'auto':
    return impl
  if platform == 'tpu' and block_problem('splash', T, block_q, block_kv) is None:
    return 'splash'
  if platform == 'gpu' and cudnn_fits(dtype, head_dim, T, masked):
    return 'cudnn'
  if platform == 'cpu':
    impl = 'chunked' if T <= CHUNKED_MAX_T_CPU else 'blockwise'
    if block_problem(impl, T, block_q, block_kv) is None:
      return impl
  return 'xla'


def check(impl: str, T: int, block_q: int, block_kv: int):
  """Raises ConfigError naming the fields when `impl` cannot run at sequence length T."""
  if impl not in IMPLS:
    raise ConfigError(f'config.model.attention_impl={impl!r} is not one of {", ".join(IMPLS)}.')
  problem = block_problem(impl, T, block_q, block_kv)
  if problem:
    raise ConfigError(f'config.model.attention_impl={impl!r} at data.seq_len={T}: {problem}; '
                      'set config.model.attention_block_q / attention_block_kv, or another '
                      f'attention_impl (one of {", ".join(IMPLS)}).')


def attend(q_BxTxHxd: jax.Array, k_BxTxKxd: jax.Array, v_BxTxKxd: jax.Array, impl: str = 'auto',
           segment_ids_BxT: jax.Array | None = None, *, block_q: int = 0, block_kv: int = 0,
           platform: str | None = None, fused_bwd: bool = True) -> jax.Array:
  """Causal attention [B, T, H, d] by `impl` (see the module doc), within documents when
  `segment_ids_BxT` is given. `platform` (default: JAX's backend) decides 'auto'; `fused_bwd`:
  splash's fused backward kernel."""
  T, d = q_BxTxHxd.shape[1], q_BxTxHxd.shape[3]
  platform = platform or jax.default_backend()
  impl = choose(impl, platform, q_BxTxHxd.dtype, T, d, block_q, block_kv,
                segment_ids_BxT is not None)
  check(impl, T, block_q, block_kv)
  args = (q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT)
  if impl == 'splash':
    return splash_attention(*args, block_q=block_q, block_kv=block_kv, fused_bwd=fused_bwd,
                            interpret=platform != 'tpu')
  if impl == 'blockwise':
    return blockwise_attention(*args, block_q=block_q, block_kv=block_kv)
  if impl == 'chunked':
    return chunked_attention(*args, block_q=block_q)
  mask = None
  if segment_ids_BxT is not None:
    mask = same_document_BxTxS(segment_ids_BxT, segment_ids_BxT)[:, None]   # [B, 1, T, T]
  return jax.nn.dot_product_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, mask=mask, is_causal=True,
                                      implementation=impl)


# --------------------------------------------------------------------------------------------
# Pallas splash attention (TPU)
# --------------------------------------------------------------------------------------------

def splash_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT=None, *, block_q: int = 0,
                     block_kv: int = 0, fused_bwd: bool = True,
                     interpret: bool = False) -> jax.Array:
  """Splash attention, causal (its block-sparse mask skips tiles above the diagonal), per
  sequence (vmap), each data-parallel shard on its own (shard_map over the batch axes)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa  # pylint: disable=g-import-not-at-top
  _, T, H, d = q_BxTxHxd.shape
  bq, bkv = blocks('splash', T, block_q, block_kv)
  dq_blocks = {} if fused_bwd else dict(block_q_dq=bq, block_kv_dq=bkv)
  sizes = sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                        block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                        use_fused_bwd_kernel=fused_bwd, **dq_blocks)
  mask = sa.MultiHeadMask([sa.CausalMask((T, T)) for _ in range(H)])

  def per_shard(q, k, v, seg):
    kernel = sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                residual_checkpoint_name=SPLASH_RESIDUALS, interpret=interpret)
    q_HxTxd = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, T, N, d] -> [B, N, T, d]
    q, k, v = q_HxTxd(q * jnp.asarray(1 / math.sqrt(d), q.dtype)), q_HxTxd(k), q_HxTxd(v)
    if seg is None:
      y = jax.vmap(kernel)(q, k, v)
    else:
      y = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(s, s)))(
          q, k, v, seg)
    return jnp.swapaxes(y, 1, 2)

  # Pallas calls cannot declare how their outputs vary over the manual mesh axes.
  return sharding.per_batch_shard(per_shard, q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT,
                                  check_vma=False)


# --------------------------------------------------------------------------------------------
# Chunked causal attention in pure JAX
# --------------------------------------------------------------------------------------------

def chunked_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT=None, *,
                      block_q: int = 0) -> jax.Array:
  """Causal attention by query chunks, each over its key prefix in one softmax (module doc)."""
  B, T, H, d = q_BxTxHxd.shape
  K = k_BxTxKxd.shape[2]
  G = H // K
  c = blocks('chunked', T, block_q, 0)[0]
  # [B, K, G, T, d]: a query's head group next to its KV head, so every product below has the
  # batch axes (b, k) first and contracts a single axis.
  q_BxKxGxTxd = q_BxTxHxd.reshape(B, T, K, G, d).transpose(0, 2, 3, 1, 4)
  k_BxKxTxd, v_BxKxTxd = k_BxTxKxd.transpose(0, 2, 1, 3), v_BxTxKxd.transpose(0, 2, 1, 3)
  scale = jnp.asarray(1 / math.sqrt(d), jnp.float32)
  outs = []
  for i in range(T // c):
    S = (i + 1) * c                                          # the chunk's key prefix
    q_BxKxQxd = q_BxKxGxTxd[:, :, :, i * c:S].reshape(B, K, G * c, d)
    logits = jnp.einsum('bkqd,bksd->bkqs', q_BxKxQxd, k_BxKxTxd[:, :, :S],
                        preferred_element_type=jnp.float32) * scale
    visible_cxS = jnp.arange(S)[None, :] <= jnp.arange(i * c, S)[:, None]
    if segment_ids_BxT is None:
      visible = visible_cxS[None, None, None]
    else:
      same = same_document_BxTxS(segment_ids_BxT[:, i * c:S], segment_ids_BxT[:, :S])
      visible = (visible_cxS[None] & same)[:, None, None]   # [B, 1, 1, c, S]
    logits = jnp.where(visible, logits.reshape(B, K, G, c, S), _NEG).reshape(B, K, G * c, S)
    probs = jax.nn.softmax(logits, axis=-1).astype(v_BxTxKxd.dtype)
    outs.append(jnp.einsum('bkqs,bksd->bkqd', probs, v_BxKxTxd[:, :, :S]).reshape(B, K, G, c, d))
  out_BxKxGxTxd = jnp.concatenate(outs, axis=3)
  return out_BxKxGxTxd.transpose(0, 3, 1, 2, 4).reshape(B, T, H, d)


# --------------------------------------------------------------------------------------------
# Blockwise (online softmax) attention in pure JAX
# --------------------------------------------------------------------------------------------

def blockwise_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT=None, *,
                        block_q: int = 0, block_kv: int = 0) -> jax.Array:
  """Causal attention that never holds more than one [block_q, block_kv] tile of scores per
  head (see the module doc); blocks (0: 128) are capped at T and must divide it."""
  B, T, H, d = q_BxTxHxd.shape
  K = k_BxTxKxd.shape[2]
  bq, bkv = blocks('blockwise', T, block_q, block_kv)
  if T % bq or T % bkv:
    raise ValueError(f'blockwise attention: blocks ({bq}, {bkv}) must divide T={T}.')
  seg_BxT = (jnp.zeros((B, T), jnp.int32) if segment_ids_BxT is None
             else segment_ids_BxT.astype(jnp.int32))
  q_BxTxKxGxd = q_BxTxHxd.reshape(B, T, K, H // K, d)
  y_BxTxKxGxd = _blockwise(q_BxTxKxGxd, k_BxTxKxd, v_BxTxKxd, seg_BxT, bq, bkv)
  return y_BxTxKxGxd.reshape(B, T, H, d)


def _tile(x, i, size):
  """Block i (of `size` along the sequence axis, axis 1) of x."""
  return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=1)


def _tile_scores(q_Bxbqx, k_Bxbkvx, seg_q, seg_k, i, j, bq, bkv):
  """Scaled scores [B, K, G, bq, bkv] (float32) of query tile i and key tile j, and their mask
  (causal, same document)."""
  d = q_Bxbqx.shape[-1]
  s = jnp.einsum('bqkgd,bckd->bkgqc', q_Bxbqx, k_Bxbkvx,
                 preferred_element_type=jnp.float32) * (1.0 / math.sqrt(d))
  causal = (j * bkv + jnp.arange(bkv))[None, :] <= (i * bq + jnp.arange(bq))[:, None]
  mask = (causal[None] & (seg_q[:, :, None] == seg_k[:, None, :]))[:, None, None]
  return jnp.where(mask, s, _NEG), mask


def _forward(q, k, v, seg, bq, bkv):
  """Outputs [B, T, K, G, d] and log-sum-exp [B, K, G, T] (float32)."""
  B, T, K, G, d = q.shape

  def q_block(i):
    qi, sq = _tile(q, i, bq), _tile(seg, i, bq)

    def kv_step(j, carry):
      m, l, acc = carry
      s, mask = _tile_scores(qi, _tile(k, j, bkv), sq, _tile(seg, j, bkv), i, j, bq, bkv)
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
      corr = jnp.exp(m - m_new)
      pv = jnp.einsum('bkgqc,bckd->bkgqd', p.astype(v.dtype), _tile(v, j, bkv),
                      preferred_element_type=jnp.float32)
      return m_new, l * corr + p.sum(-1), acc * corr[..., None] + pv

    init = (jnp.full((B, K, G, bq), _NEG, jnp.float32), jnp.zeros((B, K, G, bq), jnp.float32),
            jnp.zeros((B, K, G, bq, d), jnp.float32))
    last = ((i + 1) * bq - 1) // bkv                      # the last key tile a query here sees
    m, l, acc = jax.lax.fori_loop(0, last + 1, kv_step, init)
    return acc / l[..., None], m + jnp.log(l)

  out, lse = jax.lax.map(q_block, jnp.arange(T // bq))  # [n, B, K, G, bq, (d)]
  out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(B, T, K, G, d).astype(q.dtype)
  lse = jnp.moveaxis(lse, 0, 3).reshape(B, K, G, T)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blockwise(q, k, v, seg, bq, bkv):
  return _forward(q, k, v, seg, bq, bkv)[0]


def _blockwise_fwd(q, k, v, seg, bq, bkv):
  out, lse = _forward(q, k, v, seg, bq, bkv)
  return out, (q, k, v, seg, out, lse)


def _tile_grads(q, k, v, seg, dout, lse, delta, i, j, bq, bkv):
  """For query tile i and key tile j: the probabilities p and dS = p (dP - delta), each
  [B, K, G, bq, bkv] float32 (recomputed from the saved log-sum-exp)."""
  s, mask = _tile_scores(_tile(q, i, bq), _tile(k, j, bkv), _tile(seg, i, bq),
                         _tile(seg, j, bkv), i, j, bq, bkv)
  lse_i = jax.lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=3)
  p = jnp.where(mask, jnp.exp(s - lse_i[..., None]), 0.0)
  dp = jnp.einsum('bqkgd,bckd->bkgqc', _tile(dout, i, bq), _tile(v, j, bkv),
                  preferred_element_type=jnp.float32)
  delta_i = jax.lax.dynamic_slice_in_dim(delta, i * bq, bq, axis=3)
  return p, p * (dp - delta_i[..., None])


def _blockwise_bwd(bq, bkv, res, dout):
  """dQ row tile by row tile, dK and dV column tile by column tile (two passes, each over the
  tiles at or below the diagonal only)."""
  q, k, v, seg, out, lse = res
  B, T, K, G, d = q.shape
  scale = 1.0 / math.sqrt(d)
  delta = jnp.einsum('btkgd,btkgd->bkgt', dout.astype(jnp.float32), out.astype(jnp.float32))
  grads = functools.partial(_tile_grads, q, k, v, seg, dout, lse, delta, bq=bq, bkv=bkv)

  def dq_block(i):
    def step(j, dq):
      _, ds = grads(i=i, j=j)
      return dq + jnp.einsum('bkgqc,bckd->bqkgd', ds, _tile(k, j, bkv).astype(jnp.float32))
    zero = jnp.zeros((B, bq, K, G, d), jnp.float32)
    return jax.lax.fori_loop(0, ((i + 1) * bq - 1) // bkv + 1, step, zero)

  def dkv_block(j):
    def step(i, carry):
      dk, dv = carry
      p, ds = grads(i=i, j=j)
      dv = dv + jnp.einsum('bkgqc,bqkgd->bckd', p, _tile(dout, i, bq).astype(jnp.float32))
      return dk + jnp.einsum('bkgqc,bqkgd->bckd', ds, _tile(q, i, bq).astype(jnp.float32)), dv
    zero = jnp.zeros((B, bkv, K, d), jnp.float32)
    return jax.lax.fori_loop((j * bkv) // bq, T // bq, step, (zero, zero))

  untile = lambda x: jnp.moveaxis(x, 0, 1).reshape(B, T, *x.shape[3:])  # noqa: E731
  dq = untile(jax.lax.map(dq_block, jnp.arange(T // bq))) * scale
  dk, dv = jax.lax.map(dkv_block, jnp.arange(T // bkv))
  return (dq.astype(q.dtype), (untile(dk) * scale).astype(k.dtype), untile(dv).astype(v.dtype),
          None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)
