"""model.py: the whole decoder for every variant against the numpy float64 reference, causality,
inspect statistics, and parameter counts against closed-form formulas from the paper's shapes."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import scales
from gated_attention.model import transformer as model
from tests import reference as ref
from gated_attention.model import config as config_lib
from tests.jax_helpers import model_config, perturb

B, T = 2, 8
TOL = dict(rtol=1e-4, atol=1e-4)
DENSE_VARIANTS = [n for n in ref.variant_names() if n != 'baseline_more_experts']
HYBRID = dict(num_layers=4, layer_types=['linear_attention', 'full_attention'] * 2,
              rope_fraction=0.5, norm_zero_centered=True,
              deltanet=dict(num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6,
                            chunk_size=4))
# Model-level cases that no config file covers: (variant, overrides of the tiny model config).
EXTRA_CASES = {
    'untied': ('baseline', dict(tie_embeddings=False)),
    'g1_untied_sandwich': ('g1_elementwise', dict(tie_embeddings=False, sandwich_norm=True)),
    'g4_no_qk_norm_yarn': ('g4_elementwise', dict(qk_norm=False, rope_scaling=dict(
        type='yarn', factor=4.0, original_max_len=4096))),
    # The tiny config unrolls the layer loop (scan_layers=False); the paper's scales scan.
    'g1_scanned_layers': ('g1_elementwise', dict(scan_layers=True)),
    # Hybrids (Qwen3-Next / Qwen3.5): Gated DeltaNet and attention layers, partial RoPE,
    # zero-centred RMSNorm; two periods of [DeltaNet, attention], scanned and unrolled.
    'hybrid_g1': ('g1_elementwise', dict(HYBRID, scan_layers=True)),
    'hybrid_baseline_unrolled_sandwich': ('baseline', dict(HYBRID, sandwich_norm=True)),
}
CASES = {**{n: (n, {}) for n in DENSE_VARIANTS}, **EXTRA_CASES}




def _case_config(case):
  variant, over = CASES[case]
  over = dict(over)
  scaling = over.pop('rope_scaling', None)
  deltanet = over.pop('deltanet', None)
  cfg = ref.tiny_model_config(variant, **over)
  if scaling:
    cfg.rope_scaling.update(scaling)
  if deltanet:
    cfg.deltanet.update(deltanet)
  return cfg


class Built:
  """A perturbed tiny model, its compiled forward, and its parameters as float64 numpy."""

  def __init__(self, case, seed=0):
    self.cfg = _case_config(case)
    self.model = model.Transformer(model_config(self.cfg), rngs=nnx.Rngs(seed))
    perturb(self.model, seed + 1)
    graphdef, self.state = nnx.split(self.model)
    self._fwd = jax.jit(lambda state, toks: nnx.merge(graphdef, state)(toks)[0])
    self._fwd_inspect = jax.jit(lambda state, toks: model.inspect(nnx.merge(graphdef, state), toks))
    self.params = ref.to_float64(nnx.to_pure_dict(nnx.state(self.model)))
    self.tokens = jax.random.randint(jax.random.key(seed + 2), (B, T), 0, self.cfg.vocab_size)

  def __call__(self, tokens):
    return self._fwd(self.state, tokens)

  def inspect(self, tokens):
    return self._fwd_inspect(self.state, tokens)

  def reference(self, tokens):
    return ref.forward(self.params, np.asarray(tokens), self.cfg.to_dict())


@pytest.fixture(scope='module')
def built():
  cache = {}

  def get(case):
    if case not in cache:
      cache[case] = Built(case)
    return cache[case]

  return get


# --------------------------------------------------------------------------------------------
# Forward against the reference
# --------------------------------------------------------------------------------------------

def test_param_tree_is_what_the_reference_reads(built):
  m = built('g1_elementwise')
  L, D, H, K, d = 2, 32, 4, 2, 8
  shapes = jax.tree_util.tree_map(np.shape, m.params)
  assert shapes['blocks']['attn']['wq'] == (L, D, H, d)
  assert shapes['blocks']['attn']['wk'] == (L, D, K, d)
  assert shapes['blocks']['attn']['wo'] == (L, H, d, D)
  assert shapes['blocks']['attn']['gate']['kernel'] == (L, D, H, d)
  assert shapes['embed']['embedding'] == (61, D)
  # every parameter is away from its init value (zeros and ones are perturbed)
  for leaf in jax.tree_util.tree_leaves(m.params):
    assert np.all(leaf != 0.0) and np.all(leaf != 1.0)


@pytest.mark.parametrize('case', list(CASES))
def test_forward_matches_reference(built, case):
  m = built(case)
  logits = m(m.tokens)
  assert logits.shape == (B, T, m.cfg.vocab_size) and logits.dtype == jnp.float32
  want, _ = m.reference(m.tokens)
  assert np.abs(want).max() > 0.3                             # not a degenerate comparison
  np.testing.assert_allclose(logits, want, **TOL)


def test_gates_change_the_model(built):
  """Sanity: the gated logits differ from what the same weights give without the gate."""
  m = built('g1_elementwise')
  cfg = m.cfg.to_dict()
  cfg['gate'] = dict(position='none')
  ungated, _ = ref.forward(m.params, np.asarray(m.tokens), cfg)
  assert not np.allclose(m(m.tokens), ungated, atol=1e-2)


def test_bfloat16_compute_is_close_to_float32_reference(built):
  """The paper's scales compute in bfloat16 (parameters stay float32, logits come out float32)."""
  m = built('g1_headwise')
  cfg = _case_config('g1_headwise')
  cfg.dtype = 'bfloat16'
  m16 = model.Transformer(model_config(cfg), rngs=nnx.Rngs(0))
  nnx.update(m16, nnx.state(m.model, nnx.Param))
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(nnx.state(m16, nnx.Param)))
  graphdef, state = nnx.split(m16)
  logits = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t)[0])(state, m.tokens)
  assert logits.dtype == jnp.float32
  want, _ = m.reference(m.tokens)
  np.testing.assert_allclose(logits, want, rtol=0.1, atol=0.1)


