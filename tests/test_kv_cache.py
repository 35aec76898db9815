"""model/kv_cache.py and the sliding-window path of generate.py: the ring's slots and positions
against a list simulation, streaming logits against a float64 numpy StreamingLLM reference, the
full cache reproduced bitwise by a window that covers the sequence, memory flat with length."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.errors import ConfigError
from gated_attention.inference import generate
from gated_attention.model import kv_cache
from gated_attention.model import transformer as model
from gated_attention.model.rope import RoPE
from tests import reference as ref
from tests.jax_helpers import model_config, perturb

T = 18


def _simulate(window, sinks, steps):
  """Per step p: {slot: text position} of a ring written as the module docstring says, with a
  deque of the window's positions evicting the oldest, and the kept positions in order."""
  sink, ring, slot_of, out = [], collections.deque(), {}, []
  for p in range(steps):
    if p < sinks:
      sink.append(p)
      slot_of[p] = p
    else:
      if len(ring) == window:
        freed = slot_of.pop(ring.popleft())
        slot_of[p] = freed
      else:
        slot_of[p] = sinks + len(ring)
      ring.append(p)
    out.append(({slot_of[j]: j for j in sink + list(ring)}, sink + list(ring)))
  return out


@pytest.mark.parametrize('window,sinks', [(5, 0), (5, 2), (1, 3), (4, 4), (7, 1)])
def test_slots_and_places_against_a_list_simulation(window, sinks):
  w = kv_cache.Window(window, sinks)
  pos_B = jnp.arange(3 * (window + sinks) + 2, dtype=jnp.int32)
  held = np.asarray(w.held_positions(pos_B))
  places = np.asarray(w.place(jnp.asarray(held), pos_B))
  slots = np.asarray(w.slot(pos_B))
  for p, (slot_to_pos, kept) in enumerate(_simulate(window, sinks, len(pos_B))):
    assert slots[p] == [s for s, j in slot_to_pos.items() if j == p][0]
    expected = np.full(window + sinks, -1)
    for s, j in slot_to_pos.items():
      expected[s] = j
    np.testing.assert_array_equal(held[p], expected, err_msg=f'step {p}')
    rank = {j: r for r, j in enumerate(kept)}        # StreamingLLM: positions by place
    for s, j in slot_to_pos.items():
      assert places[p, s] == rank[j], (p, s, j)
    assert int(w.place(jnp.array([[p]]), jnp.array([p]))[0, 0]) == rank[p]


def test_window_is_validated_and_clamped():
  for bad in (dict(window=0), dict(window=-3), dict(window=4, sinks=-1), dict(window=2.5)):
    with pytest.raises(ConfigError):
      kv_cache.Window(**bad)
  assert kv_cache.Window(100, 4).clamped(20) == kv_cache.Window(16, 4)
  assert kv_cache.Window(8, 4).clamped(20) == kv_cache.Window(8, 4)
  assert kv_cache.Window(3, 30).clamped(20) == kv_cache.Window(1, 19)


def _built(variant, num_layers=2, seed=0):
  cfg = ref.tiny_model_config(variant, num_layers=num_layers)
  m = model.Transformer(model_config(cfg), rngs=nnx.Rngs(seed))
  perturb(m, seed + 1)
  return m, cfg, ref.to_float64(nnx.to_pure_dict(nnx.state(m)))


@pytest.fixture(scope='module')
def g1():
  return _built('g1_headwise')


@pytest.fixture(scope='module')
def tokens(g1):
  return np.asarray(jax.random.randint(jax.random.key(5), (2, T), 0, g1[0].cfg.vocab_size))


@pytest.mark.parametrize('window,sinks', [(5, 2), (6, 0)])
def test_streaming_logits_against_numpy_streaming_llm(g1, tokens, window, sinks):
  m, cfg, params = g1
  gen = generate.Generator(m, max_len=T, chunk=8, window=kv_cache.Window(window, sinks))
  logits = np.asarray(gen.logits(tokens), np.float64)
  for b in range(tokens.shape[0]):
    want = ref.streaming_forward(params, tokens[b], cfg.to_dict(), window, sinks)
    np.testing.assert_allclose(logits[b], want, rtol=1e-4, atol=1e-4)
  full = np.asarray(generate.Generator(m, max_len=T, chunk=8).logits(tokens))
  first_eviction = window + sinks
  np.testing.assert_allclose(logits[:, :first_eviction], full[:, :first_eviction], atol=1e-5)
  assert np.abs(logits[:, first_eviction:] - full[:, first_eviction:]).max() > 1e-3


