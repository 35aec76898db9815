"""Hugging Face interop (gated_attention/runs/hf): golden fixtures, exact round trips, refusals.

The fixtures (tests/fixtures/hf/, made by make_fixtures.py) are small random-weight Qwen3 models
written by `transformers` itself, stock for the baseline and the authors' modeling_qwen3.py for
the G1 gates, with their float32 logits and F-Attn: the independent reference. Stock Qwen3 is
also checked live against the installed `transformers` (skipped without torch/transformers).
Negative controls: a q_proj packed per query head, or k_proj and v_proj swapped, fails the
fixtures' logit comparison.
"""

import functools
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import scales
from gated_attention.runs.hf import HFExportError, HFFormatError, load_hf, save_hf
from gated_attention.runs.hf import safetensors_io
from tests.reference import TINY_MODEL

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures', 'hf')
CASES = ('baseline_tied', 'baseline_untied', 'headwise_untied', 'elementwise_tied')


# --------------------------------------------------------------------------------------------
# Running our model: the one place that builds a Transformer from a run config.
# --------------------------------------------------------------------------------------------

def _graphdef_and_state(config):
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_config(config.model)
  return nnx.split(nnx.eval_shape(lambda: model_lib.Transformer(cfg, rngs=nnx.Rngs(0))))


def _our_logits(config, params, tokens_BxT):
  """(float32 logits [B, T, V], F-Attn per layer and head [L, H]) of our model with `params`,
  from the analysis (inspect) path."""
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  graphdef, state = _graphdef_and_state(config)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))

  @jax.jit
  def forward(state, tokens_BxT):
    logits, stats = model_lib.inspect(nnx.merge(graphdef, state), tokens_BxT)
    return logits, stats['f_attn_H']

  logits, f_attn = forward(state, jnp.asarray(tokens_BxT))
  return np.asarray(logits), np.asarray(f_attn)


def _param_shapes(config) -> dict:
  """{dotted path: shape} of the model's parameters (from the model itself, not from hf/)."""
  _, state = _graphdef_and_state(config)
  return _flat(nnx.to_pure_dict(state), shape=True)


def _flat(tree, prefix='', shape=False) -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}.', shape))
    else:
      out[f'{prefix}{k}'] = tuple(v.shape) if shape else v
  return out


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

def _tiny_config(gate='none', tied=True, yarn=False):
  c = scales.get_config('tiny')
  c.model.update({k: v for k, v in TINY_MODEL.items()})
  c.model.tie_embeddings = tied
  if gate != 'none':
    c.model.gate.update(position='g1', granularity=gate)
    c.variant = f'g1_{gate}'
  if yarn:
    c.model.rope_scaling.update(type='yarn', factor=2.0, original_max_len=8)
  return c


def _random_params(config, seed=0) -> dict:
  rng = np.random.default_rng(seed)
  out = {}
  for path, shape in _param_shapes(config).items():
    scale = 1.0 if path.endswith('scale') else 0.3
    val = (1.0 if path.endswith('scale') else 0.0) + scale * rng.standard_normal(shape)
    parent = out
    for k in path.split('.')[:-1]:
      parent = parent.setdefault(k, {})
    parent[path.split('.')[-1]] = val.astype(np.float32)
  return out


def _raw_tensors(model_dir) -> dict:
  """{name: (dtype name, shape, raw bytes)} of a (possibly sharded) HF checkpoint."""
  files = safetensors_io.open_checkpoint(model_dir)
  return {n: (f.entries[n]['dtype'], f.shape(n), f.get(n).tobytes()) for n, f in files.items()}


def _fixture_dtype(case):
  with open(os.path.join(FIXTURES, case, 'config.json')) as f:
    return json.load(f)['torch_dtype']


@functools.lru_cache(maxsize=None)
def _fixture_run(case):
  config, params = load_hf(os.path.join(FIXTURES, case))
  ref = dict(np.load(os.path.join(FIXTURES, case, 'reference.npz')))
  logits, f_attn = _our_logits(config, params, ref['tokens'])
  return config, params, ref, logits, f_attn


# --------------------------------------------------------------------------------------------
# Golden fixtures: import
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case', CASES)
def test_import_logits_match_reference(case):
  config, params, ref, logits, _ = _fixture_run(case)
  assert {k: v.shape for k, v in _flat(params).items()} == _param_shapes(config)
  assert all(v.dtype == np.float32 for v in _flat(params).values())
  gate = case.split('_')[0]
  assert config.model.gate.position == ('none' if gate == 'baseline' else 'g1')
  assert config.variant == ('baseline' if gate == 'baseline' else f'g1_{gate}')
  rel = np.max(np.abs(logits - ref['logits'])) / np.max(np.abs(ref['logits']))
  assert rel < 1e-4, f'{case}: max |ours - reference| / max |reference| = {rel:.2e}'


@pytest.mark.parametrize('case', CASES)
def test_f_attn_matches_reference(case):
  """F-Attn per layer and head from our inspect path = from the reference's probabilities."""
  _, _, ref, _, f_attn_LxH = _fixture_run(case)
  np.testing.assert_allclose(f_attn_LxH, ref['f_attn'], atol=1e-5)
  np.testing.assert_allclose(f_attn_LxH.mean(axis=1), ref['f_attn'].mean(axis=1), atol=1e-5)


def test_import_maps_config_fields():
  c = load_hf(os.path.join(FIXTURES, 'baseline_tied'))[0]
  assert (c.model.rope_base, c.model.tie_embeddings, c.model.norm_eps) == (1e6, True, 1e-6)
  assert c.model.rope_scaling.type == 'none'
  assert c.data.tokenizer == os.path.join(FIXTURES, 'baseline_tied', 'tokenizer.json')
  c = load_hf(os.path.join(FIXTURES, 'baseline_untied'))[0]
  assert (c.model.norm_eps, c.model.tie_embeddings) == (1e-5, False)
  c = load_hf(os.path.join(FIXTURES, 'elementwise_tied'))[0]
  assert c.model.rope_scaling.to_dict() == dict(type='yarn', factor=4.0, original_max_len=8)
  assert (c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.num_kv_heads,
          c.model.head_dim, c.model.ffn_size, c.model.vocab_size) == (2, 48, 4, 2, 16, 80, 97)
  assert c.model.gate.granularity == 'elementwise' and c.hf.source.endswith('elementwise_tied')