# --------------------------------------------------------------------------------------------
# Causality
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case', list(CASES))
def test_changing_a_token_never_changes_earlier_logits(built, case):
  m = built(case)
  base = np.asarray(m(m.tokens))
  V = m.cfg.vocab_size
  for t in (1, 4, T - 1):
    tokens = m.tokens.at[:, t].set((m.tokens[:, t] + 1 + jnp.arange(B)) % V)
    changed = np.asarray(m(tokens))
    np.testing.assert_allclose(changed[:, :t], base[:, :t], rtol=0, atol=1e-6)
    assert np.abs(changed[:, t] - base[:, t]).max() > 1e-4     # the changed position did change


def test_document_mask_makes_each_document_its_own_sequence(built):
  """With document masking, a document's logits in a packed window equal those of the document
  alone at positions 0.. (RoPE sees distances only), and the unmasked window differs."""
  m = built('g1_elementwise')
  bos = m.cfg.vocab_size - 1
  doc_a, doc_b = [bos, 5, 6, 7, 8], [bos, 9, 10, 11, 12]
  window = jnp.asarray([[1, 2, 3] + doc_a + doc_b], jnp.int32)                  # 3 documents
  graphdef = nnx.graphdef(m.model)
  fwd = jax.jit(lambda st, t, bos: nnx.merge(graphdef, st)(
      t, segment_ids_BxT=None if bos is None else model.document_ids(t, bos))[0],
      static_argnums=2)
  masked, plain = fwd(m.state, window, bos), fwd(m.state, window, None)
  alone_a = fwd(m.state, jnp.asarray([doc_a]), None)
  alone_b = fwd(m.state, jnp.asarray([doc_b]), None)
  np.testing.assert_allclose(masked[0, 3:8], alone_a[0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(masked[0, 8:], alone_b[0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(masked[0, :3], plain[0, :3], rtol=1e-5, atol=1e-6)  # first document
  assert np.abs(plain[0, 8:] - alone_b[0]).max() > 1e-3


def test_hybrid_document_mask_makes_each_document_its_own_sequence(built):
  """The same for a hybrid: its Gated DeltaNet layers restart their state (and conv) at each
  document, so a document's logits in the window are those of the document alone."""
  m = built('hybrid_g1')
  bos = m.cfg.vocab_size - 1
  doc_a, doc_b = [bos, 5, 6, 7, 8], [bos, 9, 10, 11, 12, 13]
  window = jnp.asarray([[1, 2] + doc_a + doc_b], jnp.int32)
  graphdef = nnx.graphdef(m.model)
  fwd = jax.jit(lambda st, t, bos: nnx.merge(graphdef, st)(
      t, segment_ids_BxT=None if bos is None else model.document_ids(t, bos))[0],
      static_argnums=2)
  masked, plain = fwd(m.state, window, bos), fwd(m.state, window, None)
  np.testing.assert_allclose(masked[0, 2:7], fwd(m.state, jnp.asarray([doc_a]), None)[0],
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(masked[0, 7:], fwd(m.state, jnp.asarray([doc_b]), None)[0],
                             rtol=1e-4, atol=1e-4)
  assert np.abs(plain[0, 7:] - masked[0, 7:]).max() > 1e-3


def test_hybrid_param_tree_is_stacked_by_period(built):
  """Layer l of a hybrid is blocks.layer_<l % P> at index l // P (P = 2 here)."""
  m = built('hybrid_g1')
  shapes = jax.tree_util.tree_map(np.shape, m.params)['blocks']
  assert set(shapes) == {'layer_0', 'layer_1'}
  assert 'attn' not in shapes['layer_0'] and 'linear_attn' not in shapes['layer_1']
  assert shapes['layer_0']['linear_attn']['wq'] == (2, 32, 2, 8)
  assert shapes['layer_0']['linear_attn']['wv'] == (2, 32, 4, 6)
  assert shapes['layer_0']['linear_attn']['conv_v'] == (2, 4, 4, 6)
  assert shapes['layer_1']['attn']['gate']['kernel'] == (2, 32, 4, 8)
  report = model.param_report(model_config(m.cfg))
  assert report['total'] == sum(int(np.prod(s)) for s in jax.tree_util.tree_leaves(
      jax.tree_util.tree_map(np.shape, m.params), is_leaf=lambda x: isinstance(x, tuple)))


# --------------------------------------------------------------------------------------------
# Inspect statistics at the model level
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case', ['baseline', 'g1_elementwise', 'g2_headshared',
                                  'g1_input_independent'])
def test_inspect_forward(built, case):
  m = built(case)
  logits, aux = m.inspect(m.tokens)
  want, layers = m.reference(m.tokens)
  np.testing.assert_allclose(logits, want, **TOL)              # the explicit attention path
  np.testing.assert_allclose(logits, m(m.tokens), rtol=1e-5, atol=1e-5)
  L, H = m.cfg.num_layers, m.cfg.num_heads
  f_attn = np.stack([ref.f_attn_per_head(x['probs']) for x in layers])
  assert aux['f_attn_H'].shape == (L, H)
  np.testing.assert_allclose(aux['f_attn_H'], f_attn, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(aux['attn_map'], np.stack([x['probs'][0].mean(0) for x in layers]),
                             rtol=1e-4, atol=1e-5)
  for site in ('attn_out', 'attn_residual', 'ffn_out', 'ffn_residual'):
    got = aux['m_act'][site]
    maxes = np.stack([np.abs(x[site]).max() for x in layers])
    np.testing.assert_allclose(got['max'], maxes, rtol=1e-4)
    np.testing.assert_allclose(got['median'], [np.median(np.abs(x[site])) for x in layers],
                               rtol=1e-4)
    assert got['where'].shape == (L, 3)
    for i, x in enumerate(layers):                            # 'where' points at the max
      b, t, c = np.asarray(got['where'][i])
      np.testing.assert_allclose(abs(x[site][b, t, c]), maxes[i], rtol=1e-4)
  if 'gate_scores' in layers[0]:
    np.testing.assert_allclose(aux['gate']['mean'],
                               [x['gate_scores'].mean() for x in layers], rtol=1e-4)
    assert aux['gate']['hist'].shape == (L, 20)
  else:
    assert 'gate' not in aux


# --------------------------------------------------------------------------------------------
# Parameter counts
# --------------------------------------------------------------------------------------------

# The paper's shapes (V, L, D, H, K, d, F) and the repo's tiny scale.
SCALE_SHAPES = {
    'tiny': dict(V=384, L=4, D=128, H=4, K=2, d=32, F=384),
    'dense_1p7b_28l': dict(V=151_936, L=28, D=2048, H=16, K=8, d=128, F=6144),
    'dense_1p7b_48l': dict(V=151_936, L=48, D=1536, H=16, K=8, d=128, F=4608),
}
MOE_SCALE_SHAPES = {
    'moe_tiny': dict(V=384, L=4, D=128, H=4, K=2, d=32, E=8, top_k=2, Fe=96),
    'moe_15a2b': dict(V=151_936, L=24, D=2048, H=32, K=4, d=128, E=128, top_k=8, Fe=768),
}
# Gate parameters per layer, from the paper's definitions.
GATE_PARAMS = {
    'g1_elementwise': lambda D, H, K, d: D * H * d,
    'g1_elementwise_silu': lambda D, H, K, d: D * H * d,
    'g1_additive_silu': lambda D, H, K, d: D * H * d,
    'g1_additive_identity': lambda D, H, K, d: D * H * d,
    'g1_ns_sigmoid': lambda D, H, K, d: D * H * d,
    'g1_headshared': lambda D, H, K, d: D * H * d,
    'g1_headwise': lambda D, H, K, d: D * H,
    'g1_input_independent': lambda D, H, K, d: H * d,
    'g1_rmsnorm': lambda D, H, K, d: H * d,
    'g1_silu_noparam': lambda D, H, K, d: 0,
    'g2_elementwise': lambda D, H, K, d: D * K * d,
    'g2_headshared': lambda D, H, K, d: D * K * d,
    'g2_headwise': lambda D, H, K, d: D * K,
    'g3_elementwise': lambda D, H, K, d: D * K * d,
    'g4_elementwise': lambda D, H, K, d: D * H * d,
    'g5_elementwise': lambda D, H, K, d: D * D,
}


def variant_shapes(variant, s):
  s = dict(s)
  if variant == 'baseline_more_kv_heads':
    s['K'] *= 2
  if variant == 'baseline_more_q_heads':
    s['H'] = s['H'] * 3 // 2
  return s


def expected_dense_total(variant, s):
  V, L, D, H, K, d, F = (s[k] for k in 'V L D H K d F'.split())
  tied = True
  per_layer = (D * H * d + 2 * D * K * d + H * d * D      # W_Q, W_K, W_V, W_O
               + 2 * d                                     # QK-norm scales
               + 2 * D                                     # the two pre-norms
               + 3 * D * F)                                # SwiGLU
  if variant == 'baseline_sandwich_norm':
    per_layer += 2 * D
  per_layer += GATE_PARAMS.get(variant, lambda *a: 0)(D, H, K, d)
  return V * D + (0 if tied else D * V) + L * per_layer + D


def test_gate_formula_table_covers_every_gated_variant():
  assert sorted(GATE_PARAMS) == ref.gated_variant_names()


@pytest.mark.parametrize('scale', list(SCALE_SHAPES))
@pytest.mark.parametrize('variant', DENSE_VARIANTS)
def test_dense_param_count(variant, scale):
  cfg = ref.load_config(variant, scale).model
  s = variant_shapes(variant, SCALE_SHAPES[scale])
  report = model.param_report(model_config(cfg))
  want = expected_dense_total(variant, s)
  print(f'{variant:24s} {scale:16s} total={report["total"]:,} formula={want:,}')
  assert report['total'] == want
  assert report['active'] == report['total']
  assert report['embedding'] == s['V'] * s['D']
  assert report['non_embedding'] == want - s['V'] * s['D']
  assert sum(report['by_module'].values()) == report['total']


def test_1p7b_28l_baseline_is_1p7b():
  totals = {scale: model.param_report(model_config(ref.load_config('baseline', scale).model))['total']
            for scale in ('dense_1p7b_28l', 'dense_1p7b_48l')}
  print({k: f'{v / 1e9:.4f}B' for k, v in totals.items()})
  assert 1.6e9 <= totals['dense_1p7b_28l'] <= 1.8e9
  assert 1.6e9 <= totals['dense_1p7b_48l'] <= 1.9e9
  gated = model.param_report(model_config(ref.load_config('g1_elementwise', 'dense_1p7b_28l').model))['total']
  print(f'g1_elementwise dense_1p7b_28l: {gated / 1e9:.4f}B '
        f'(+{(gated - totals["dense_1p7b_28l"]) / 1e6:.1f}M = 28 * 2048 * 16 * 128)')
  assert gated - totals['dense_1p7b_28l'] == 28 * 2048 * 16 * 128


@pytest.mark.parametrize('scale', list(MOE_SCALE_SHAPES))
@pytest.mark.parametrize('variant', ['baseline', 'baseline_more_experts', 'baseline_more_kv_heads',
                                     'g1_elementwise', 'g1_headwise', 'g2_elementwise'])
def test_moe_param_count(variant, scale):
  cfg = ref.load_config(variant, scale).model
  s = variant_shapes(variant, MOE_SCALE_SHAPES[scale])
  V, L, D, H, K, d, E, k, Fe = (s[x] for x in 'V L D H K d E top_k Fe'.split())
  if variant == 'baseline_more_experts':
    E, k = E + 4, k + 4
  experts = 3 * E * D * Fe
  per_layer = (D * H * d + 2 * D * K * d + H * d * D + 2 * d + 2 * D
               + D * E + experts                            # router + routed experts
               + GATE_PARAMS.get(variant, lambda *a: 0)(D, H, K, d))
  want = 2 * V * D + L * per_layer + D                      # untied embeddings
  report = model.param_report(model_config(cfg))
  print(f'{variant:24s} {scale:10s} total={report["total"]:,} active={report["active"]:,}')
  assert report['total'] == want
  assert report['active'] == want - L * experts * (E - k) // E


@pytest.mark.parametrize('variant', ['g1_elementwise', 'g1_headwise', 'g5_elementwise'])
def test_ffn_match_baseline_keeps_the_baseline_parameter_count(variant):
  import importlib  # pylint: disable=g-import-not-at-top
  model_lib = model
  base_total = model_lib.param_report(model_config(
      importlib.import_module('configs.baseline').get_config('dense_1p7b_28l').model))['total']
  c = importlib.import_module(f'configs.{variant}').get_config('dense_1p7b_28l')
  unmatched = model_lib.param_report(model_config(c.model))['total']
  c.model.ffn_match_baseline = True
  matched = model_lib.param_report(model_config(c.model))['total']
  D, L = c.model.hidden_size, c.model.num_layers
  assert unmatched > base_total
  assert abs(matched - base_total) <= 1.5 * D * L, (matched, base_total)
  assert config_lib.dense_ffn_size(c.model) < c.model.ffn_size


@pytest.mark.parametrize('shape', [(16, 128, 128), (3, 7, 5), (1,), (2,)])
def test_median_by_selection_is_jnp_median_bit_for_bit(shape):
  """transformer.median (M-Act's median |h|, by bisection over the float bit patterns) equals
  jnp.median bit for bit on random values of either sign and magnitude, with ties and an odd or
  even count, is NaN where jnp.median is, and agrees with numpy's float64 median."""
  from gated_attention.model import transformer  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(sum(shape))
  ours, theirs = jax.jit(transformer.median), jax.jit(jnp.median)
  for scale in (1e-3, 1.0, 1e4):
    x = (rng.normal(size=shape) * scale).astype(np.float32)
    for case in (x, np.abs(x), -np.abs(x) - 1e-6, np.round(np.abs(x) * 2 / scale) / 2):
      a, b = np.asarray(ours(case)), np.asarray(theirs(case))
      assert a.tobytes() == b.tobytes(), (case.shape, a, b)
      np.testing.assert_allclose(a, np.median(case.astype(np.float64)), rtol=1e-6)
  x = np.abs(rng.normal(size=shape)).astype(np.float32)
  x.reshape(-1)[-1] = np.nan
  assert np.isnan(ours(x)) and np.isnan(theirs(x))


# --------------------------------------------------------------------------------------------
# The published hybrids: parameter counts equal transformers'
# --------------------------------------------------------------------------------------------

def _transformers_hybrid(scale):
  """The transformers model of a published hybrid scale, on the meta device (no memory)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  if scale == 'qwen3_next_80b_a3b':     # Qwen3NextConfig's defaults are Qwen3-Next-80B-A3B's
    cls, config = transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig()
  elif scale == 'qwen3_5_35b_a3b':      # Qwen3_5MoeTextConfig's are Qwen3.5-35B-A3B's
    cls, config = transformers.Qwen3_5MoeForCausalLM, transformers.Qwen3_5MoeTextConfig()
  else:                                 # Qwen3.5-27B's text_config (its config.json)
    cls = transformers.Qwen3_5ForCausalLM
    config = transformers.Qwen3_5TextConfig(
        vocab_size=248_320, hidden_size=5120, intermediate_size=17_408, num_hidden_layers=64,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        tie_word_embeddings=False)
  with torch.device('meta'):
    return cls(config), config


@pytest.mark.parametrize('scale', ['qwen3_next_80b_a3b', 'qwen3_5_27b', 'qwen3_5_35b_a3b'])
def test_published_hybrid_param_counts_equal_transformers(scale):
  """--mode=params of configs/g1_elementwise.py:<scale> (the published model: its attention
  layers carry the G1 elementwise gate) against transformers' model of the same config, built
  on the meta device: the same total, and the same active count (the routed experts' (E - k) / E
  share left out)."""
  hf, config = _transformers_hybrid(scale)
  total = sum(p.numel() for p in hf.parameters())
  experts = sum(p.numel() for n, p in hf.named_parameters() if '.mlp.experts.' in n)
  E = getattr(config, 'num_experts', 0) or 1
  active = total - experts * (E - getattr(config, 'num_experts_per_tok', 1)) // E
  report = model.param_report(model_config(ref.load_config('g1_elementwise', scale).model))
  print(f'{scale}: total {report["total"]:,} (transformers {total:,}), active '
        f'{report["active"]:,} (transformers {active:,})')
  assert report['total'] == total and report['active'] == active
  assert config.layer_types == list(scales.model_config(scale).layer_types)
