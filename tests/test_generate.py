"""generate.py and the KV-cache path (model.decode): cached logits equal the full forward pass at
every position for every variant, dense and MoE; ragged batches; sampling; chunked scoring."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.inference import generate
from gated_attention.modes import sample
from gated_attention.model import transformer as model
from tests import reference as ref
from tests.jax_helpers import model_config, perturb
from tests.test_analysis import ROOT, make_tiny_run

B, T, PREFIX = 2, 8, 5
TOL = dict(rtol=2e-5, atol=2e-5)
MOE_SHAPES = dict(ref.TINY_MODEL, ffn_size=0)


def _moe_cfg(variant):
  m = ref.load_config(variant, 'moe_tiny').model
  m.update(MOE_SHAPES)
  m.moe.update(expert_ffn_size=16)
  return m


def _after_rope(position):
  m = ref.tiny_model_config(f'{position}_elementwise')
  m.gate.after_qk_norm_rope = True
  return m


def _hybrid(variant, moe=False):
  """A tiny hybrid (Gated DeltaNet / attention layers, partial RoPE, zero-centred norms): two
  periods of [DeltaNet, DeltaNet, attention], chunks of 4 tokens."""
  m = _moe_cfg(variant) if moe else ref.tiny_model_config(variant)
  m.update(num_layers=6, layer_types=['linear_attention', 'linear_attention',
                                      'full_attention'] * 2, rope_fraction=0.5,
           norm_zero_centered=True, scan_layers=True)
  m.deltanet.update(num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6,
                    chunk_size=4)
  if moe:
    m.moe.update(num_shared_experts=1, shared_expert_gate=True, renormalize=True)
  return m


CASES = {**{n: (lambda n=n: ref.tiny_model_config(n))
            for n in ref.variant_names() if n != 'baseline_more_experts'},
         'moe_baseline_more_experts': lambda: _moe_cfg('baseline_more_experts'),
         'moe_g1_headwise': lambda: _moe_cfg('g1_headwise'),
         'g3_after_qk_norm_rope': lambda: _after_rope('g3'),
         'g4_after_qk_norm_rope': lambda: _after_rope('g4'),
         'g1_yarn_no_qk_norm': lambda: ref.tiny_model_config(
             'g1_elementwise', qk_norm=False, rope_scaling=dict(type='yarn', factor=4.0,
                                                                original_max_len=8)),
         'hybrid_g1': lambda: _hybrid('g1_elementwise'),
         'hybrid_moe_baseline': lambda: _hybrid('baseline', moe=True)}
# By default: the gate at every kind of tensor (attention.py's hooks sdpa, v, q, k_rope, out:
# heads, KV heads, QK-norm and RoPE in between, the model dimension), MoE and YaRN without
# QK-norm; the baseline and the other variants (hooks k, q_rope, head sharing) are slow.
DEFAULT_CASES = ('g1_elementwise', 'g2_headwise', 'g4_elementwise', 'g3_after_qk_norm_rope',
                 'g5_elementwise', 'moe_g1_headwise', 'g1_yarn_no_qk_norm', 'hybrid_g1',
                 'hybrid_moe_baseline')


def _model(case, seed=0):
  m = model.Transformer(model_config(CASES[case]()), rngs=nnx.Rngs(seed))
  perturb(m, seed + 1)
  return m


@jax.jit
def _full_and_stepwise(state, graphdef, tokens_BxT):
  """The full forward pass, and the same logits from a prefill of PREFIX tokens followed by
  one-token decode steps through the cache."""
  m = nnx.merge(graphdef, state)
  full, _ = m(tokens_BxT)
  kv = generate.init_cache(m.cfg, B, T)
  first, kv = m.decode(tokens_BxT[:, :PREFIX], jnp.zeros((B,), jnp.int32), kv)

  steps = [first]
  for t in range(PREFIX, T):
    logits, kv = m.decode(tokens_BxT[:, t:t + 1], jnp.full((B,), t, jnp.int32), kv)
    steps.append(logits)
  return full, jnp.concatenate(steps, axis=1)


@pytest.mark.parametrize('case', [c if c in DEFAULT_CASES else
                                  pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_cached_decoding_equals_full_forward(case):
  m = _model(case)
  tokens = jax.random.randint(jax.random.key(3), (B, T), 0, m.cfg.vocab_size)
  graphdef, state = nnx.split(m)
  full, stepwise = _full_and_stepwise(state, graphdef, tokens)
  assert stepwise.shape == full.shape == (B, T, m.cfg.vocab_size)
  np.testing.assert_allclose(stepwise, full, **TOL)


@pytest.fixture(scope='module')
def gen():
  return generate.Generator(_model('g1_elementwise'), max_len=16, chunk=4)


def _full_logits(gen, tokens_BxT):
  return gen._full(gen.state, jnp.asarray(tokens_BxT))


def test_chunked_logits_equal_full_forward(gen):
  tokens = np.asarray(jax.random.randint(jax.random.key(4), (B, 11), 0, gen.cfg.vocab_size))
  np.testing.assert_allclose(gen.logits(tokens), _full_logits(gen, tokens), **TOL)


def test_token_nll_equals_cross_entropy_of_the_full_forward(gen):
  tokens = np.asarray(jax.random.randint(jax.random.key(6), (B, 15), 0, gen.cfg.vocab_size))
  logp = jax.nn.log_softmax(_full_logits(gen, tokens), axis=-1)
  want = -np.take_along_axis(np.asarray(logp)[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
  got = gen.token_nll(tokens)                        # 14 positions: chunks of 4, 4, 4, 2
  assert got.shape == (B, 14)
  np.testing.assert_allclose(got, want, **TOL)


def test_token_scores_equal_the_full_forward(gen):
  """token_scores through cached chunks: the loss equals token_nll and the full forward pass's
  cross-entropy, the prediction equals the full forward pass's argmax (numpy) at every position
  but where the logits' top two tie within float32 rounding (the same rule either way)."""
  tokens = np.asarray(jax.random.randint(jax.random.key(7), (B, 15), 0, gen.cfg.vocab_size))
  full = np.asarray(_full_logits(gen, tokens))[:, :-1]
  nll, pred = gen.token_scores(tokens)                # chunks of 4, 4, 4, 2
  assert pred.shape == nll.shape == (B, 14) and pred.dtype == np.int32
  np.testing.assert_array_equal(nll, gen.token_nll(tokens))
  logp = full - np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
      full.max(-1, keepdims=True)
  np.testing.assert_allclose(nll, -np.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0],
                             **TOL)
  top2 = np.sort(full, axis=-1)[..., -2:]
  clear = top2[..., 1] - top2[..., 0] > 1e-4
  assert clear.mean() > 0.9
  np.testing.assert_array_equal(pred[clear], full.argmax(-1)[clear])
  picked = np.take_along_axis(full, pred[..., None], -1)[..., 0]
  np.testing.assert_allclose(picked, full.max(-1), **TOL)   # ties: one of the largest