def test_one_layer_streams_what_a_fresh_pass_over_the_kept_tokens_gives():
  """With one layer a token's key and value depend on the token alone, so StreamingLLM's cache
  equals re-encoding the kept tokens (sinks, then the window) as a sequence of their own."""
  m, cfg, params = _built('g1_elementwise', num_layers=1)
  window, sinks = 4, 2
  toks = np.asarray(jax.random.randint(jax.random.key(9), (1, 14), 0, m.cfg.vocab_size))
  got = np.asarray(generate.Generator(m, max_len=14, chunk=14,
                                      window=kv_cache.Window(window, sinks)).logits(toks))[0]
  for p in range(14):
    kept = list(range(min(sinks, p + 1))) + list(range(max(sinks, p - window + 1), p + 1))
    want, _ = ref.forward(params, toks[:, kept], cfg.to_dict())
    np.testing.assert_allclose(got[p], want[0, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('variant', ['g1_headwise', pytest.param('baseline', marks=pytest.mark.slow)])
def test_a_window_covering_the_sequence_is_the_full_cache_bitwise(variant, g1, tokens):
  """Today's cache fed token by token (chunk=1) against the ring with W >= T (sinks or not):
  the same logits, token scores and generated tokens, bit for bit."""
  m = g1[0] if variant == 'g1_headwise' else _built(variant)[0]
  full = generate.Generator(m, max_len=T, chunk=1)
  for window in (kv_cache.Window(64, 3),) if variant == 'g1_headwise' else (
      kv_cache.Window(T, 0), kv_cache.Window(64, 3)):
    gen = generate.Generator(m, max_len=T, chunk=7, window=window)
    assert gen.cache_len == T
    np.testing.assert_array_equal(np.asarray(gen.logits(tokens)), np.asarray(full.logits(tokens)))
    for a, b in zip(gen.token_scores(tokens), full.token_scores(tokens)):
      np.testing.assert_array_equal(a, b)
    prompts = [[int(t) for t in tokens[0, :7]], [int(t) for t in tokens[1, :3]]]
    assert (gen.generate(prompts, max_new_tokens=8).tokens ==
            full.generate(prompts, max_new_tokens=8).tokens)


def test_ragged_prompts_stream_as_one_prompt_at_a_time(g1, tokens):
  """A prompt shorter than the batch's longest writes nothing while the longer one is fed, so
  its window holds its own tokens only."""
  gen = generate.Generator(g1[0], max_len=40, chunk=4, window=kv_cache.Window(4, 1))
  prompts = [[int(t) for t in tokens[0, :11]], [int(t) for t in tokens[1, :3]]]
  batch = gen.generate(prompts, max_new_tokens=10)
  for b, p in enumerate(prompts):
    alone = gen.generate([p], max_new_tokens=10)
    assert alone.tokens[0] == batch.tokens[b]


def test_memory_stays_flat_with_length(g1):
  """The ring's arrays have the same shapes and bytes whatever the length streamed or generated,
  and so does the compiled scoring step's memory."""
  m = g1[0]
  window = kv_cache.Window(6, 2)
  short = generate.Generator(m, max_len=50, chunk=8, window=window)
  long = generate.Generator(m, max_len=50_000, chunk=8, window=window)
  cfg = m.cfg
  slots = window.capacity
  for gen in (short, long):
    kv = gen.init_cache(2)
    assert {k: v.shape for k, v in kv.items()} == {
        'k': (cfg.num_layers, 2, slots, cfg.num_kv_heads, cfg.head_dim),
        'v': (cfg.num_layers, 2, slots, cfg.num_kv_heads, cfg.head_dim)}
  toks = jnp.zeros((2, 8), jnp.int32)
  kv = long.init_cache(2)
  nbytes = sum(x.nbytes for x in kv.values())
  for start in (0, 8, 4000, 40_000):          # far beyond any full cache this size could hold
    nll, _, kv = long._stream_scores(long.state, toks, toks, jnp.full((2,), start, jnp.int32), kv)
    assert sum(x.nbytes for x in kv.values()) == nbytes and np.isfinite(np.asarray(nll)).all()
  mem = [generate.Generator._stream_scores.lower(
      gen, gen.state, toks, toks, jnp.zeros((2,), jnp.int32),
      gen.init_cache(2)).compile().memory_analysis()
         for gen in (short, long)]
  if mem[0] is not None:
    assert mem[0].temp_size_in_bytes == mem[1].temp_size_in_bytes
  out = [long.generate([[1, 2, 3]], max_new_tokens=n) for n in (5, 60)]
  assert out[0].tokens[0] == out[1].tokens[0][:5]


def test_bad_uses_are_refused(g1):
  m = g1[0]
  gen = generate.Generator(m, max_len=20, window=kv_cache.Window(4, 1))
  with pytest.raises(generate.GenerateError, match='sliding window'):
    gen.generate([[1, 2]], max_new_tokens=2, use_cache=False)
  with pytest.raises(ValueError, match='one token per sequence'):
    m.decode(jnp.zeros((1, 2), jnp.int32), jnp.zeros((1,), jnp.int32), gen.init_cache(1),
             window=gen.window)
  g3 = ref.tiny_model_config('g3_elementwise')
  g3.gate.after_qk_norm_rope = True
  m3 = model.Transformer(model_config(g3), rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='before RoPE'):
    generate.Generator(m3, max_len=20, window=kv_cache.Window(4, 1)).logits(np.zeros((1, 3)))


def test_ring_view_tables_are_rope_at_the_places():
  rope = RoPE(8, 100.0)
  w = kv_cache.Window(3, 1)
  view = w.view(jnp.array([6]), jnp.array([True]), rope)
  # position 6 goes to ring slot 1 + (6 - 1) mod 3 = 3; the slots hold 0 | 4 5 6: places 0 | 1 2 3
  np.testing.assert_array_equal(np.asarray(view.valid_BxC), [[True] * 4])
  np.testing.assert_array_equal(np.asarray(view.slot_B), [3])
  want = rope.tables(jnp.array([[0, 1, 2, 3]]))
  for a, b in zip(view.key_tables, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(view.query_tables, rope.tables(jnp.array([[3]]))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
