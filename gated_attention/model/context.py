"""What one forward call gives every layer: positions, document ids, RoPE tables, KV cache.

    ctx = Context(positions_BxT, rope_tables=rope.tables(positions_BxT), kv=kv_L)  # Transformer
    shared, per_layer = ctx.split_layers()       # before the scan over the stacked blocks
    block(h_BxTxD, shared.at_layer(per_layer_l))  # inside it: layer l's slice of the cache

The Transformer builds one Context per call (transformer.py) and passes it down as one object.
Each Block hands it to its Attention, which reads the positions, RoPE's sin / cos, the document
ids and its layer's KV cache; the Block itself passes `pooled` on to an FFN that pools statistics
(the MoE's global-batch load balancing, Qiu et al. 2025, Sec. 3.1): a dense FFN never sees it.

Two kinds of field. Shared by every layer: `positions_BxT`, `rope_tables`, `segment_ids_BxT`,
`ring`.
Per layer (`PER_LAYER`), stacked on a leading [L, ...] axis at the Transformer and one layer's
slice inside a block: `kv` (the KV cache) and `pooled`. `split_layers` separates the two for
`nnx.scan`: the per-layer part is the scanned input, the shared part is closed over by the scan's
body, so numpy constants (rope.RoPE.constant_tables) stay constants in the graph rather than
becoming traced inputs of the loop. Context is a registered pytree (every field is data; None
fields are empty subtrees), so it also passes through jax.jit, vmap or scan as a whole.
"""

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Context:
  """One call's inputs for every layer besides the hidden states.

  positions_BxT    int32 position of each token (absolute in the window; a cache's slots)
  rope_tables      RoPE's (sin, cos) at `positions_BxT` (rope.py), made once for every layer;
                   None: each Attention computes them
  segment_ids_BxT  document ids for document masking (attention_kernels.document_ids), or None
  valid_BxT        with a cache: which tokens of the call are real (each sequence's valid
                   prefix; a right-padded prompt's padding is not), or None (all): a Gated
                   DeltaNet layer's state passes padding through unchanged (deltanet.py)
  kv               KV cache {'k', 'v'}: [L, B, S, K, d] each, in a block [B, S, K, d]; or None
                   (a Gated DeltaNet layer's: its conv and recurrent state, deltanet.py)
  pooled           the FFNs' pooled statistics over all micro-batches (train.py): [L, ...], in a
                   block that layer's; or None
  ring             a sliding-window cache's view of this decode step (kv_cache.RingView: the
                   slot to write, the visible slots, RoPE's tables by place in the cache), with
                   `kv` that ring of keys before RoPE; or None (the full cache, or none)
  """
  positions_BxT: jax.Array
  rope_tables: tuple[jax.Array, jax.Array] | None = None
  segment_ids_BxT: jax.Array | None = None
  valid_BxT: jax.Array | None = None
  kv: dict | None = None
  pooled: Any = None
  ring: Any = None

  PER_LAYER = ('kv', 'pooled')

  def split_layers(self) -> tuple['Context', dict]:
    """(the shared part, with the per-layer fields None; {field: stacked [L, ...] or None})."""
    per_layer = {name: getattr(self, name) for name in self.PER_LAYER}
    return dataclasses.replace(self, **dict.fromkeys(self.PER_LAYER)), per_layer

  def at_layer(self, per_layer: dict) -> 'Context':
    """This context with one layer's slices of the per-layer fields (`split_layers`'s dict)."""
    unknown = sorted(set(per_layer) - set(self.PER_LAYER))
    if unknown:
      raise ValueError(f'Context.at_layer: {unknown} are not per-layer fields {self.PER_LAYER}.')
    return dataclasses.replace(self, **per_layer)