def _greedy_batch_equals_one_prompt_at_a_time_and_no_cache(gen, prompts):
  """7 greedy tokens of each prompt, batched ragged: the same as each prompt alone and as
  without the cache, and each the argmax of the full forward pass over what came before."""
  batch = gen.generate(prompts, max_new_tokens=7)
  assert [len(t) for t in batch.tokens] == [7] * len(prompts)
  for p, got in zip(prompts, batch.tokens):
    assert gen.generate([p], max_new_tokens=7).tokens[0] == got
  assert gen.generate(prompts, max_new_tokens=7, use_cache=False).tokens == batch.tokens
  seq = prompts[0] + batch.tokens[0]
  logits = _full_logits(gen, np.array([seq]))
  np.testing.assert_array_equal(np.argmax(logits[0, len(prompts[0]) - 1:-1], -1),
                                batch.tokens[0])
  return batch


def test_ragged_greedy_batch_equals_one_prompt_at_a_time_and_no_cache(gen):
  batch = _greedy_batch_equals_one_prompt_at_a_time_and_no_cache(
      gen, [[1, 5, 9, 2, 7, 3], [1, 4], [1, 8, 8, 8]])
  assert batch.finished == [False] * 3
  assert batch.new_tokens == 21 and batch.prompt_tokens == 12


@pytest.fixture(scope='module')
def hybrid_gen():
  return generate.Generator(_model('hybrid_g1'), max_len=16, chunk=4)


def test_hybrid_cache_holds_states_per_period_position(hybrid_gen):
  """The hybrid cache: per position of the period, stacked over the 2 periods; the DeltaNet
  entries do not grow with max_len."""
  kv = generate.init_cache(hybrid_gen.cfg, 3, 16)
  assert len(kv) == 3
  for i in (0, 1):
    assert kv[i]['state'].shape == (2, 3, 4, 8, 6) and kv[i]['state'].dtype == jnp.float32
    assert kv[i]['conv_q'].shape == (2, 3, 3, 2, 8) and kv[i]['conv_v'].shape == (2, 3, 3, 4, 6)
  assert kv[2]['k'].shape == (2, 3, 16, ref.TINY_MODEL['num_kv_heads'],
                              ref.TINY_MODEL['head_dim'])


