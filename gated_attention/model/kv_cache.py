"""A sliding-window KV cache with attention sinks: a ring buffer of fixed size (StreamingLLM).

    window = Window(window=256, sinks=4)          # keep the first 4 tokens and the last 256
    kv = {'k': zeros([L, B, window.capacity, K, d]), 'v': ...}     # inference/generate.py
    ring = window.view(pos_B, write_B, rope)      # per decode step: the Context's `ring`
    logits, kv = model.decode(tokens_Bx1, pos_B, kv, window=window)   # model/transformer.py

Xiao et al. 2023 ("Efficient Streaming Language Models with Attention Sinks", StreamingLLM): a
model decoding with a window of the last W tokens collapses once the first tokens leave it,
because it parks attention on them (the attention sink); keeping the first S tokens ("sinks")
besides the window restores it. The cache holds S + W slots: token p is written at slot p while
p < S (the sinks, never evicted), then at slot S + (p - S) mod W (the ring: each new token
evicts the oldest of the window). A query at position p sees the sinks and the last W tokens, p
itself included.

Positions are assigned *inside the cache*, as StreamingLLM does: the kept tokens, in text order,
take RoPE positions 0, 1, 2, ... by their place in the cache, not their place in the text, so
no position ever exceeds S + W - 1 however long the stream (a model trained at length >= S + W
never sees a position it was not trained on). Sink j sits at j; window token j at
S + j - max(S, p - W + 1); the query at the place of p. This is why the keys are cached before
RoPE (after QK-norm) and rotated at every step by their current place: a window token's place
falls by one each time the window slides.

Before the first eviction (p < S + W) every place equals the text position, and the windowed
cache computes what the full cache (attention.py's `write_cache` path) computes, bitwise when it
has as many slots (tests/test_kv_cache.py). The ring is written one token per call (decoding,
and prompts fed token by token: inference/generate.py scans them), so every query sees exactly
its own window.
"""

import dataclasses

import jax
import jax.numpy as jnp

from gated_attention.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Window:
  """The sliding-window cache's shape: the last `window` tokens and the first `sinks`. A
  hashable value (a static argument of the jit-compiled decode step)."""
  window: int
  sinks: int = 0

  def __post_init__(self):
    if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
      raise ConfigError(f'The sliding window must hold at least 1 token; it is {self.window!r} '
                        '(0 means the full cache: pass no window).')
    if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
      raise ConfigError(f'The number of sink tokens must be 0 or more; it is {self.sinks!r}.')

  @classmethod
  def from_settings(cls, window: int, sinks: int, *, names=('window', 'sinks')):
    """The Window of a command's settings, or None for window 0 (the full cache); a bad
    combination is refused naming the settings (`names`: how the user spells them)."""
    w, s = names
    for name, value in ((w, window), (s, sinks)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f'{name}={value!r}: give a whole number of tokens, 0 or more.')
    if window == 0:
      if sinks:
        raise ConfigError(f'{s}={sinks} without {w}: sink tokens are kept besides a sliding '
                          f'window; set {w} to the tokens the window keeps (e.g. {w}=256), or '
                          f'{s}=0 for the full cache.')
      return None
    return cls(window=window, sinks=sinks)

  @property
  def capacity(self) -> int:
    """The cache's slots: sinks + window."""
    return self.sinks + self.window

  def clamped(self, max_len: int) -> 'Window':
    """The same cache for sequences of at most `max_len` tokens: no larger than they need (a
    window that covers them never evicts: its slots beyond max_len would stay empty)."""
    if self.capacity <= max_len:
      return self
    sinks = min(self.sinks, max_len - 1)
    return Window(window=max_len - sinks, sinks=sinks)

  def slot(self, pos):
    """The slot of the token at text position `pos` (int array)."""
    S, W = self.sinks, self.window
    return jnp.where(pos < S, pos, S + (pos - S) % W)

  def held_positions(self, pos_B):
    """int32 [B, capacity]: the text position each slot holds once the token at `pos_B` is
    written (-1: empty)."""
    S, W = self.sinks, self.window
    slots_C = jnp.arange(self.capacity, dtype=jnp.int32)
    p = pos_B[:, None].astype(jnp.int32)
    sink = jnp.where(slots_C[None] <= p, slots_C[None], -1)
    # ring slot i holds the latest q <= p with S + (q - S) mod W == i
    q = p - jnp.mod(self.slot(p) - slots_C[None], W)
    ring = jnp.where((p >= S) & (q >= S), q, -1)
    return jnp.where(slots_C[None] < S, sink, ring)

  def place(self, text_pos, pos_B):
    """RoPE positions by place in the cache of the tokens at `text_pos` [B, ...] (held by the
    cache when the query at `pos_B` runs): sinks keep theirs, the window starts right after."""
    S, W = self.sinks, self.window
    start = jnp.maximum(S, pos_B - W + 1).reshape(pos_B.shape + (1,) * (text_pos.ndim - 1))
    return jnp.where(text_pos < S, text_pos, S + text_pos - start).astype(jnp.int32)

  def view(self, pos_B, write_B, rope) -> 'RingView':
    """What one decode step (one token per sequence, at `pos_B`) gives every layer: where the
    token goes, which slots are visible, the RoPE tables of every slot by its place, and those
    of the query (by its place). `write_B`: the sequences that write their token (False: a
    prompt shorter than the batch's longest, already fed; its cache stays as it is)."""
    held_BxC = self.held_positions(pos_B)
    valid_BxC = held_BxC >= 0
    key_tables = rope.tables(jnp.where(valid_BxC, self.place(held_BxC, pos_B), 0))
    query_tables = rope.tables(self.place(pos_B[:, None], pos_B))
    return RingView(slot_B=self.slot(pos_B).astype(jnp.int32), write_B=write_B,
                    valid_BxC=valid_BxC, key_tables=key_tables, query_tables=query_tables)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RingView:
  """One decode step's view of the sliding-window cache, shared by every layer (context.py).

  slot_B        int32 slot that each sequence's token is written to
  write_B       bool: whether it is written (False leaves that sequence's cache unchanged)
  valid_BxC     bool: the slots the query sees (written, and its own token's included)
  key_tables    RoPE's (sin, cos) [B, C, 1, d/2] at each slot's place in the cache
  query_tables  RoPE's (sin, cos) [B, 1, 1, d/2] at the query's place
  """
  slot_B: jax.Array
  write_B: jax.Array
  valid_BxC: jax.Array
  key_tables: tuple
  query_tables: tuple


def write_slot(cache_BxCxKxd: jax.Array, new_Bx1xKxd: jax.Array, ring: RingView) -> jax.Array:
  """The cache with each sequence's new entry at its slot (where `ring.write_B`)."""
  def one(cache_CxKxd, new_1xKxd, slot, write):
    old = jax.lax.dynamic_slice(cache_CxKxd, (slot, 0, 0), new_1xKxd.shape)
    value = jnp.where(write, new_1xKxd.astype(cache_CxKxd.dtype), old)
    return jax.lax.dynamic_update_slice(cache_CxKxd, value, (slot, 0, 0))
  return jax.vmap(one)(cache_BxCxKxd, new_Bx1xKxd, ring.slot_B, ring.write_B)