def _per_head_packing(w, H, K, d, g):
  """The authors' widened q_proj [K (G d + G g), D] (per KV group: its G queries, then its G
  gates) re-packed per query head, [q_h | g_h] (Qwen3-Next's packing): the wrong layout here."""
  G = H // K
  groups = w.reshape(K, G * (d + g), -1)
  q, gate = groups[:, :G * d].reshape(H, d, -1), groups[:, G * d:].reshape(H, g, -1)
  return np.concatenate([q, gate], axis=1).reshape(w.shape)


@pytest.mark.parametrize('case', ['headwise_untied', 'elementwise_tied'])
def test_a_wrong_q_proj_packing_or_k_v_swap_fails_the_comparison(case, tmp_path):
  """Negative controls of test_import_logits_match_reference: the same comparison fails when
  the fixture's q_proj holds the gate per query head ([q_h | g_h]) instead of per KV group, or
  its k_proj and v_proj (the same shape) trade places: that test could have caught each."""
  src = os.path.join(FIXTURES, case)
  with open(os.path.join(src, 'config.json')) as f:
    hf = json.load(f)
  H, K, d = hf['num_attention_heads'], hf['num_key_value_heads'], hf['head_dim']
  g = 1 if hf['headwise_attn_output_gate'] else d
  ref = dict(np.load(os.path.join(src, 'reference.npz')))
  files = safetensors_io.open_checkpoint(src)
  tensors = {n: np.array(f.get(n)) for n, f in files.items()}
  swap = {'k_proj': 'v_proj', 'v_proj': 'k_proj'}
  changes = {
      'per_head_packing': lambda n: (_per_head_packing(tensors[n], H, K, d, g)
                                     if n.endswith('self_attn.q_proj.weight') else tensors[n]),
      'k_v_swapped': lambda n: tensors[next((n.replace(a, b) for a, b in swap.items()
                                             if f'self_attn.{a}.' in n), n)],
  }
  for label, change in changes.items():
    wrong = tmp_path / label
    os.makedirs(wrong)
    for name in ('config.json', 'generation_config.json', 'tokenizer.json'):
      if os.path.exists(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), wrong)
    changed = {n: change(n) for n in tensors}
    assert any(not np.array_equal(changed[n], tensors[n]) for n in tensors), label
    safetensors_io.write_file(str(wrong / 'model.safetensors'),
                              [(n, a.shape, a.dtype, lambda a=a: a) for n, a in changed.items()],
                              {'format': 'pt'})
    config, params = load_hf(str(wrong))
    logits, _ = _our_logits(config, params, ref['tokens'])
    rel = np.max(np.abs(logits - ref['logits'])) / np.max(np.abs(ref['logits']))
    assert rel > 100 * 1e-4, f'{case}, {label}: {rel:.2e} passes the comparison'


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case', CASES)
def test_export_of_imported_fixture_equals_original(case, tmp_path):
  src = os.path.join(FIXTURES, case)
  config, params = load_hf(src)
  save_hf(config, params, tmp_path / 'out', dtype=_fixture_dtype(case))
  assert _raw_tensors(tmp_path / 'out') == _raw_tensors(src)
  with open(os.path.join(src, 'config.json')) as f:
    original = json.load(f)
  with open(tmp_path / 'out' / 'config.json') as f:
    exported = json.load(f)
  diff = {k: (v, exported.get(k)) for k, v in original.items()
          if k != 'transformers_version' and exported.get(k, '<missing>') != v}
  assert not diff, diff
  assert ('auto_map' in exported) == (not case.startswith('baseline'))


ROUND_TRIPS = [(g, t) for g in ('none', 'headwise', 'elementwise') for t in (True, False)]


@pytest.mark.parametrize('gate,tied', ROUND_TRIPS)
def test_import_export_roundtrip_is_exact(gate, tied, tmp_path):
  config = _tiny_config(gate, tied, yarn=gate == 'headwise')
  params = _random_params(config)
  save_hf(config, params, tmp_path / 'hf')
  loaded_config, loaded = load_hf(tmp_path / 'hf')
  flat, flat_loaded = _flat(params), _flat(loaded)
  assert flat.keys() == flat_loaded.keys()
  for k, v in flat.items():
    assert flat_loaded[k].dtype == np.float32 and np.array_equal(flat_loaded[k], v), k
  assert loaded_config.model.to_dict() == config.model.to_dict()
  assert loaded_config.variant == config.variant


def _random_bits(rng, shape, dtype) -> np.ndarray:
  """Every bit pattern of `dtype` equally likely (NaNs, infinities and subnormals included)."""
  dtype = np.dtype(dtype)
  bits = rng.integers(0, 2**(8 * dtype.itemsize), shape, dtype=f'<u{dtype.itemsize}')
  return bits.view(dtype)


