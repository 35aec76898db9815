"""Qwen3-Next / Qwen3.5 import and export (runs/hf/hybrid_config.py, hybrid_layout.py) against
transformers 5.24 itself: tiny random models of Qwen3NextForCausalLM, Qwen3_5ForCausalLM and
Qwen3_5MoeForCausalLM (and the multimodal Qwen3.5 classes, as the released checkpoints are),
saved by transformers, imported here: the same float32 logits on plain, left-padded and packed
inputs, the same greedy continuations; exported back: transformers loads it and computes the same
logits. Negative controls (a q_proj read in the authors' per-KV-group packing, conv channels in
another order) fail the same comparison, so the comparison can fail.
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.runs.hf import HFExportError, HFFormatError, load_hf, safetensors_io, save_hf

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

# Two periods of the pattern (three DeltaNets, one attention layer): layer l at index l // 4 of
# the stacked blocks, so a misplaced layer shows.
SHAPES = dict(vocab_size=61, hidden_size=32, num_hidden_layers=8, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              rms_norm_eps=1e-6)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
           shared_expert_intermediate_size=24)
CLASSES = {
    'qwen3_next': ('Qwen3NextConfig', 'Qwen3NextForCausalLM',
                   dict(MOE, intermediate_size=40, norm_topk_prob=True)),
    'qwen3_5': ('Qwen3_5TextConfig', 'Qwen3_5ForCausalLM', dict(intermediate_size=40)),
    'qwen3_5_moe': ('Qwen3_5MoeTextConfig', 'Qwen3_5MoeForCausalLM', dict(MOE)),
}
SEEDS = (0, 1, 2)
TOLERANCE = 1e-4          # max |ours - transformers| / max |transformers|


def _randomize(model, seed):
  """Every parameter random and O(0.3) (transformers' init leaves norms at 0 and the logits
  flat): norms away from 1, the decay and its bias away from their init, the conv random."""
  gen = torch.Generator().manual_seed(1000 + seed)
  with torch.no_grad():
    for _, p in sorted(model.named_parameters()):
      p.copy_(0.3 * torch.randn(p.shape, generator=gen))
  return model.float().eval()


def _hf_model(kind, seed, **changes):
  config_cls, model_cls, extra = CLASSES[kind]
  torch.manual_seed(seed)
  config = getattr(transformers, config_cls)(**dict(SHAPES, **extra, **changes))
  return _randomize(getattr(transformers, model_cls)(config), seed)


def _multimodal_model(kind, seed):
  """Qwen3_5(Moe)ForConditionalGeneration with a one-block vision tower: the released layout."""
  text_cls, _, extra = CLASSES[kind]
  name = 'Qwen3_5' if kind == 'qwen3_5' else 'Qwen3_5Moe'
  vision = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32,
                patch_size=4, spatial_merge_size=2, temporal_patch_size=2)
  config = getattr(transformers, f'{name}Config')(
      text_config=dict(SHAPES, **extra), vision_config=vision)
  torch.manual_seed(seed)
  return _randomize(getattr(transformers, f'{name}ForConditionalGeneration')(config), seed)


@functools.lru_cache(maxsize=None)
def _saved(kind, seed, root) -> tuple:
  """(directory, model) of a saved tiny random model."""
  model = _hf_model(kind, seed)
  path = os.path.join(root, f'{kind}_{seed}')
  model.save_pretrained(path)
  return path, model


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp('hybrid_hf'))


def _hf_logits(model, tokens, mask=None):
  with torch.no_grad():
    kwargs = {} if mask is None else {'attention_mask': torch.tensor(mask)}
    return model(torch.tensor(tokens), **kwargs).logits.numpy()


@functools.lru_cache(maxsize=None)
def _forward(config_json: str):
  """A jitted forward (logits) of the model a run config describes, compiled once per
  architecture."""
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_config(ml_collections.ConfigDict(json.loads(config_json)))
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_lib.Transformer(cfg, rngs=nnx.Rngs(0))))

  @jax.jit
  def forward(state, tokens, segments):
    logits, _ = nnx.merge(graphdef, state)(tokens, segment_ids_BxT=segments)
    return logits

  return graphdef, forward


def _ours(config, params, tokens, segments=None, state=None):
  """Our float32 logits of `tokens` (with document `segments`: packed documents); `state`: the
  model state of `params` when already made (_state)."""
  _, forward = _forward(config.model.to_json())
  state = _state(config, params) if state is None else state
  return np.asarray(forward(state, jnp.asarray(tokens),
                            None if segments is None else jnp.asarray(segments)))


def _state(config, params):
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_config(config.model)
  _, state = nnx.split(nnx.eval_shape(lambda: model_lib.Transformer(cfg, rngs=nnx.Rngs(0))))
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  return state


def _rel(ours, ref) -> float:
  return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _tokens(seed, shape):
  return np.random.default_rng(seed).integers(0, SHAPES['vocab_size'], shape)


# --------------------------------------------------------------------------------------------
# Import: logits equal transformers'
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('seed', SEEDS)
@pytest.mark.parametrize('kind', sorted(CLASSES))
def test_import_logits_equal_transformers(kind, seed, root):
  path, model = _saved(kind, seed, root)
  config, params = load_hf(path)
  assert config.model.layer_types == tuple(model.config.layer_types)
  assert config.variant == 'g1_elementwise' and config.model.gate.packing == 'head'
  tokens = _tokens(seed, (2, 21))
  ref = _hf_logits(model, tokens)
  rel = _rel(_ours(config, params, tokens), ref)
  assert rel < TOLERANCE, f'{kind} seed {seed}: {rel:.2e}'


def test_import_of_left_padded_and_packed_inputs_equals_transformers(root):
  """Left padding: transformers with its attention mask == ours with the padding as a document
  of its own (document masking restarts the DeltaNet state and the conv, and attention does not
  cross), on the valid tokens. Packed: documents in one row, ours with document masking ==
  transformers on each document alone (and without the masking, not)."""
  for kind in sorted(CLASSES):
    path, model = _saved(kind, 1, root)
    config, params = load_hf(path)
    state = _state(config, params)
    mask = np.array([[1] * 21, [0] * 13 + [1] * 8])
    tokens = np.where(mask == 1, _tokens(7, (2, 21)), 0)
    ref = _hf_logits(model, tokens, mask)
    ours = _ours(config, params, tokens, mask.astype(np.int32), state)
    valid = mask == 1
    assert _rel(ours[valid], ref[valid]) < TOLERANCE, kind
    rows = ((7, 9, 5), (12, 9))
    packed = _tokens(8, (2, 21))
    segments = np.stack([np.repeat(np.arange(len(r)), r) for r in rows]).astype(np.int32)
    ref = np.stack([np.concatenate([_hf_logits(model, packed[i:i + 1, a:b])[0] for a, b in zip(
        np.cumsum((0,) + r), np.cumsum(r))]) for i, r in enumerate(rows)])
    assert _rel(_ours(config, params, packed, segments, state), ref) < TOLERANCE, kind
    # without document masking the packed row is one sequence: not what transformers computed
    assert _rel(_ours(config, params, packed, state=state), ref) > 100 * TOLERANCE, kind


def _greedy(config, params, prompts, new_tokens, width=21):
  """Greedy continuation by our uncached forward, on a right-padded buffer of `width` tokens
  (causal: position t's logits do not see the padding after it), one compile for every step."""
  seqs = [list(p) for p in prompts]
  margins = []
  state = _state(config, params)
  for _ in range(new_tokens):
    buf = np.zeros((len(seqs), width), np.int64)
    for i, s in enumerate(seqs):
      buf[i, :len(s)] = s
    logits = _ours(config, params, buf, state=state)
    for i, s in enumerate(seqs):
      row = np.sort(logits[i, len(s) - 1])
      margins.append(row[-1] - row[-2])
      s.append(int(np.argmax(logits[i, len(s) - 1])))
  return [s[len(p):] for s, p in zip(seqs, prompts)], min(margins)


def test_greedy_continuations_equal_transformers_generate(root):
  """transformers' generate (greedy, its hybrid cache: the recurrent step and conv state) and
  our uncached greedy decoding give the same tokens, prompts of 5 and 9 tokens, 8 new tokens."""
  for kind in sorted(CLASSES):
    path, model = _saved(kind, 2, root)
    config, params = load_hf(path)
    for length in (5, 9):
      prompts = _tokens(length, (2, length))
      with torch.no_grad():
        out = model.generate(torch.tensor(prompts), attention_mask=torch.ones(2, length),
                             max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
      theirs = out[:, length:].tolist()
      ours, margin = _greedy(config, params, prompts.tolist(), 8)
      assert ours == theirs, (kind, length, f'smallest top-2 margin {margin:.2e}', ours, theirs)


# --------------------------------------------------------------------------------------------
# The released layout: multimodal Qwen3.5, fused experts, the MTP head
# --------------------------------------------------------------------------------------------

def _tensors(path) -> dict:
  files = safetensors_io.open_checkpoint(path)
  return {n: np.array(f.get(n)) for n, f in files.items()}


def _write_dir(src, dst, tensors: dict):
  """`dst`: `src`'s files but its weights, which are `tensors` (one model.safetensors)."""
  os.makedirs(dst)
  for name in os.listdir(src):
    if not name.endswith('.safetensors') and name != safetensors_io.INDEX_FILE:
      shutil.copy(os.path.join(src, name), dst)
  safetensors_io.write_file(os.path.join(dst, 'model.safetensors'),
                            [(n, a.shape, a.dtype, lambda a=a: a) for n, a in tensors.items()],
                            {'format': 'pt'})


def _as_release(tensors: dict, experts: int) -> dict:
  """The Qwen3.5 MoE release's layout: each layer's experts fused (experts.gate_up_proj
  [E, 2I, D], experts.down_proj [E, D, I]), and a multi-token-prediction head (mtp.*)."""
  out = {}
  for name, a in tensors.items():
    if '.mlp.experts.0.' in name:
      base = name[:name.index('.mlp.experts.')] + '.mlp.experts.'
      if name.endswith('gate_proj.weight'):
        out[base + 'gate_up_proj'] = np.stack([np.concatenate(
            [tensors[f'{base}{e}.gate_proj.weight'], tensors[f'{base}{e}.up_proj.weight']])
            for e in range(experts)])
      elif name.endswith('down_proj.weight'):
        out[base + 'down_proj'] = np.stack([tensors[f'{base}{e}.down_proj.weight']
                                            for e in range(experts)])
    elif '.mlp.experts.' not in name:
      out[name] = a
  rng = np.random.default_rng(0)
  out.update({'mtp.fc.weight': rng.standard_normal((32, 64), np.float32),
              'mtp.layers.0.input_layernorm.weight': rng.standard_normal(32, np.float32),
              'mtp.norm.weight': rng.standard_normal(32, np.float32)})
  return out


@pytest.mark.parametrize('kind', ['qwen3_5', 'qwen3_5_moe'])
def test_import_of_a_multimodal_release_reads_the_language_model(kind, root):
  """A Qwen3_5(Moe)ForConditionalGeneration checkpoint (model.language_model.*, model.visual.*),
  in the release's layout (fused experts, an mtp.* head), which transformers itself loads to the
  same logits: the import holds the language model, its logits on text equal transformers', and
  config.hf.skipped names the vision tower and the MTP head."""
  model = _multimodal_model(kind, 3)
  saved = os.path.join(root, f'{kind}_multimodal_saved')
  model.save_pretrained(saved)
  tensors = _tensors(saved)
  assert any(n.startswith('model.language_model.layers.') for n in tensors)
  assert any(n.startswith('model.visual.') for n in tensors)
  release = os.path.join(root, f'{kind}_release')
  _write_dir(saved, release, _as_release(tensors, MOE['num_experts']))
  tokens = _tokens(3, (2, 21))
  ref = _hf_logits(model, tokens)
  reloaded = type(model).from_pretrained(release, dtype=torch.float32).eval()
  np.testing.assert_array_equal(_hf_logits(reloaded, tokens), ref)   # transformers reads it so
  config, params = load_hf(release)
  assert _rel(_ours(config, params, tokens), ref) < TOLERANCE
  assert 'vision tower' in config.hf.skipped and 'multi-token-prediction' in config.hf.skipped
  assert config.model.moe.num_experts == (MOE['num_experts'] if kind == 'qwen3_5_moe' else 0)


# --------------------------------------------------------------------------------------------
# Export: transformers loads it and computes the same logits
# --------------------------------------------------------------------------------------------

def _raw(path) -> dict:
  files = safetensors_io.open_checkpoint(path)
  return {n: (f.entries[n]['dtype'], f.shape(n), f.get(n).tobytes()) for n, f in files.items()}


@pytest.mark.parametrize('kind', sorted(CLASSES))
def test_import_export_is_the_same_checkpoint_and_transformers_loads_it(kind, root, tmp_path):
  """import -> export: the same tensors bit for bit (transformers' own per-expert layout), a
  config.json that transformers reads as the source's, and the loaded model's logits equal the
  source model's."""
  path, model = _saved(kind, 0, root)
  config, params = load_hf(path)
  info = save_hf(config, params, tmp_path / 'out')
  assert info['format'] == model.config.model_type
  assert _raw(tmp_path / 'out') == _raw(path)
  loaded, report = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / 'out', dtype=torch.float32, output_loading_info=True)
  assert not any(report.values()), report
  assert type(loaded) is type(model)
  ignore = {'transformers_version', 'dtype', '_name_or_path', 'architectures'}
  theirs = {k: v for k, v in model.config.to_dict().items() if k not in ignore}
  ours = {k: v for k, v in loaded.config.to_dict().items() if k not in ignore}
  assert {k: (v, ours.get(k)) for k, v in theirs.items() if ours.get(k) != v} == {}
  tokens = _tokens(4, (2, 21))
  np.testing.assert_array_equal(_hf_logits(loaded.eval(), tokens), _hf_logits(model, tokens))


def test_export_of_a_multimodal_release_is_its_text_model(root, tmp_path):
  """An imported Qwen3.5 MoE release exports as Qwen3_5MoeForCausalLM (the language model it
  read), whose logits equal the multimodal model's on text."""
  model = _multimodal_model('qwen3_5_moe', 3)
  release = os.path.join(root, 'qwen3_5_moe_release')
  if not os.path.isdir(release):
    test_import_of_a_multimodal_release_reads_the_language_model('qwen3_5_moe', root)
  config, params = load_hf(release)
  assert save_hf(config, params, tmp_path / 'out')['format'] == 'qwen3_5_moe_text'
  loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'out',
                                                             dtype=torch.float32).eval()
  assert type(loaded).__name__ == 'Qwen3_5MoeForCausalLM'
  tokens = _tokens(5, (2, 21))
  assert _rel(_hf_logits(loaded, tokens), _hf_logits(model, tokens)) < TOLERANCE