def test_hybrid_ragged_greedy_batch_equals_one_prompt_at_a_time_and_no_cache(hybrid_gen):
  """A hybrid's cached greedy continuation (Gated DeltaNet conv / recurrent states and the
  attention layers' KV cache) equals the uncached forward's; prompts of different lengths share
  a batch, chunks of 4 tokens pad them (the padding must not enter the DeltaNet states)."""
  batch = _greedy_batch_equals_one_prompt_at_a_time_and_no_cache(
      hybrid_gen, [[1, 5, 9, 2, 7, 3], [1, 4], [1, 8, 8, 8, 3]])
  assert len(set(batch.tokens[0])) > 1                 # not a constant continuation


def test_hybrid_token_nll_equals_cross_entropy_of_the_full_forward(hybrid_gen):
  """The long-context evaluation's scoring through the hybrid cache (chunks of 4, 4, 4, 2)."""
  gen = hybrid_gen
  tokens = np.asarray(jax.random.randint(jax.random.key(6), (B, 15), 0, gen.cfg.vocab_size))
  logp = jax.nn.log_softmax(_full_logits(gen, tokens), axis=-1)
  want = -np.take_along_axis(np.asarray(logp)[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
  np.testing.assert_allclose(gen.token_nll(tokens), want, **TOL)
  np.testing.assert_allclose(gen.logits(tokens[:, :11]), _full_logits(gen, tokens[:, :11]),
                             **TOL)


def test_stops_at_eos_per_sequence(gen):
  prompts = [[1, 5, 9], [1, 4, 4, 6]]
  free = gen.generate(prompts, max_new_tokens=6).tokens
  eos = free[0][2]                                   # the third token sequence 0 produces
  out = gen.generate(prompts, max_new_tokens=6, eos_id=eos)
  for want, got, done in zip(free, out.tokens, out.finished):
    stop = want.index(eos) if eos in want else None
    assert got == want[:stop] and done == (stop is not None)
  assert out.finished[0]


def test_sampling_is_seeded_and_top_p_limits_the_choice(gen):
  prompts = [[1, 5, 9], [1, 2]]
  a = gen.generate(prompts, max_new_tokens=8, temperature=1.0, seed=5).tokens
  assert a == gen.generate(prompts, max_new_tokens=8, temperature=1.0, seed=5).tokens
  assert a != gen.generate(prompts, max_new_tokens=8, temperature=1.0, seed=6).tokens
  # a nucleus too small to hold two tokens is greedy
  assert (gen.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=5).tokens
          == gen.generate(prompts, max_new_tokens=8).tokens)


def test_sample_token_top_p_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 12)).astype(np.float32) * 2
  top_p = 0.6
  counts = np.zeros_like(logits)
  draws = jax.vmap(lambda k: generate.sample_token(jnp.asarray(logits), k, 0.7, top_p))(
      jax.random.split(jax.random.key(0), 4000))
  for b in range(3):
    counts[b] = np.bincount(np.asarray(draws[:, b]), minlength=12) / 4000
  for b in range(3):  # numpy: the nucleus of softmax(logits / 0.7), renormalised
    p = np.exp(logits[b] / 0.7 - (logits[b] / 0.7).max())
    p /= p.sum()
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    keep = order[before < top_p]
    want = np.zeros(12)
    want[keep] = p[keep] / p[keep].sum()
    np.testing.assert_allclose(counts[b], want, atol=0.03)
    assert counts[b][want == 0].sum() == 0


def test_bad_requests_are_refused_with_the_fix(gen):
  with pytest.raises(generate.GenerateError, match='max_len=16'):
    gen.generate([[1] * 10], max_new_tokens=7)
  with pytest.raises(generate.GenerateError, match='top_p'):
    gen.generate([[1]], max_new_tokens=2, top_p=0.0)
  with pytest.raises(generate.GenerateError, match='at least one token'):
    gen.generate([[1], []], max_new_tokens=2)


def test_sample_mode_on_a_trained_run(tmp_path_factory):
  """main.py --mode=sample on a 6-step run (shared with test_analysis / test_notebook); a
  structural override is refused (RoPE overrides: test_long_context)."""
  run_dir = make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=False)
  res = subprocess.run([sys.executable, 'main.py', '--mode=sample', f'--workdir={run_dir}',
                        '--prompt=Hello', '--prompt=ab', '--max_new_tokens=5'], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert "--- 'Hello' ->" in res.stdout and "--- 'ab' ->" in res.stdout
  assert 'g1_elementwise step 6:' in res.stdout
  with pytest.raises(ValueError, match='model.num_heads'):
    sample.sample(run_dir, ['Hello'], max_new_tokens=2, overrides={'model.num_heads': 8})