def test_safetensors_files_cross_read_with_the_library(tmp_path):
  """safetensors_io against the format's reference implementation (the `safetensors` library,
  numpy API): what write_file writes the library reads, and what the library's save_file writes
  SafetensorsFile reads, every tensor bit for bit with its dtype and shape, and the metadata;
  fp32 and bf16 in one file, random bit patterns."""
  pytest.importorskip('safetensors')
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  bf16 = np.dtype(ml_dtypes.bfloat16)
  tensors = {'model.embed_tokens.weight': _random_bits(rng, (11, 6), np.float32),
             'model.norm.weight': _random_bits(rng, (6,), bf16),
             'a.b': _random_bits(rng, (3, 1, 5), bf16), 'one': _random_bits(rng, (1,), np.float32),
             'lm_head.weight': _random_bits(rng, (6, 11), np.float32)}
  meta = {'format': 'pt'}
  ours = str(tmp_path / 'ours.safetensors')
  safetensors_io.write_file(ours, [(n, a.shape, a.dtype, lambda a=a: a)
                                   for n, a in tensors.items()], meta)
  with safe_open(ours, framework='numpy') as f:
    assert sorted(f.keys()) == sorted(tensors) and f.metadata() == meta
    for name, want in tensors.items():
      got = f.get_tensor(name)
      assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())
  theirs = str(tmp_path / 'theirs.safetensors')
  save_file(tensors, theirs, metadata=meta)
  st = safetensors_io.SafetensorsFile(theirs)
  assert sorted(st.entries) == sorted(tensors) and st.metadata == meta
  for name, want in tensors.items():
    got = st.get(name)
    assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())


def test_sharded_and_bf16_export_roundtrip(tmp_path):
  config = _tiny_config('elementwise', tied=False)
  params = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32),
                        _random_params(config, seed=3))
  single = save_hf(config, params, tmp_path / 'one', dtype='bfloat16')
  assert single['files'] == ['config.json', 'generation_config.json', 'model.safetensors']
  sharded = save_hf(config, params, tmp_path / 'many', dtype='bfloat16', max_shard_bytes=8000)
  shards = [f for f in sharded['files'] if f.endswith('.safetensors')]
  assert len(shards) > 2 and safetensors_io.INDEX_FILE in sharded['files']
  with open(tmp_path / 'many' / safetensors_io.INDEX_FILE) as f:
    index = json.load(f)
  assert sorted(set(index['weight_map'].values())) == shards
  assert _raw_tensors(tmp_path / 'many') == _raw_tensors(tmp_path / 'one')
  assert all(t[0] == 'BF16' for t in _raw_tensors(tmp_path / 'one').values())
  loaded = _flat(load_hf(tmp_path / 'many')[1])
  assert all(np.array_equal(loaded[k], v) for k, v in _flat(params).items())


def test_export_writes_the_runs_tokenizer(tmp_path):
  tokenizers = pytest.importorskip('tokenizers')
  vocab = {'<s>': 0, '<unk>': 1, **{f'w{i}': i + 2 for i in range(40)}}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  os.makedirs(tmp_path / 'tok')
  tok.save(str(tmp_path / 'tok' / 'tokenizer.json'))
  config = _tiny_config()
  config.data.tokenizer = str(tmp_path / 'tok' / 'tokenizer.json')
  out = save_hf(config, _random_params(config), tmp_path / 'hf')
  assert 'tokenizer.json' in out['files']
  with open(tmp_path / 'hf' / 'config.json') as f:
    assert (json.load(f)['bos_token_id']) == 0
  with open(tmp_path / 'hf' / 'generation_config.json') as f:
    assert json.load(f)['bos_token_id'] == 0
  assert load_hf(tmp_path / 'hf')[0].data.tokenizer == str(tmp_path / 'hf' / 'tokenizer.json')


# --------------------------------------------------------------------------------------------
# Stock transformers, live
# --------------------------------------------------------------------------------------------

def test_stock_transformers_loads_exported_baseline(tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  config = _tiny_config('none', tied=False, yarn=True)
  params = _random_params(config, seed=7)
  save_hf(config, params, tmp_path / 'hf')
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / 'hf', dtype=torch.float32, output_loading_info=True)
  assert not any(info.values()), info
  tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, (2, 16))
  with torch.no_grad():
    ref = model.eval()(torch.tensor(tokens)).logits.numpy()
  ours, _ = _our_logits(config, params, tokens)
  rel = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
  assert rel < 1e-4, rel
  # What this transformers writes (its own config spelling, e.g. v5's rope_parameters) imports.
  model.save_pretrained(tmp_path / 'resaved')
  resaved_config, resaved = load_hf(tmp_path / 'resaved')
  assert resaved_config.model.to_dict() == config.model.to_dict()
  assert all(np.array_equal(v, _flat(params)[k]) for k, v in _flat(resaved).items())


def test_greedy_generation_equals_transformers_generate_on_the_export(tmp_path):
  """The exported baseline generates in stock transformers (model.generate, greedy, KV cache)
  exactly the tokens our Generator (--mode=sample's) does, prompts of two lengths."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  config = _tiny_config('none', tied=False)
  params = _random_params(config, seed=11)
  save_hf(config, params, tmp_path / 'hf')
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', dtype=torch.float32)
  graphdef, state = _graphdef_and_state(config)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  gen = generate.Generator(nnx.merge(graphdef, state), max_len=32)
  rng = np.random.default_rng(5)
  for length in (3, 9):
    prompts = rng.integers(0, config.model.vocab_size, (2, length)).tolist()
    ours = gen.generate(prompts, max_new_tokens=16, temperature=0.0).tokens
    with torch.no_grad():         # no padding (all prompts of one length), no end token
      out = hf.eval().generate(torch.tensor(prompts), attention_mask=torch.ones(2, length),
                               max_new_tokens=16, do_sample=False, eos_token_id=None,
                               pad_token_id=config.model.vocab_size - 1, min_new_tokens=16)
    theirs = out[:, length:].tolist()
    assert [list(t) for t in ours] == theirs, (length, ours, theirs)


@pytest.mark.parametrize('case', CASES)
def test_greedy_generation_equals_the_fixtures_generate(case):
  """Each fixture imported as our run generates with our Generator (--mode=sample's, greedy, KV
  cache) exactly the tokens `model.generate(do_sample=False)` gave in PyTorch (greedy.npz, from
  the committed weights: stock Qwen3 for the baseline, the authors' modeling_qwen3.py for G1
  headwise / elementwise), prompts of lengths 4 and 9, 16 new tokens each. greedy.npz also
  holds the reference's top-1 minus top-2 logit before each token, stated on failure: measured
  smallest 7.5e-4 (headwise_untied, length 9), 2.6e-3 (baseline_untied), >= 3.9 for the bf16-tied
  cases; our float32 margins there differ from the reference's by at most 1.9e-5 (1.4e-6 at
  7.5e-4), so no token is decided within float32 rounding."""
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  config, params, *_ = _fixture_run(case)
  rec = np.load(os.path.join(FIXTURES, case, 'greedy.npz'))
  graphdef, state = _graphdef_and_state(config)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  gen = generate.Generator(nnx.merge(graphdef, state), max_len=32)
  for k in sorted(k for k in rec if k.startswith('prompts_')):
    L = k.split('_')[1]
    theirs = rec[f'continuations_{L}'].tolist()
    ours = gen.generate(rec[k].tolist(), max_new_tokens=len(theirs[0]), temperature=0.0).tokens
    assert [list(t) for t in ours] == theirs, (
        f'{case}, prompt length {L}: smallest reference top-2 margin '
        f'{rec[f"margins_{L}"].min():.2e}', ours, theirs)


def test_stock_transformers_refuses_a_gated_export(tmp_path):
  """A G1 export never loads silently as an ungated stock Qwen3: its q_proj is wider."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  config = _tiny_config('headwise')
  save_hf(config, _random_params(config), tmp_path / 'hf')
  with pytest.raises(RuntimeError, match='mismatched'):
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', dtype=torch.float32)