def _random_params(config, seed=0) -> dict:
  """Random parameters of the run's model (from the model's own shapes): O(0.3) everywhere,
  norms' w of 1 + w too."""
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_config(config.model)
  _, state = nnx.split(nnx.eval_shape(lambda: model_lib.Transformer(cfg, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32),
                      nnx.to_pure_dict(state))


def _run_config(moe=False, gate='g1_elementwise'):
  from gated_attention.config import scales  # pylint: disable=g-import-not-at-top
  c = scales.get_config('hybrid_tiny')
  c.model.update(vocab_size=61, num_layers=8, hidden_size=32, num_heads=4, num_kv_heads=2,
                 head_dim=16, ffn_size=40, layer_types=tuple(c.model.layer_types) * 2)
  c.model.deltanet.update(num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=8)
  if gate == 'g1_elementwise':
    c.model.gate.update(position='g1', granularity='elementwise')
  if moe:
    c.model.update(ffn_size=0)
    c.model.moe.update(num_experts=4, top_k=2, expert_ffn_size=12, num_shared_experts=2,
                       shared_expert_gate=True, renormalize=False)
  return c


@pytest.mark.parametrize('moe', [False, True])
def test_a_hybrid_trained_here_exports_as_qwen3_next(moe, tmp_path):
  """A hybrid run of this code (hybrid_tiny's switches; dense, or MoE without renormalised
  top-k and two shared experts' width) exports as Qwen3NextForCausalLM, which computes our
  logits; importing the export gives the parameters back exactly."""
  config = _run_config(moe)
  params = _random_params(config, seed=5)
  info = save_hf(config, params, tmp_path / 'hf')
  assert info['format'] == 'qwen3_next'
  loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf',
                                                             dtype=torch.float32).eval()
  assert type(loaded).__name__ == 'Qwen3NextForCausalLM'
  tokens = _tokens(6, (2, 21))
  assert _rel(_ours(config, params, tokens), _hf_logits(loaded, tokens)) < TOLERANCE
  back_config, back = load_hf(tmp_path / 'hf')
  jax.tree.map(np.testing.assert_array_equal, back, params)
  for key in ('layer_types', 'deltanet', 'moe', 'rope_fraction', 'gate'):
    assert back_config.model[key] == config.model[key], key


