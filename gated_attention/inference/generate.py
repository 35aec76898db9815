"""Text generation with a KV cache: prefill, then decode one token at a time.

    gen = Generator(model, max_len=512)
    out = gen.generate([[bos, 5, 9], [bos, 7]], max_new_tokens=64, temperature=0.8, top_p=0.95)
    out.tokens[0], out.finished[0]                  # generated ids; True if it stopped at EOS
    logits_BxTxV = gen.logits(tokens_BxT)           # chunked prefill: long inputs, [T, T] never held
    nll_BxT1, argmax_BxT1 = gen.token_scores(tokens_BxT)  # per-token loss and greedy guess, chunked

Prompts of different lengths are batched right-padded: every sequence keeps positions 0, 1, ...
(RoPE needs no offsets) and decodes at its own position; padding slots in the cache are masked
(or overwritten before they are read) by causality alone (attention.py). Prompts are prefilled in
chunks of `chunk` tokens, so attention holds at most [chunk, max_len] scores per head.

With a sliding window (`Generator(model, max_len=..., window=kv_cache.Window(W, S))`), the cache
is a ring of S + W slots (model/kv_cache.py: the first S tokens and the last W, RoPE positions
by place in the cache, as StreamingLLM), so its memory does not grow with the sequence: every
call feeds one token per sequence, prompts and scored sequences token by token through a
jit-compiled `lax.scan` of the decode step (`chunk` tokens a call), as StreamingLLM's
streaming perplexity does. A window at least as long as the sequences never evicts: it computes
what the full cache computes.

Sampling: greedy at temperature 0; otherwise softmax(logits / temperature) restricted to the
smallest set of tokens whose probability reaches `top_p` (nucleus sampling, Holtzman et al.
2020). A seed fixes the samples. Generation stops per sequence at `eos_id` (default: the
tokenizer's BOS, which separates documents in this codebase's packed training data) or after
`max_new_tokens`. MoE models route every token (dropless); with capacity dispatch the router
may drop a different set of tokens than in a full forward pass.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.errors import UserError
from gated_attention.model import kv_cache, transformer


class GenerateError(UserError, ValueError):
  """A generation request that cannot work (prompt too long, bad sampling setting)."""


def init_cache(cfg, batch: int, max_len: int) -> dict:
  """An empty KV cache {'k', 'v'}: [L, B, max_len, K, d] each, in the compute dtype. A hybrid's
  (config.model.layer_types): its attention layers' KV caches and its Gated DeltaNet layers'
  conv and recurrent states, per position of the layer period (transformer.hybrid_cache)."""
  if cfg.is_hybrid:
    return transformer.hybrid_cache(cfg, batch, max_len)
  shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
  return {'k': jnp.zeros(shape, cfg.compute_dtype), 'v': jnp.zeros(shape, cfg.compute_dtype)}


def sample_token(logits_BxV: jax.Array, key: jax.Array, temperature: float,
                 top_p: float) -> jax.Array:
  """One token per row: argmax at temperature 0, else a nucleus (top-p) sample."""
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits = logits_BxV.astype(jnp.float32) / temperature
  if top_p < 1.0:
    sorted_desc = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    # keep a token if the tokens more probable than it have not yet reached top_p
    kept = (jnp.cumsum(probs, axis=-1) - probs) < top_p
    threshold = jnp.min(jnp.where(kept, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits >= threshold, logits, -jnp.inf)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _nll(logits_BxCxV: jax.Array, targets_BxC: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits_BxCxV, axis=-1)
  return -jnp.take_along_axis(logp, targets_BxC[..., None], axis=-1)[..., 0]


@dataclasses.dataclass
class Output:
  """Per prompt: the generated ids (without the EOS), whether it stopped at EOS, and the
  prompts' and generated tokens' counts for speed reports."""
  tokens: list[list[int]]
  finished: list[bool]
  prompt_tokens: int
  new_tokens: int


class Generator:
  """Generation and chunked scoring for one model, compiled once per (batch, length) shape.
  `window`: a sliding-window cache (kv_cache.Window), or None for the full cache of max_len
  slots."""

  def __init__(self, model, *, max_len: int, chunk: int = 256,
               window: kv_cache.Window | None = None):
    self.cfg = model.cfg
    self.max_len = int(max_len)
    self.chunk = int(chunk)
    self.window = None if window is None else window.clamped(self.max_len)
    if self.window is not None and self.cfg.is_hybrid:
      raise GenerateError('A sliding-window cache is for attention-only models; a hybrid '
                          '(model.layer_types with linear_attention) keeps its Gated DeltaNet '
                          'state whole: leave the window out.')
    self.graphdef, self.state = nnx.split(model)

  @property
  def cache_len(self) -> int:
    """The KV cache's slots: max_len, or the window's sinks + window."""
    return self.max_len if self.window is None else self.window.capacity

  def init_cache(self, batch: int) -> dict:
    """An empty cache for `batch` sequences (init_cache of `cache_len` slots)."""
    return init_cache(self.cfg, batch, self.cache_len)

  @functools.partial(jax.jit, static_argnums=0)
  def _decode(self, state, tokens_BxT, start_B, kv, lengths_B=None, write_B=None):
    """`lengths_B`: the real tokens of each sequence in this call (a padded chunk's), or None:
    a hybrid's Gated DeltaNet layers pass the padding through (model.decode). With a window,
    one token per sequence, written where `write_B` (kv_cache.py)."""
    model = nnx.merge(self.graphdef, state)
    if self.window is None:
      return model.decode(tokens_BxT, start_B, kv, lengths_B)
    return model.decode(tokens_BxT, start_B, kv, window=self.window, write_B=write_B)

  def _stream(self, state, tokens_BxC, start_B, kv, write_BxC, emit, carry=()):
    """The sliding-window cache: the C tokens fed one at a time (a lax.scan of the decode
    step), token i at start_B + i where write_BxC[:, i]. `emit(i, logits_BxV, carry)` returns
    (carry, this step's outputs); the outputs are stacked on axis 1. Returns (outputs, carry,
    kv)."""
    def step(kv_carry, i):
      kv, carry = kv_carry
      logits, kv = self._decode(state, jax.lax.dynamic_slice_in_dim(tokens_BxC, i, 1, axis=1),
                                start_B + i, kv, write_B=write_BxC[:, i])
      carry, out = emit(i, logits[:, 0], carry)
      return (kv, carry), out
    (kv, carry), out = jax.lax.scan(step, (kv, carry), jnp.arange(tokens_BxC.shape[1]))
    return jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), out), carry, kv

  @functools.partial(jax.jit, static_argnums=0)
  def _stream_scores(self, state, tokens_BxC, targets_BxC, start_B, kv, lengths_B=None):
    del lengths_B   # the padding at the end of the last piece is written after every real token
    def emit(i, logits_BxV, carry):
      target_B = jax.lax.dynamic_index_in_dim(targets_BxC, i, axis=1, keepdims=False)
      return carry, (_nll(logits_BxV, target_B), jnp.argmax(logits_BxV, -1).astype(jnp.int32))
    write = jnp.ones(tokens_BxC.shape, bool)
    (nll, argmax), _, kv = self._stream(state, tokens_BxC, start_B, kv, write, emit)
    return nll, argmax, kv

  def _stream_nll(self, state, tokens_BxC, targets_BxC, start_B, kv, lengths_B=None):
    nll, _, kv = self._stream_scores(state, tokens_BxC, targets_BxC, start_B, kv)
    return nll, kv

  @functools.partial(jax.jit, static_argnums=0)
  def _stream_logits(self, state, tokens_BxC, start_B, kv):
    """Logits [B, C, V] of C more tokens of every sequence, fed through the ring."""
    write = jnp.ones(tokens_BxC.shape, bool)
    logits, _, kv = self._stream(state, tokens_BxC, start_B, kv, write,
                                 lambda i, logits, carry: (carry, logits))
    return logits, kv

  @functools.partial(jax.jit, static_argnums=0)
  def _stream_prompts(self, state, tokens_BxC, start_B, lens_B, last_BxV, kv):
    """Feeds the prompts' tokens (positions < lens_B; a shorter prompt's padding is not
    written) into the ring; returns the logits at each prompt's last token (`last_BxV` where
    that is not in this piece) and the cache."""
    positions_BxC = start_B[:, None] + jnp.arange(tokens_BxC.shape[1])
    write = positions_BxC < lens_B[:, None]

    def emit(i, logits_BxV, last_BxV):
      at_last_B = start_B + i == lens_B - 1
      return jnp.where(at_last_B[:, None], logits_BxV, last_BxV), ()
    _, last_BxV, kv = self._stream(state, tokens_BxC, start_B, kv, write, emit, last_BxV)
    return last_BxV, kv

  @functools.partial(jax.jit, static_argnums=(0, 6, 7, 8, 9))
  def _decode_loop(self, state, first_B, pos_B, kv, key, max_new, temperature, top_p, eos_id):
    """Decoding on the device: token i of every sequence (-1 once it stopped), and whether it
    stopped at `eos_id`. Step i samples with fold_in(key, i + 1) (the prefill's token used 0)."""
    B = first_B.shape[0]

    def body(carry):
      i, out_BxN, nxt_B, done_B, pos_B, kv = carry
      done_B = done_B | (nxt_B == eos_id)
      out_BxN = out_BxN.at[:, i].set(jnp.where(done_B, -1, nxt_B))
      logits, kv = self._decode(state, nxt_B[:, None], pos_B, kv)
      nxt_B = sample_token(logits[:, -1], jax.random.fold_in(key, i + 1), temperature, top_p)
      return i + 1, out_BxN, nxt_B, done_B, jnp.where(done_B, pos_B, pos_B + 1), kv

    carry = (0, jnp.full((B, max_new), -1, jnp.int32), first_B, jnp.zeros((B,), bool), pos_B, kv)
    _, out_BxN, _, done_B, _, _ = jax.lax.while_loop(
        lambda c: (c[0] < max_new) & ~jnp.all(c[3]), body, carry)
    return out_BxN, done_B

  @functools.partial(jax.jit, static_argnums=0)
  def _chunk_nll(self, state, tokens_BxC, targets_BxC, start_B, kv, lengths_B=None):
    logits, kv = self._decode(state, tokens_BxC, start_B, kv, lengths_B)
    return _nll(logits, targets_BxC), kv

  @functools.partial(jax.jit, static_argnums=0)
  def _chunk_scores(self, state, tokens_BxC, targets_BxC, start_B, kv, lengths_B=None):
    logits, kv = self._decode(state, tokens_BxC, start_B, kv, lengths_B)
    return _nll(logits, targets_BxC), jnp.argmax(logits, axis=-1).astype(jnp.int32), kv

  def _by_chunk(self, step, tokens_BxT) -> list[np.ndarray]:
    """`step`(state, inputs [B, C], targets [B, C], start [B], kv, lengths [B]) -> (*outputs
    [B, C], kv) run over whole sequences chunk by chunk through the cache; each output [B, T-1]
    (position t scores token t+1)."""
    tokens_BxT = np.asarray(tokens_BxT, np.int32)
    B, T = tokens_BxT.shape
    self._check_len(T - 1, 0)
    kv, out = self.init_cache(B), []
    for s in range(0, T - 1, self.chunk):
      n = min(self.chunk, T - 1 - s)
      width = self.chunk if self.window is not None else min(self.chunk, self.max_len - s)
      piece = np.zeros((B, 2, width), np.int32)
      piece[:, 0, :n], piece[:, 1, :n] = tokens_BxT[:, s:s + n], tokens_BxT[:, s + 1:s + 1 + n]
      *outputs, kv = step(self.state, jnp.asarray(piece[:, 0]), jnp.asarray(piece[:, 1]),
                          jnp.full((B,), s, jnp.int32), kv, jnp.full((B,), n, jnp.int32))
      out.append([np.asarray(o[:, :n]) for o in outputs])
    return [np.concatenate(parts, axis=1) for parts in zip(*out)]

  def token_nll(self, tokens_BxT) -> np.ndarray:
    """Per-token cross-entropy (nats) [B, T-1] of whole sequences: position t scores token t+1.
    Computed chunk by chunk through the cache, so no [T, T] attention or [T, V] logits of the
    whole sequence is ever held (long-context evaluation); with a window, token by token
    through the ring (streaming)."""
    step = self._chunk_nll if self.window is None else self._stream_nll
    return self._by_chunk(step, tokens_BxT)[0]

  def token_scores(self, tokens_BxT) -> tuple[np.ndarray, np.ndarray]:
    """token_nll's cross-entropy [B, T-1] and the model's greedy prediction int32 [B, T-1] (the
    argmax of the logits at position t, a guess of token t+1: teacher-forced exact match),
    chunked through the cache like token_nll."""
    step = self._chunk_scores if self.window is None else self._stream_scores
    nll, argmax = self._by_chunk(step, tokens_BxT)
    return nll, argmax

  @functools.partial(jax.jit, static_argnums=0)
  def _full(self, state, tokens_BxS):
    return nnx.merge(self.graphdef, state)(tokens_BxS)[0]

  def _prefill(self, tokens_BxP: np.ndarray, lens_B: np.ndarray | None = None):
    """Writes the prompts into a fresh cache chunk by chunk; returns (logits [B, P, V], kv).
    Every chunk has `chunk` tokens (one compiled shape; the tail is padded, and its padding is
    overwritten before it is read) except where the cache ends sooner. `lens_B`: each prompt's
    length (right-padded to P; default P): a hybrid's Gated DeltaNet state takes each prompt's
    own tokens only, so a sequence decodes on from its prompt's last token."""
    B, P = tokens_BxP.shape
    if self.window is not None:
      return self._prefill_stream(tokens_BxP)
    lens_B = np.full((B,), P, np.int32) if lens_B is None else np.asarray(lens_B, np.int32)
    kv = init_cache(self.cfg, B, self.max_len)
    out = []
    for s in range(0, P, self.chunk):
      piece = np.zeros((B, min(self.chunk, self.max_len - s)), np.int32)
      n = min(piece.shape[1], P - s)
      piece[:, :n] = tokens_BxP[:, s:s + n]
      real_B = np.clip(lens_B - s, 0, n).astype(np.int32)
      logits, kv = self._decode(self.state, jnp.asarray(piece), jnp.full((B,), s, jnp.int32), kv,
                                jnp.asarray(real_B))
      out.append(logits[:, :n])
    return jnp.concatenate(out, axis=1), kv

  def _prefill_stream(self, tokens_BxP: np.ndarray):
    """_prefill through the sliding window: the prompts token by token, `chunk` a call."""
    B, P = tokens_BxP.shape
    kv, out = self.init_cache(B), []
    for s in range(0, P, self.chunk):
      piece = np.zeros((B, self.chunk), np.int32)
      n = min(self.chunk, P - s)
      piece[:, :n] = tokens_BxP[:, s:s + n]
      logits, kv = self._stream_logits(self.state, jnp.asarray(piece),
                                       jnp.full((B,), s, jnp.int32), kv)
      out.append(logits[:, :n])
    return jnp.concatenate(out, axis=1), kv

  def _prompts(self, tokens_BxP: np.ndarray, lens_B: np.ndarray):
    """(logits [B, V] at each prompt's last token, the cache holding the prompts): right-padded
    prompts of lengths `lens_B`."""
    B, P = tokens_BxP.shape
    if self.window is None:
      logits, kv = self._prefill(tokens_BxP, lens_B)
      return logits[np.arange(B), lens_B - 1], kv
    kv, last = self.init_cache(B), jnp.zeros((B, self.cfg.vocab_size), jnp.float32)
    for s in range(0, P, self.chunk):
      piece = np.zeros((B, self.chunk), np.int32)
      n = min(self.chunk, P - s)
      piece[:, :n] = tokens_BxP[:, s:s + n]
      last, kv = self._stream_prompts(self.state, jnp.asarray(piece),
                                      jnp.full((B,), s, jnp.int32), jnp.asarray(lens_B), last, kv)
    return last, kv

  def logits(self, tokens_BxT) -> jax.Array:
    """float32 logits [B, T, V] of whole sequences, computed in cached chunks (for inputs too
    long for one [T, T] attention per head; equal to the model's forward pass)."""
    tokens_BxT = np.asarray(tokens_BxT, np.int32)
    self._check_len(tokens_BxT.shape[1], 0)
    return self._prefill(tokens_BxT)[0]

  def _check_len(self, prompt_len: int, new: int):
    if prompt_len + new > self.max_len:
      raise GenerateError(
          f'A prompt of {prompt_len} tokens plus {new} new tokens exceeds the cache length '
          f'max_len={self.max_len}: shorten the prompt, lower the number of new tokens or raise '
          'max_len (positions beyond the training length need the context-extension settings: '
          'config.model.rope_base / rope_scaling).')

  def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
               top_p: float = 1.0, eos_id: int | None = None, seed: int = 0,
               use_cache: bool = True) -> Output:
    """Continues each prompt (a non-empty list of token ids). `use_cache=False` recomputes the
    whole sequence for every new token (the reference the cache is measured against)."""
    if not use_cache and self.window is not None:
      raise GenerateError('use_cache=False recomputes the whole sequence at every step: it has no '
                          'sliding window; use the cache.')
    if temperature < 0 or not 0 < top_p <= 1:
      raise GenerateError(f'temperature={temperature} must be >= 0 and top_p={top_p} in (0, 1].')
    if not prompts or any(len(p) == 0 for p in prompts):
      raise GenerateError('Every prompt needs at least one token (start it with the BOS token).')
    lens = np.array([len(p) for p in prompts], np.int32)
    self._check_len(int(lens.max()), max_new_tokens)
    B, P = len(prompts), int(lens.max())
    tokens = np.zeros((B, self.max_len), np.int32)
    for b, p in enumerate(prompts):
      tokens[b, :len(p)] = p
    key = jax.random.key(seed)
    eos = -1 if eos_id is None else int(eos_id)
    if use_cache:
      last_logits, kv = self._prompts(tokens[:, :P], lens)
      first = sample_token(last_logits, jax.random.fold_in(key, 0), temperature, top_p)
      out_BxN, done = jax.device_get(self._decode_loop(
          self.state, first, jnp.asarray(lens), kv, key, max_new_tokens, temperature, top_p, eos))
      out = [[int(t) for t in row[row >= 0]] for row in out_BxN]
    else:
      out, done = self._generate_without_cache(tokens, lens, key, max_new_tokens, temperature,
                                               top_p, eos)
    return Output(tokens=out, finished=[bool(d) for d in done], prompt_tokens=int(lens.sum()),
                  new_tokens=sum(len(o) for o in out))

  def _generate_without_cache(self, tokens_BxS, lens_B, key, max_new, temperature, top_p, eos):
    """The reference: every step runs the model over the whole sequence (fixed length S)."""
    B = len(lens_B)
    pos, done, out = lens_B.copy(), np.zeros(B, bool), [[] for _ in range(B)]
    for i in range(max_new):
      logits = self._full(self.state, jnp.asarray(tokens_BxS))
      nxt = np.asarray(sample_token(logits[np.arange(B), pos - 1], jax.random.fold_in(key, i),
                                    temperature, top_p))
      for b in np.flatnonzero(~done):
        if nxt[b] == eos:
          done[b] = True
        else:
          out[b].append(int(nxt[b]))
          tokens_BxS[b, pos[b]] = nxt[b]
          pos[b] += 1
      if done.all():
        break
    return out, done