# --------------------------------------------------------------------------------------------
# Refusals: named field, nothing written
# --------------------------------------------------------------------------------------------

def _copy_fixture(case, dst, **config_changes):
  os.makedirs(dst)
  for f in os.listdir(os.path.join(FIXTURES, case)):
    with open(os.path.join(FIXTURES, case, f), 'rb') as src, open(os.path.join(dst, f), 'wb') as o:
      o.write(src.read())
  with open(os.path.join(dst, 'config.json')) as f:
    cfg = json.load(f)
  cfg.update(config_changes)
  with open(os.path.join(dst, 'config.json'), 'w') as f:
    json.dump(cfg, f)


IMPORT_REFUSALS = [
    (dict(attention_bias=True), 'attention_bias'),
    (dict(qkv_bias=True), 'qkv_bias'),
    (dict(use_sliding_window=True), 'use_sliding_window'),
    (dict(layer_types=['full_attention', 'sliding_attention']), 'layer_types'),
    (dict(model_type='llama'), 'model_type'),
    (dict(model_type='qwen3_moe'), 'Mixture-of-Experts'),
    (dict(hidden_act='gelu'), 'hidden_act'),
    (dict(rope_scaling=dict(rope_type='linear', factor=2.0)), 'rope_scaling.rope_type'),
    (dict(rope_scaling=dict(rope_type='yarn', factor=2.0, beta_fast=16)), 'rope_scaling.beta_fast'),
    (dict(headwise_attn_output_gate=True, elementwise_attn_output_gate=True),
     'elementwise_attn_output_gate'),
    (dict(architectures=['Qwen3ForSequenceClassification']), 'architectures'),
    (dict(headwise_attn_output_gate=True), 'q_proj'),          # weights without the gate rows
]


@pytest.mark.parametrize('changes,field', IMPORT_REFUSALS)
def test_import_refuses_naming_the_field(changes, field, tmp_path):
  _copy_fixture('baseline_untied', tmp_path / 'm', **changes)
  with pytest.raises(HFFormatError, match=field):
    load_hf(tmp_path / 'm')


def test_import_refuses_unexpected_tensors(tmp_path):
  _copy_fixture('baseline_untied', tmp_path / 'm')
  path = tmp_path / 'm' / 'model.safetensors'
  st = safetensors_io.SafetensorsFile(path)
  names = list(st.entries)
  tensors = [(n, st.shape(n), np.dtype('<f4'), lambda n=n: st.get(n)) for n in names]
  tensors.append(('model.layers.0.self_attn.q_proj.bias', (64,), np.dtype('<f4'),
                  lambda: np.zeros(64, np.float32)))
  safetensors_io.write_file(str(tmp_path / 'with_bias.safetensors'), tensors)
  os.replace(tmp_path / 'with_bias.safetensors', path)
  with pytest.raises(HFFormatError, match='biases are not supported'):
    load_hf(tmp_path / 'm')
  os.remove(path)
  with pytest.raises(HFFormatError, match='no \\*.safetensors'):
    load_hf(tmp_path / 'm')


EXPORT_REFUSALS = [
    ('g2_elementwise', 'gate.position'), ('g5_elementwise', 'gate.position'),
    ('g1_additive_silu', 'gate.mode'), ('g1_elementwise_silu', 'gate.activation'),
    ('g1_ns_sigmoid', 'gate.activation'), ('g1_headshared', 'gate.head_shared'),
    ('g1_input_independent', 'gate.input_dependent'), ('g1_rmsnorm', 'gate.kind'),
    ('g1_silu_noparam', 'gate.kind'), ('baseline_sandwich_norm', 'sandwich_norm'),
    ('baseline:moe_tiny', 'moe.num_experts'),
]


@pytest.mark.parametrize('variant,field', EXPORT_REFUSALS)
def test_export_refuses_variants_without_a_hf_class(variant, field, tmp_path):
  import importlib  # pylint: disable=g-import-not-at-top
  name, _, scale = variant.partition(':')
  config = importlib.import_module(f'configs.{name}').get_config(scale or 'tiny')
  with pytest.raises(HFExportError, match=field.replace('.', r'\.')):
    save_hf(config, {}, tmp_path / 'out')
  assert os.listdir(tmp_path) == []