# --------------------------------------------------------------------------------------------
# Negative controls: a wrong packing fails the comparison
# --------------------------------------------------------------------------------------------

def _kv_group_order(w, H, K, d):
  """A [q_h | g_h]-per-head q_proj [2 H d, D] re-packed as the authors' release packs it: per
  KV group, the group's G queries then its G gates."""
  G = H // K
  heads = w.reshape(H, 2, d, -1)
  return np.concatenate([np.concatenate([heads[k * G:(k + 1) * G, 0].reshape(G * d, -1),
                                         heads[k * G:(k + 1) * G, 1].reshape(G * d, -1)])
                         for k in range(K)])


@pytest.mark.parametrize('kind', ['qwen3_next', 'qwen3_5'])
def test_a_wrong_gate_packing_or_conv_order_fails_the_comparison(kind, root):
  """The same comparison fails when the checkpoint's q_proj holds the gate in the authors' per-KV-
  group packing instead of [q_h | g_h], or the conv's channels are k | q | v, or its taps are
  reversed: the test above could have caught each."""
  path, model = _saved(kind, 0, root)
  tokens = _tokens(9, (2, 21))
  ref = _hf_logits(model, tokens)
  tensors = _tensors(path)
  H, K, d, Kh, dk = 4, 2, 16, 2, 8
  changes = {
      'kv_group packing': lambda n, a: (_kv_group_order(a, H, K, d)
                                        if n.endswith('self_attn.q_proj.weight') else a),
      'conv k | q | v': lambda n, a: (np.concatenate([a[Kh * dk:2 * Kh * dk], a[:Kh * dk],
                                                      a[2 * Kh * dk:]])
                                      if n.endswith('conv1d.weight') else a),
      'conv taps reversed': lambda n, a: a[..., ::-1] if n.endswith('conv1d.weight') else a,
  }
  for label, change in changes.items():
    wrong = os.path.join(root, f'{kind}_{label.replace(" ", "_").replace("|", "")}')
    if not os.path.isdir(wrong):
      _write_dir(path, wrong, {n: np.ascontiguousarray(change(n, a)) for n, a in tensors.items()})
    config, params = load_hf(wrong)
    rel = _rel(_ours(config, params, tokens), ref)
    assert rel > 100 * TOLERANCE, f'{kind}, {label}: {rel:.2e} passes the comparison'


