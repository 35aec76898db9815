"""Causal attention cores for training, with optional document masking.

    y_BxTxHxd = attend(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, impl='xla', segment_ids_BxT=None)

Shapes as in attention.py: B batch, T sequence, H query heads, K KV heads (query head h reads KV
head h // (H // K)), d head_dim. Every core computes the scaled dot-product attention of Qiu et
al. 2025, Sec. 2.1 (softmax(Q K^T / sqrt(d)) V, causal); the gate acts on its inputs or output
in attention.py, never in here.

`impl` (config.model.attention_impl):
  xla     jax.nn.dot_product_attention(implementation='xla'): the [B, H, T, T] scores in memory.
  cudnn   jax.nn.dot_product_attention(implementation='cudnn'): cuDNN flash attention (GPU).
  auto    jax.nn.dot_product_attention's own default (XLA's).

Document masking (data.document_mask): packed windows hold several documents (input_pipeline
packing.py joins them, each starting with BOS). With `segment_ids_BxT` (int, [B, T]) a query
attends only to keys at or before it *with the same id*; `document_ids` numbers the documents of
a window from its tokens (the count of BOS tokens up to and including each token), so the
pipeline's batches need no extra field. A token always sees itself, so no softmax row is empty.
With xla / cudnn the mask is a boolean [B, 1, T, T] passed as `mask=` (cuDNN turns it into an
additive bias; jax.nn.dot_product_attention has no segment-id argument).
"""

import jax
import jax.numpy as jnp

IMPLS = ('auto', 'xla', 'cudnn')


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


def attend(q_BxTxHxd: jax.Array, k_BxTxKxd: jax.Array, v_BxTxKxd: jax.Array, impl: str = 'auto',
           segment_ids_BxT: jax.Array | None = None) -> jax.Array:
  """Causal attention [B, T, H, d] by `impl` (see the module doc), within documents when
  `segment_ids_BxT` is given."""
  if impl not in IMPLS:
    raise ValueError(f'attention impl {impl!r} is not one of {", ".join(IMPLS)}.')
  mask = None
  if segment_ids_BxT is not None:
    mask = same_document_BxTxS(segment_ids_BxT, segment_ids_BxT)[:, None]   # [B, 1, T, T]
  return jax.nn.dot_product_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, mask=mask, is_causal=True,
                                      implementation=None if impl == 'auto' else impl)