def test_export_refuses_bad_arguments_and_writes_nothing(tmp_path):
  config = _tiny_config('headwise')
  params = _random_params(config)
  nogate = _random_params(_tiny_config('none'))
  os.makedirs(tmp_path / 'full')
  open(tmp_path / 'full' / 'x', 'w').close()
  cases = [((config, params, tmp_path / 'full'), {}, 'not an empty directory'),
           ((config, params, tmp_path / 'o'), dict(dtype='float16'), 'dtype'),
           ((config, nogate, tmp_path / 'o'), {}, 'blocks.attn.gate.kernel'),
           ((config, params, tmp_path / 'o'), dict(tokenizer_dir=str(tmp_path)), 'tokenizer'),
           ((config, params, tmp_path / 'o'), dict(remote_code_dir=str(tmp_path)), 'lacks')]
  qk = _tiny_config('none')
  qk.model.qk_norm = False
  missing_tok = _tiny_config('none')
  missing_tok.data.tokenizer = str(tmp_path / 'gone' / 'tokenizer.json')
  cases += [((qk, nogate, tmp_path / 'o'), {}, 'qk_norm'),
            ((missing_tok, nogate, tmp_path / 'o'), {}, 'data.tokenizer'),
            ((config, {'embed': {}}, tmp_path / 'o'), {}, 'wi_gate')]
  for args, kwargs, match in cases:
    with pytest.raises(HFExportError, match=match):
      save_hf(*args, **kwargs)
  assert sorted(os.listdir(tmp_path)) == ['full'] and os.listdir(tmp_path / 'full') == ['x']


# --------------------------------------------------------------------------------------------
# Run directories: --mode=import / --mode=export, and what opens an imported run
# --------------------------------------------------------------------------------------------

def _doc_text(tokens_T, filler: int = 0) -> str:
  """The text whose packed window is `tokens_T` exactly: BOS (id 96) starts every document, so
  a document of the other T-1 tokens plus one filler fills a window of T + 1 tokens."""
  return ' '.join(f'w{int(t)}' for t in list(tokens_T[1:]) + [filler])


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
  """The headwise fixture imported into a run directory, and a jsonl of its first sequence."""
  from gated_attention.runs.hf import interop as rundir  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('imported')
  ref = np.load(os.path.join(FIXTURES, 'headwise_untied', 'reference.npz'))
  data = root / 'docs.jsonl'
  with open(data, 'w') as f:
    for _ in range(64):
      f.write(json.dumps({'text': _doc_text(ref['tokens'][0])}) + '\n')
  summary = rundir.import_run(os.path.join(FIXTURES, 'headwise_untied'), str(root / 'run'))
  return str(root / 'run'), str(data), ref, summary


def test_import_writes_a_run_that_analyze_opens_with_the_reference_f_attn(imported):
  """--mode=analyze on the imported run, on held-out windows equal to the fixture's first
  sequence: its per-layer F-Attn is the reference model's (transformers, eager attention)."""
  from gated_attention.modes import analyze  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir as runs  # pylint: disable=g-import-not-at-top
  workdir, data, ref, summary = imported
  assert summary['variant'] == 'g1_headwise' and summary['step'] == 0
  assert runs.checkpoint_steps(workdir) == [0]
  T = ref['tokens'].shape[1]
  report = analyze.run(workdir, overrides={
      'data.source': 'jsonl', 'data.path': data, 'data.seq_len': T, 'data.val_batches': 2,
      'train.batch_size': 2})
  assert report['variant'] == 'g1_headwise' and report['gate_score_mean'] is not None
  want_L = ref['f_attn_per_seq'][0].mean(axis=-1)
  np.testing.assert_allclose(report['f_attn'], want_L, atol=1e-5)
  np.testing.assert_allclose(report['f_attn_per_head'], ref['f_attn_per_seq'][0], atol=1e-5)


def test_imported_run_trains_from_its_weights(imported, tmp_path):
  """--mode=train on an imported run: a warm start (the imported parameters, a fresh optimizer
  and data iterator) that continues at step 1 and saves ordinary checkpoints."""
  import shutil  # pylint: disable=g-import-not-at-top
  from configs import from_run  # pylint: disable=g-import-not-at-top
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir as runs  # pylint: disable=g-import-not-at-top
  workdir, data, _, _ = imported
  run = str(tmp_path / 'finetune')
  shutil.copytree(workdir, run)
  c = from_run.get_config(run)
  c.data.update(source='jsonl', path=data, seq_len=16, val_batches=1)
  c.train.update(steps=2, batch_size=2, log_every=1, eval_every=2, checkpoint_every=2,
                 warmup_steps=1)
  before = runs.load_run(run).params
  loop.run(c, run)
  assert runs.checkpoint_steps(run) == [0, 2]
  after = runs.load_run(run)
  assert after.step == 2 and after.config.variant == 'g1_headwise'
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                       before, after.params)
  assert max(jax.tree.leaves(moved)) > 0       # trained from the imported weights...
  kernel = np.asarray(before['blocks']['attn']['gate']['kernel'])
  np.testing.assert_allclose(np.asarray(after.params['blocks']['attn']['gate']['kernel']),
                             kernel, atol=0.05)   # ... a small step away from them
  # Trained here, on documents that start with BOS (<s> = 96): its export puts BOS first.
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  interop.export_run(run, str(tmp_path / 'hf'))
  transformers = pytest.importorskip('transformers')
  assert transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf')('w3 w5').input_ids == [96, 3, 5]