# --------------------------------------------------------------------------------------------
# Refusals: the field named, nothing read
# --------------------------------------------------------------------------------------------

def _with_config(src, dst, **changes):
  shutil.copytree(src, dst)
  with open(os.path.join(dst, 'config.json')) as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(os.path.join(dst, 'config.json'), 'w') as f:
    json.dump(cfg, f)
  return dst


@pytest.mark.parametrize('changes,field', [
    (dict(decoder_sparse_step=2), 'decoder_sparse_step'),
    (dict(mlp_only_layers=[1]), 'mlp_only_layers'),
    (dict(attention_bias=True), 'attention_bias'),
    (dict(hidden_act='gelu'), 'hidden_act'),
    (dict(attn_output_gate=False), 'attn_output_gate'),
    (dict(shared_expert_intermediate_size=18), 'shared_expert_intermediate_size'),
    (dict(linear_num_value_heads=3), 'linear_num_value_heads'),
    (dict(layer_types=['full_attention'] * 7), 'layer_types'),
    (dict(rope_parameters=dict(rope_type='linear', factor=2.0, rope_theta=1e4)), 'rope'),
])
def test_import_refuses_naming_the_field(changes, field, root, tmp_path):
  path, _ = _saved('qwen3_next', 0, root)
  with pytest.raises(HFFormatError, match=field):
    load_hf(_with_config(path, tmp_path / 'bad', **changes))


