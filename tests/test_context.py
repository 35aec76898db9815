"""context.py: the per-call Context splits into shared and per-layer parts for the layer scan."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention.model.context import Context

L, B, T, S, K, d = 3, 2, 4, 6, 2, 8


def _context(**over):
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  sin_cos = (np.ones((1, T, 1, d // 2), np.float32), np.zeros((1, T, 1, d // 2), np.float32))
  kv = {'k': jnp.arange(L * B * S * K * d, dtype=jnp.float32).reshape(L, B, S, K, d)}
  kv['v'] = -kv['k']
  return Context(pos, rope_tables=sin_cos, **{'kv': kv, **over})


def test_split_layers_separates_the_per_layer_fields_and_at_layer_puts_them_back():
  ctx = _context(pooled=jnp.arange(L * 5.0).reshape(L, 5))
  shared, per_layer = ctx.split_layers()
  assert set(per_layer) == set(Context.PER_LAYER) == {'kv', 'pooled'}
  assert shared.kv is None and shared.pooled is None
  assert shared.positions_BxT is ctx.positions_BxT and shared.rope_tables is ctx.rope_tables
  back = shared.at_layer(per_layer)
  assert back.kv is ctx.kv and back.pooled is ctx.pooled
  with pytest.raises(ValueError, match='not per-layer fields'):
    shared.at_layer({'positions_BxT': ctx.positions_BxT})


def test_a_scan_over_the_per_layer_part_gives_each_layer_its_slice():
  """As transformer._blocks scans: layer l sees kv[l] and pooled[l], and the shared fields
  (closed over) unchanged, with the numpy RoPE tables still numpy (constants)."""
  ctx = _context(pooled=jnp.arange(L * 5.0).reshape(L, 5))
  shared, per_layer = ctx.split_layers()

  def body(carry, layer):
    c = shared.at_layer(layer)
    assert isinstance(c.rope_tables[0], np.ndarray)
    assert c.kv['k'].shape == (B, S, K, d) and c.pooled.shape == (5,)
    return carry, (c.kv['k'][0, 0, 0, 0], c.pooled[0], c.positions_BxT)

  _, (k0_L, p0_L, pos_L) = jax.lax.scan(body, None, per_layer)
  np.testing.assert_array_equal(k0_L, ctx.kv['k'][:, 0, 0, 0, 0])
  np.testing.assert_array_equal(p0_L, ctx.pooled[:, 0])
  np.testing.assert_array_equal(pos_L, jnp.broadcast_to(ctx.positions_BxT, (L, B, T)))


def test_context_is_a_pytree_with_none_fields_empty():
  ctx = _context(kv=None)                                        # no cache, no pooled, no docs
  leaves = jax.tree.leaves(ctx)
  assert len(leaves) == 3                                        # positions, sin, cos
  out = jax.jit(lambda c: jax.tree.map(lambda x: x + 1, c))(ctx)
  assert isinstance(out, Context) and out.kv is None and out.segment_ids_BxT is None
  np.testing.assert_array_equal(out.positions_BxT, ctx.positions_BxT + 1)
  with pytest.raises(dataclasses.FrozenInstanceError):
    ctx.kv = {}