def test_export_of_an_imported_run_gives_back_the_files(imported, tmp_path):
  from gated_attention.runs.hf import interop as rundir  # pylint: disable=g-import-not-at-top
  workdir = imported[0]
  out = rundir.export_run(workdir, str(tmp_path / 'hf'), dtype='bfloat16')
  assert out['format'] == 'authors_gated_qwen3_headwise' and out['step'] == 0
  src = safetensors_io.open_checkpoint(os.path.join(FIXTURES, 'headwise_untied'))
  got = safetensors_io.open_checkpoint(str(tmp_path / 'hf'))
  assert sorted(got) == sorted(src)
  for name in src:
    np.testing.assert_array_equal(got[name].get(name), src[name].get(name))
  assert 'tokenizer.json' in out['files']
  # Trained without BOS (the fixture's tokenizer adds none): the export keeps that behaviour.
  with open(os.path.join(FIXTURES, 'headwise_untied', 'tokenizer.json'), 'rb') as f:
    assert (tmp_path / 'hf' / 'tokenizer.json').read_bytes() == f.read()
  transformers = pytest.importorskip('transformers')
  fast = transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf')
  assert fast('w3 w5').input_ids == fast('w3 w5', add_special_tokens=False).input_ids == [3, 5]


def test_import_refuses_a_workdir_that_holds_a_run(imported):
  from gated_attention.runs.checkpoint import CheckpointError  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop as rundir  # pylint: disable=g-import-not-at-top
  with pytest.raises(CheckpointError, match='already holds a run'):
    rundir.import_run(os.path.join(FIXTURES, 'baseline_tied'), imported[0])


def test_a_byte_tokenizer_run_exported_and_imported_back_can_be_analysed(tmp_path_factory):
  """The seam of issue 23: a run trained with the byte tokenizer is exported with its
  tokenizer.json (the ids of input_pipeline's byte tokenizer), imported again and analysed with
  no tokenizer named; an import of a directory without tokenizer.json records none, and the
  evaluation names it (--config.data.tokenizer=byte)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from gated_attention.modes import analyze  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir as runs  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  from tests.test_analysis import make_tiny_run  # pylint: disable=g-import-not-at-top
  run = make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=False)
  root = tmp_path_factory.mktemp('byte_roundtrip')
  out = interop.export_run(run, str(root / 'hf'))
  assert {'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'} <= set(out['files'])
  with open(root / 'hf' / 'config.json') as f:
    assert json.load(f)['bos_token_id'] == 256
  small = {'data.val_batches': 1, 'train.batch_size': 2}
  summary = interop.import_run(str(root / 'hf'), str(root / 'back'))
  assert summary['tokenizer'] == str(root / 'hf' / 'tokenizer.json')
  report = analyze.run(str(root / 'back'), overrides=small)
  assert report['tokenizer'] == 'hf:tokenizer.json' and report['step'] == 0
  bare = root / 'bare'                              # the weights alone: no tokenizer recorded
  shutil.copytree(root / 'hf', bare)
  for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'):
    os.remove(bare / name)
  assert interop.import_run(str(bare), str(root / 'bare_run'))['tokenizer'] == ''
  with pytest.raises(runs.RunError, match='records no tokenizer .* --config.data.tokenizer=byte'):
    analyze.run(str(root / 'bare_run'), overrides=small)
  report = analyze.run(str(root / 'bare_run'), overrides={**small, 'data.tokenizer': 'byte'})
  assert report['tokenizer'] == 'byte'
  assert runs.read_config(str(root / 'bare_run')).data.tokenizer == ''   # not rewritten


def test_the_byte_tokenizer_json_encodes_as_the_byte_tokenizer(tmp_path):
  """ByteTokenizer.save_hf: `tokenizers` (through HFTokenizer) and `transformers` give the byte
  tokenizer's ids for random text (every UTF-8 length, controls, whitespace), decode back, and
  know BOS."""
  import random  # pylint: disable=g-import-not-at-top
  from gated_attention.input_pipeline.tokenizer import ByteTokenizer, HFTokenizer  # pylint: disable=g-import-not-at-top
  ByteTokenizer().save_hf(str(tmp_path))
  ours, hf = ByteTokenizer(), HFTokenizer(str(tmp_path / 'tokenizer.json'))
  assert (hf.vocab_size, hf.bos_id, hf.bos_token) == (257, 256, '<bos>')
  rng = random.Random(0)
  ranges = ((0, 0x80), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000))
  texts = ['', ' ', '  two spaces\n\r\n\ttab', '\x00\x7f', 'caf\u00e9 \u6f22\u5b57 \U0001f642']
  texts += [''.join(chr(rng.randrange(*rng.choice(ranges))) for _ in range(rng.randrange(1, 30)))
            for _ in range(200)]
  for text in texts:
    assert hf.encode(text) == ours.encode(text), repr(text)
    assert hf.decode(hf.encode(text)) == text, repr(text)
  transformers = pytest.importorskip('transformers')
  fast = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert fast.bos_token_id == 256
  for text in texts[:50]:
    assert fast(text, add_special_tokens=False)['input_ids'] == ours.encode(text), repr(text)
    assert fast.decode(ours.encode(text)) == text, repr(text)


def _pipeline_greedy(model_dir, prompts, max_new_tokens, **kwargs) -> list[str]:
  """Greedy continuations of `prompts` by transformers' pipeline('text-generation')."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  pipe = transformers.pipeline('text-generation', model=str(model_dir), dtype=torch.float32)
  return [pipe(p, do_sample=False, max_new_tokens=max_new_tokens, return_full_text=False,
               **kwargs)[0]['generated_text'] for p in prompts]