def test_import_refuses_a_multimodal_config_without_text_config_and_unknown_tensors(root,
                                                                                     tmp_path):
  path, _ = _saved('qwen3_5', 0, root)
  with pytest.raises(HFFormatError, match='text_config'):
    load_hf(_with_config(path, tmp_path / 'mm', model_type='qwen3_5',
                         architectures=['Qwen3_5ForConditionalGeneration']))
  tensors = _tensors(path)
  tensors['model.layers.0.linear_attn.extra.weight'] = np.zeros(3, np.float32)
  _write_dir(path, tmp_path / 'extra', tensors)
  with pytest.raises(HFFormatError, match='linear_attn.extra'):
    load_hf(tmp_path / 'extra')
  del tensors['model.layers.0.linear_attn.extra.weight']
  del tensors['model.layers.3.self_attn.q_norm.weight']
  _write_dir(path, tmp_path / 'missing', tensors)
  with pytest.raises(HFFormatError, match='lacks'):
    load_hf(tmp_path / 'missing')


@pytest.mark.parametrize('changes,field', [
    (dict(gate='baseline'), 'gate.position'),
    (dict(norm_zero_centered=False), 'norm_zero_centered'),
    (dict(shared_expert_gate=False), 'moe.shared_expert_gate'),
])
def test_export_refuses_what_no_hybrid_class_computes(changes, field, tmp_path):
  config = _run_config(moe='shared_expert_gate' in changes, gate=changes.get('gate', 'g1_elementwise'))
  if 'norm_zero_centered' in changes:
    config.model.norm_zero_centered = False
  if 'shared_expert_gate' in changes:
    config.model.moe.shared_expert_gate = False
  with pytest.raises(HFExportError, match=field):
    save_hf(config, _random_params(config), tmp_path / 'out')
  assert not os.path.exists(tmp_path / 'out')