def test_an_export_puts_bos_first_and_the_pipeline_generates_as_mode_sample(tmp_path):
  """Issue 48: the exported tokenizer of a byte-tokenizer run trained here puts BOS (256) before
  every text by itself, so `AutoTokenizer` and pipeline('text-generation') need no flag: the
  pipeline's greedy continuations equal --mode=sample's (which starts every prompt with BOS),
  for the export and for the run imported from it, exported again (its tokenizer kept BOS
  first). Fed without BOS, the same model continues otherwise (so the check sees BOS)."""
  transformers = pytest.importorskip('transformers')
  from gated_attention.modes import sample  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  config = _tiny_config('none', tied=False)
  config.model.vocab_size = 257                  # the byte tokenizer's (data.tokenizer='byte')
  save_hf(config, _random_params(config, seed=3), tmp_path / 'hf')
  fast = transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf')
  assert fast('hello').input_ids == [256, 104, 101, 108, 108, 111]
  assert fast('hello', add_special_tokens=False).input_ids == [104, 101, 108, 108, 111]
  with open(tmp_path / 'hf' / 'tokenizer_config.json') as f:
    assert json.load(f)['add_bos_token'] is True
  interop.import_run(str(tmp_path / 'hf'), str(tmp_path / 'run'))
  interop.export_run(str(tmp_path / 'run'), str(tmp_path / 'again'))
  again = transformers.AutoTokenizer.from_pretrained(tmp_path / 'again')
  assert again('hello').input_ids == [256, 104, 101, 108, 108, 111]
  prompts = ['def f(x):', 'hello', 'The cat']
  ours = sample.sample(str(tmp_path / 'run'), prompts, max_new_tokens=12)
  assert _pipeline_greedy(tmp_path / 'hf', prompts, 12) == ours
  assert _pipeline_greedy(tmp_path / 'again', prompts, 12) == ours
  without = _pipeline_greedy(tmp_path / 'hf', prompts, 12, add_special_tokens=False)
  assert all(a != b for a, b in zip(without, ours)), (without, ours)


def _bpe_tokenizer_json(tmp_path) -> str:
  """input_pipeline.bpe's byte-level BPE (BOS <|endoftext|> = 0) trained on a few documents,
  with the ByteLevel post-processor many released tokenizers carry (Qwen's among them)."""
  tokenizers = pytest.importorskip('tokenizers')
  from gated_attention.input_pipeline import bpe  # pylint: disable=g-import-not-at-top
  data = tmp_path / 'docs.jsonl'
  with open(data, 'w') as f:
    for i in range(40):
      f.write(json.dumps({'text': f'def f{i}(x):\n  return x + {i}\nhello world {i}'}) + '\n')
  c = scales.get_config('tiny')
  c.data.update(source='jsonl', path=str(data))
  path = str(tmp_path / 'bpe' / 'tokenizer.json')
  bpe.train_bpe(c.data, 300, path)
  tok = tokenizers.Tokenizer.from_file(path)
  tok.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
  tok.save(path)
  return path


def test_a_bpe_run_export_puts_bos_first_and_its_import_keeps_it(tmp_path):
  """A run trained here on a BPE tokenizer.json: the export's tokenizer puts BOS first and then
  the ids the run's own tokenizer gives; imported and exported again, it still does."""
  transformers = pytest.importorskip('transformers')
  from gated_attention.input_pipeline.tokenizer import HFTokenizer  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  path = _bpe_tokenizer_json(tmp_path)
  ours = HFTokenizer(path)
  assert (ours.bos_token, ours.bos_id) == ('<|endoftext|>', 0)
  config = _tiny_config('none')
  config.data.tokenizer = path
  config.model.vocab_size = ours.vocab_size
  save_hf(config, _random_params(config), tmp_path / 'hf')
  text = 'def f7(x):\n  return x + 7'
  for out in ('hf', 'again'):
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / out)
    assert fast(text).input_ids == [0] + ours.encode(text), out
    assert fast(text, add_special_tokens=False).input_ids == ours.encode(text), out
    if out == 'hf':
      interop.import_run(str(tmp_path / 'hf'), str(tmp_path / 'run'))
      interop.export_run(str(tmp_path / 'run'), str(tmp_path / 'again'))