def test_cached_generation_of_an_import_equals_transformers_generate(root):
  """--mode=sample's Generator (the hybrid cache: KV caches, conv and recurrent states, prompts of
  two lengths right-padded into one batch) continues an imported Qwen3-Next greedily with exactly
  transformers' generate's tokens."""
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  path, model = _saved('qwen3_next', 2, root)
  config, params = load_hf(path)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_lib.Transformer(
      ModelConfig.from_config(config.model), rngs=nnx.Rngs(0))))
  gen = generate.Generator(nnx.merge(graphdef, _state(config, params)), max_len=32)
  prompts = [_tokens(5, (1, 5))[0].tolist(), _tokens(9, (1, 9))[0].tolist()]
  ours = gen.generate(prompts, max_new_tokens=8, temperature=0.0).tokens
  for prompt, tokens in zip(prompts, ours):
    with torch.no_grad():
      out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                           max_new_tokens=8, min_new_tokens=8, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert list(tokens) == out[0, len(prompt):].tolist(), (prompt, tokens)


# --------------------------------------------------------------------------------------------
# The paper's questions of a hybrid: the analysis of an import against transformers' own tensors
# --------------------------------------------------------------------------------------------

def test_analysis_of_an_imported_hybrid_equals_transformers_tensors(root):
  """inspect (what --mode=analyze pools) of an imported Qwen3.5: F-Attn per head of each attention
  layer == transformers' attention probabilities (eager, output_attentions), the gate score ==
  the mean of sigmoid of its q_proj's gate half, the DeltaNet output-gate statistics == SiLU of
  its in_proj_z output, one row per attention / DeltaNet layer, in layer order."""
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  path, model = _saved('qwen3_5', 0, root)
  config, params = load_hf(path)
  tokens = _tokens(11, (2, 21))
  captured = {'gate': [], 'z': []}
  hooks = []
  for layer in model.model.layers:
    if hasattr(layer, 'self_attn'):
      hooks.append(layer.self_attn.q_proj.register_forward_hook(
          lambda m, i, o: captured['gate'].append(o.view(*o.shape[:2], -1, 32)[..., 16:])))
    else:
      hooks.append(layer.linear_attn.in_proj_z.register_forward_hook(
          lambda m, i, o: captured['z'].append(o)))
  model.config._attn_implementation = 'eager'  # pylint: disable=protected-access
  with torch.no_grad():
    out = model(torch.tensor(tokens), output_attentions=True)
  for h in hooks:
    h.remove()
  probs = [a.numpy() for a in out.attentions if a is not None]
  assert len(probs) == 2
  ref_f_attn = np.stack([p[:, :, 1:, 0].mean(axis=(0, 2)) for p in probs])
  ref_gate = np.array([torch.sigmoid(g).mean().item() for g in captured['gate']])
  silu = [torch.nn.functional.silu(z).numpy() for z in captured['z']]
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_lib.Transformer(
      ModelConfig.from_config(config.model), rngs=nnx.Rngs(0))))
  _, stats = jax.jit(lambda s, t: model_lib.inspect(nnx.merge(graphdef, s), t))(
      _state(config, params), jnp.asarray(tokens))
  np.testing.assert_allclose(stats['f_attn_H'], ref_f_attn, atol=1e-5)
  np.testing.assert_allclose(stats['gate']['mean'], ref_gate, atol=1e-5)
  np.testing.assert_allclose(stats['linear_gate']['mean'], [s.mean() for s in silu], atol=1e-5)
  np.testing.assert_allclose(stats['linear_gate']['abs_mean'], [np.abs(s).mean() for s in silu],
                             atol=1e-5)
  np.testing.assert_allclose(stats['linear_gate']['frac_abs_below_0.1'],
                             [(np.abs(s) < 0.1).mean() for s in silu], atol=1e-6)
  assert stats['m_act']['ffn_residual']['max'].shape == (8,)