def test_sharded_export_from_the_command_line(tmp_path_factory):
  """main.py --mode=export --max_shard_size=50KB writes several safetensors files and their
  index; importing the directory back gives the run's parameters bit for bit. A bad size is one
  paragraph."""
  from gated_attention.runs import rundir as runs  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  from tests.test_analysis import ROOT, make_tiny_run  # pylint: disable=g-import-not-at-top
  run = make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=False)
  root = tmp_path_factory.mktemp('sharded_cli')
  out = root / 'hf'
  cmd = [sys.executable, 'main.py', '--mode=export', f'--workdir={run}', f'--out={out}']
  done = subprocess.run(cmd + ['--max_shard_size=50KB'], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  shards = sorted(f for f in os.listdir(out) if f.endswith('.safetensors'))
  with open(out / 'model.safetensors.index.json') as f:
    weight_map = json.load(f)['weight_map']
  assert len(shards) > 1 and sorted(set(weight_map.values())) == shards
  for shard in shards:          # at most 50 KB of tensors, or one tensor larger than that alone
    tensors = [n for n, f in weight_map.items() if f == shard]
    assert os.path.getsize(out / shard) <= 50_000 + 2**12 or len(tensors) == 1, shard
  interop.import_run(str(out), str(root / 'back'), overrides={'data.tokenizer': 'byte'})
  want = jax.device_get(runs.load_run(run).params)
  got = jax.device_get(runs.load_run(str(root / 'back')).params)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  bad = subprocess.run(cmd[:-1] + [f'--out={root / "bad"}', '--max_shard_size=lots'], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 1 and 'Traceback' not in bad.stderr
  assert "--max_shard_size='lots' is not a size" in bad.stderr


# --------------------------------------------------------------------------------------------
# lm-evaluation-harness (optional: pip install "lm_eval[hf]==0.4.13"; CI does not install it)
# --------------------------------------------------------------------------------------------

LM_EVAL_TASKS = os.path.join(os.path.dirname(__file__), 'fixtures', 'lm_eval')


def _our_loglikelihoods(gen, tok, requests, bos: bool) -> list[tuple[float, bool]]:
  """(log p(continuation | context), whether it is the greedy continuation) of each request
  from our JAX model (Generator.logits, float64 log-softmax), tokenised as the harness's HFLM
  does for a causal model: the context's trailing whitespace moved to the continuation, each
  part encoded alone (the byte tokenizer: context + continuation encodes as their concatenation)
  and BOS before the context when `bos` (add_bos_token=True)."""
  seqs = []
  for ctx, cont in requests:
    n = len(ctx) - len(ctx.rstrip())
    if n:
      ctx, cont = ctx[:-n], ctx[-n:] + cont
    seqs.append(([tok.bos_id] * bos + list(tok.encode(ctx)), list(tok.encode(cont))))
  tokens_BxT = np.zeros((len(seqs), max(len(c) + len(w) for c, w in seqs)), np.int32)
  for b, (c, w) in enumerate(seqs):          # right-padded: causal, so padding changes nothing
    tokens_BxT[b, :len(c) + len(w)] = c + w
  logits = np.asarray(gen.logits(tokens_BxT), np.float64)
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  out = []
  for b, (c, w) in enumerate(seqs):
    at = np.arange(len(c) - 1, len(c) + len(w) - 1)       # position t scores token t + 1
    out.append((float(logp[b, at, w].sum()), bool(np.all(logp[b, at].argmax(-1) == w))))
  return out


@pytest.mark.slow
def test_lm_eval_harness_scores_an_export_as_our_model_does(tmp_path, monkeypatch):
  """A tiny baseline run with the byte tokenizer, trained, exported and scored by
  lm-evaluation-harness (its `hf` model, Python API) on the local task tests/fixtures/lm_eval
  (32 made-up questions, 96 requests): every request is the (context, continuation) the task
  defines, and every log-likelihood the harness logs equals our model's for the same tokens
  (1e-4), as do acc and acc_norm; with add_bos_token=True and without: the exported tokenizer
  puts BOS first by itself (issue 48), and the harness (0.4.13) follows the tokenizer's default
  when add_bos_token is not given, so both feed BOS before each context."""
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path / 'datasets'))  # read when first imported
  lm_eval = pytest.importorskip('lm_eval')
  for module in ('accelerate', 'torch', 'transformers'):
    pytest.importorskip(module)
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir as runs  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from tests.test_analysis import ROOT, tiny_run_config  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(ROOT)                  # the task's data_files is relative to the repository
  workdir = str(tmp_path / 'run')
  loop.run(tiny_run_config('baseline'), workdir)
  assert runs.read_config(workdir).data.tokenizer == 'byte'
  interop.export_run(workdir, str(tmp_path / 'hf'))
  run = runs.load_run(workdir)
  gen = generate.Generator(run.model, max_len=128)
  with open(os.path.join(LM_EVAL_TASKS, 'tiny_mc.jsonl')) as f:
    docs = [json.loads(line) for line in f]
  want_requests = [(d['question'] if d['question'].endswith(' ') else
                    f'Question: {d["question"]}\nAnswer:', ' ' + c)
                   for d in docs for c in d['choices']]
  for bos in (True, False):
    model_args = f'pretrained={tmp_path / "hf"},dtype=float32' + (',add_bos_token=True' * bos)
    out = lm_eval.simple_evaluate(
        model='hf', model_args=model_args, tasks=['tiny_mc'], device='cpu', batch_size=8,
        log_samples=True, task_manager=TaskManager(include_path=LM_EVAL_TASKS))
    samples = sorted(out['samples']['tiny_mc'], key=lambda s: s['doc_id'])
    requests = [tuple(a) for s in samples for a in s['arguments']]
    theirs = [tuple(r[0]) for s in samples for r in s['resps']]
    assert requests == want_requests
    ours = _our_loglikelihoods(gen, run.tokenizer, requests, bos=True)
    err = max(abs(a[0] - b[0]) for a, b in zip(ours, theirs))
    assert err < 1e-4, f'add_bos_token={bos}: max |ours - harness| = {err:.2e}'
    assert [g for _, g in ours] == [g for _, g in theirs]
    acc, acc_norm, start = [], [], 0
    for d in docs:
      ll = np.array([o[0] for o in ours[start:start + len(d['choices'])]])
      start += len(d['choices'])
      acc.append(ll.argmax() == d['answer'])
      acc_norm.append((ll / [len(c) for c in d['choices']]).argmax() == d['answer'])
    result = out['results']['tiny_mc']
    assert result['acc,none'] == pytest.approx(np.mean(acc))
    assert result['acc_norm,none'] == pytest.approx(np.mean(acc_norm))


def test_an_import_of_the_1p7b_release_is_dense_1p7b_28l_and_analysed_on_one_sequence():
  """The import's config names the scale its architecture is (it started from tiny's and said
  'tiny' for a 1.7B model), with that scale's data recipe (4096-token sequences) and one
  sequence of one batch for the analysis; a model of no scale says 'imported'."""
  from benchmarks import fake_release  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import hf_config  # pylint: disable=g-import-not-at-top
  for gate in ('none', 'headwise', 'elementwise'):
    hf = dict(fake_release.CONFIG, headwise_attn_output_gate=gate == 'headwise',
              elementwise_attn_output_gate=gate == 'elementwise')
    c = hf_config.run_config(hf, '/nowhere')
    assert (c.scale, c.data.seq_len) == ('dense_1p7b_28l', 4096), gate
    assert (c.analysis.batch_size, c.analysis.num_batches) == (1, 1)
    assert c.model.num_layers == 28 and c.model.hidden_size == 2048
    assert c.model.dtype == 'float32'                 # the import's compute dtype, not the scale's
    assert hf_config.scale_of_run(c) == 'dense_1p7b_28l'
    c.scale = 'tiny'                                  # what imports before this recorded
    assert hf_config.scale_of_run(c) == 'dense_1p7b_28l'
  other = dict(fake_release.CONFIG, num_hidden_layers=3)
  c = hf_config.run_config(other, '/nowhere')
  assert c.scale == 'imported' and c.data.seq_len == 128 and c.analysis.batch_size == 0
  assert hf_config.scale_of_run(c) == 'imported'