@pytest.mark.slow
def test_import_of_a_release_and_its_analysis_from_the_command_line(root, tmp_path):
  """main.py --mode=import of a multimodal Qwen3.5 MoE release prints what it left in one line;
  --mode=analyze of the import writes a report per attention layer (layers 3 and 7), the
  DeltaNet layers' output gate and linear_gate.png."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  release = os.path.join(root, 'qwen3_5_moe_release')
  if not os.path.isdir(release):
    test_import_of_a_multimodal_release_reads_the_language_model('qwen3_5_moe', root)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = lambda *args: subprocess.run([sys.executable, 'main.py', *args], cwd=repo,  # noqa: E731
                                     capture_output=True, text=True, timeout=600)
  done = run('--mode=import', f'--hf={release}', f'--workdir={tmp_path / "run"}')
  assert done.returncode == 0, done.stderr[-2000:]
  line = [l for l in done.stdout.splitlines() if l.startswith('Not imported')]
  assert len(line) == 1 and 'vision tower' in line[0] and 'multi-token-prediction' in line[0]
  done = run('--mode=analyze', f'--workdir={tmp_path / "run"}', '--config.data.source=synthetic',
             '--config.data.task=bigram_backcopy', '--config.data.synthetic.vocab=32',
             '--config.data.seq_len=32', '--config.train.batch_size=2',
             '--config.data.val_batches=1')
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'DeltaNet output gate' in done.stdout and 'attention layers [3, 7]' in done.stdout
  with open(tmp_path / 'run' / 'analysis' / 'report.json') as f:
    report = json.load(f)
  assert report['attention_layers'] == [3, 7] and report['num_layers'] == 8
  assert len(report['f_attn']) == 2 and len(report['gate']['mean']) == 2
  assert len(report['linear_gate']['mean']) == 6 and len(report['m_act']['ffn_residual']) == 8
  assert 'linear_gate.png' in report['figures']


def test_import_of_a_hybrid_from_object_storage(root, gcs, tmp_path, capsys):
  """--mode=import --hf=gs://...: a Qwen3-Next directory (sharded: transformers' index and two
  files) on object storage imports to the parameters of the local directory's import."""
  import types  # pylint: disable=g-import-not-at-top
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  from gated_attention.modes import hf_import  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  _, model = _saved('qwen3_next', 1, root)
  sharded = tmp_path / 'sharded'
  model.save_pretrained(sharded, max_shard_size='100KB')
  assert os.path.isfile(sharded / safetensors_io.INDEX_FILE)
  storage.upload_tree(str(sharded), gcs.url('models/next'))
  hf_import.main(types.SimpleNamespace(hf=gcs.url('models/next'), workdir=str(tmp_path / 'run'),
                                       overrides={}))
  assert json.loads(capsys.readouterr().out.split('\nNote')[0])['source'] == gcs.url(
      'models/next')
  _, local = load_hf(sharded)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(
      rundir.load_run(str(tmp_path / 'run')).params), local)


@pytest.mark.parametrize('config_cls,text,scale', [
    ('Qwen3NextConfig', None, 'qwen3_next_80b_a3b'),
    ('Qwen3_5MoeConfig', None, 'qwen3_5_35b_a3b'),
    ('Qwen3_5Config', dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=24,
                           num_key_value_heads=4, intermediate_size=17408,
                           linear_num_value_heads=48), 'qwen3_5_27b'),
])
def test_an_import_of_a_published_shape_names_its_scale(config_cls, text, scale, tmp_path):
  """config.json of Qwen3-Next-80B-A3B, Qwen3.5-35B-A3B (multimodal) and Qwen3.5-27B (its
  text_config; transformers' defaults are the first two's shapes) reads as that scale, with its
  analysis on one sequence of one batch (no weights read)."""
  from gated_attention.config import scales  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import read_hf_config  # pylint: disable=g-import-not-at-top
  kwargs = {} if text is None else {'text_config': text}
  getattr(transformers, config_cls)(**kwargs).save_pretrained(tmp_path)
  config = read_hf_config(str(tmp_path))
  assert config.scale == scale
  assert (config.analysis.batch_size, config.analysis.num_batches) == (1, 1)
  want = scales.model_config(scale)
  for key in ('num_layers', 'hidden_size', 'num_heads', 'head_dim', 'vocab_size', 'ffn_size'):
    assert config.model[key] == want[key], key
  assert tuple(config.model.layer_types) == tuple(want.layer_types)
