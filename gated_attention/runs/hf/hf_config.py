"""A Hugging Face Qwen3 `config.json` <-> the project's run config (gated_attention/config/).

Import accepts `model_type: qwen3`: stock Qwen3 (the baseline) and the authors' gated Qwen3
(`headwise_attn_output_gate` / `elementwise_attn_output_gate`, their `use_qk_norm`, `qkv_bias`).
Refused, naming the field: biases, sliding windows, activations other than SiLU, RoPE types
other than default and YaRN (with HF's default beta_fast=32, beta_slow=1 and attention factor),
partial rotary embeddings, MoE and any other model type or architecture class.
`attention_dropout` is a training setting of HF's model: it is read and ignored.
"""

import json
import math
import os

import ml_collections
import numpy as np

from gated_attention.config import scales
from gated_attention.runs.hf.errors import HFExportError, HFFormatError
from gated_attention.runs.hf.layout import Dims

ARCHITECTURE = 'Qwen3ForCausalLM'
GATE_KEYS = {'headwise': 'headwise_attn_output_gate', 'elementwise': 'elementwise_attn_output_gate'}
# The authors' remote code (modeling_qwen3.py / configuration_qwen3.py, copied into the directory).
AUTO_MAP = {'AutoConfig': 'configuration_qwen3.Qwen3Config',
            'AutoModelForCausalLM': 'modeling_qwen3.Qwen3ForCausalLM'}
# Keys of an imported config.json that export writes back unchanged (tokens, cache, sizes).
PASSTHROUGH = ('bos_token_id', 'eos_token_id', 'pad_token_id', 'max_position_embeddings',
               'max_window_layers', 'use_cache', 'sliding_window')


def _refuse(field: str, value, why: str):
  raise HFFormatError(f'config.json: {field}={json.dumps(value)}: {why}')


def rope_params(hf: dict) -> tuple[float, dict]:
  """(rope_theta, the rope_scaling dict or {}) from the v4 (rope_theta, rope_scaling) or the v5
  (rope_parameters) spelling."""
  rp = hf.get('rope_parameters')
  if isinstance(rp, dict) and rp and 'rope_type' not in rp and 'type' not in rp:
    if set(rp) != {'full_attention'}:
      _refuse('rope_parameters', rp, 'per-layer-type RoPE is not supported (one RoPE for all '
              'layers only).')
    rp = rp['full_attention']
  if rp:
    return float(rp.get('rope_theta', hf.get('rope_theta', 10_000.0))), dict(rp)
  return float(hf.get('rope_theta', 10_000.0)), dict(hf.get('rope_scaling') or {})


def rope_from_hf(hf: dict) -> tuple[float, dict]:
  """(rope_base, config.model.rope_scaling) from config.json."""
  theta, rs = rope_params(hf)
  if float(rs.get('partial_rotary_factor', hf.get('partial_rotary_factor', 1.0))) != 1.0:
    _refuse('partial_rotary_factor', hf.get('partial_rotary_factor', rs.get(
        'partial_rotary_factor')), 'RoPE on part of head_dim is not supported.')
  kind = rs.get('rope_type', rs.get('type', 'default'))
  if kind == 'default':
    return theta, dict(type='none', factor=1.0, original_max_len=4096)
  if kind != 'yarn':
    _refuse('rope_scaling.rope_type', kind, 'only default RoPE and YaRN are supported '
            '(gated_attention/model/rope.py).')
  orig = rs.get('original_max_position_embeddings') or hf.get('max_position_embeddings')
  factor = rs.get('factor') or hf['max_position_embeddings'] / orig
  default_attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
  for key, ok in (('beta_fast', (None, 32)), ('beta_slow', (None, 1)), ('mscale', (None, 0, 1)),
                  ('mscale_all_dim', (None, 0)), ('truncate', (None, True))):
    if rs.get(key) not in ok:
      _refuse(f'rope_scaling.{key}', rs.get(key), f'YaRN is implemented with {key} in '
              f'{[v for v in ok if v is not None]} only (gated_attention/model/rope.py).')
  if rs.get('attention_factor') is not None and not math.isclose(rs['attention_factor'],
                                                                 default_attention):
    _refuse('rope_scaling.attention_factor', rs['attention_factor'],
            f'YaRN is implemented with the default 0.1 ln(factor) + 1 = {default_attention} only.')
  return theta, dict(type='yarn', factor=float(factor), original_max_len=int(orig))


def gate_from_hf(hf: dict) -> str:
  """'none' (stock Qwen3), 'headwise' or 'elementwise' (the authors' G1 gate)."""
  on = [g for g, key in GATE_KEYS.items() if hf.get(key)]
  if len(on) > 1:
    _refuse(GATE_KEYS['elementwise'], True, f'and {GATE_KEYS["headwise"]} are both true; the '
            'authors\' model uses one of them (set the other to false).')
  return on[0] if on else 'none'


def _positive_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _token_id(v) -> bool:
  return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or (
      isinstance(v, list) and all(_token_id(x) and x is not None for x in v))


# The optional config.json fields the import reads, with what each must hold when present: a
# string where a number belongs would otherwise fail deep inside with a TypeError, or be taken
# silently (bool('false') is True).
_OPTIONAL = {
    'num_key_value_heads': (lambda v: v is None or _positive_int(v), 'a positive integer'),
    'head_dim': (lambda v: v is None or _positive_int(v), 'a positive integer'),
    'max_position_embeddings': (lambda v: v is None or _positive_int(v), 'a positive integer'),
    'rms_norm_eps': (lambda v: _number(v) and v > 0, 'a positive number'),
    'rope_theta': (lambda v: _number(v) and v > 0, 'a positive number'),
    'initializer_range': (lambda v: _number(v) and v >= 0, 'a number'),
    'tie_word_embeddings': (lambda v: isinstance(v, bool), 'true or false'),
    'use_qk_norm': (lambda v: isinstance(v, bool), 'true or false'),
    'elementwise_attn_output_gate': (lambda v: isinstance(v, bool), 'true or false'),
    'headwise_attn_output_gate': (lambda v: isinstance(v, bool), 'true or false'),
    'rope_scaling': (lambda v: v is None or isinstance(v, dict), 'an object or null'),
    'bos_token_id': (_token_id, 'a token id (a non-negative integer) or null'),
    'eos_token_id': (_token_id, 'a token id, a list of them, or null'),
    'pad_token_id': (_token_id, 'a token id or null'),
}


def _check_types(hf: dict):
  for key, (ok, want) in _OPTIONAL.items():
    if key in hf and not ok(hf[key]):
      _refuse(key, hf[key], f'{want} is required.')


def check_hf(hf: dict):
  """Refuses what the project cannot represent, naming the config.json field."""
  mt = hf.get('model_type')
  if mt != 'qwen3':
    why = ('Mixture-of-Experts checkpoints of this type are not supported'
           if 'moe' in str(mt).lower() else 'this model type is not supported')
    _refuse('model_type', mt, f'{why}; import qwen3 (stock Qwen3, or the authors\' gated '
            'Qwen3), or a hybrid: qwen3_next, qwen3_5_text, qwen3_5_moe_text, or a qwen3_5 / '
            'qwen3_5_moe release.')
  archs = hf.get('architectures') or [ARCHITECTURE]
  if archs != [ARCHITECTURE]:
    _refuse('architectures', archs, f'only {ARCHITECTURE} checkpoints (decoder + LM head) '
            'are supported.')
  if hf.get('hidden_act', 'silu') != 'silu':
    _refuse('hidden_act', hf['hidden_act'], 'the MLP is SwiGLU (silu) only.')
  for key in ('attention_bias', 'qkv_bias', 'mlp_bias'):
    if hf.get(key):
      _refuse(key, hf[key], 'the project\'s projections have no biases.')
  if hf.get('use_sliding_window'):
    _refuse('use_sliding_window', True, 'sliding-window attention is not supported (full causal '
            'attention only).')
  if any(t != 'full_attention' for t in hf.get('layer_types') or []):
    _refuse('layer_types', hf['layer_types'], 'only full_attention layers are supported.')
  for key in ('num_experts', 'num_local_experts', 'moe_intermediate_size'):
    if hf.get(key):
      _refuse(key, hf[key], 'Mixture-of-Experts checkpoints are not supported.')
  for key in ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
              'num_attention_heads'):
    if not _positive_int(hf.get(key)):
      _refuse(key, hf.get(key), 'a positive integer is required.')
  _check_types(hf)
  K = hf.get('num_key_value_heads') or hf['num_attention_heads']
  if hf['num_attention_heads'] % K:
    _refuse('num_key_value_heads', K, 'must divide num_attention_heads.')
  gate_from_hf(hf)
  rope_from_hf(hf)


def dims_from_hf(hf: dict) -> Dims:
  H = hf['num_attention_heads']
  return Dims(L=hf['num_hidden_layers'], D=hf['hidden_size'], H=H,
              K=hf.get('num_key_value_heads') or H,
              d=hf.get('head_dim') or hf['hidden_size'] // H, F=hf['intermediate_size'],
              V=hf['vocab_size'], gate=gate_from_hf(hf),
              tied=bool(hf.get('tie_word_embeddings', False)))


# An import's scale when its architecture is none of the scales' (config.scale names the truth).
IMPORTED_SCALE = 'imported'
# The architecture fields an import's model is compared on to find its scale.
_SCALE_FIELDS = {'V': 'vocab_size', 'L': 'num_layers', 'D': 'hidden_size', 'H': 'num_heads',
                 'K': 'num_kv_heads', 'd': 'head_dim', 'F': 'ffn_size', 'tied': 'tie_embeddings'}


def matching_scale(dims: Dims) -> str | None:
  """The scale (gated_attention/config/scales.py) whose dense model has `dims`' architecture
  (vocabulary, layers, widths, heads, FFN width, tied embeddings), or None. The authors' 1.7B
  release is the paper's dense_1p7b_28l."""
  return _scale_of({field: getattr(dims, k) for k, field in _SCALE_FIELDS.items()})


def _scale_of(arch: dict) -> str | None:
  for scale in scales.SCALES:
    m = scales.model_config(scale)
    hybrid = 'linear_attention' in tuple(m.get('layer_types') or ())   # Qwen3 has none
    if not m.moe.num_experts and not hybrid and all(arch[f] == m[f]
                                                     for f in _SCALE_FIELDS.values()):
      return scale
  return None


def scale_of_run(config) -> str:
  """The scale a run's model is: config.scale, except for an import (a config with an `hf`
  section), whose model is compared with the scales' (imports written before config.scale said
  so recorded 'tiny', the config they started from): its scale, or 'imported' when none has
  its architecture."""
  if ('hf' not in config or config.model.get('moe', {}).get('num_experts', 0)
      or config.model.get('layer_types')):     # a hybrid import names its scale itself
    return config.scale
  m = config.model
  return _scale_of({f: m[f] for f in _SCALE_FIELDS.values()}) or IMPORTED_SCALE


def run_config(hf: dict, model_dir: str, *, compute_dtype: str = 'float32',
               generation_config: dict | None = None) -> ml_collections.ConfigDict:
  """The run config: the architecture from config.json on the defaults of the scale that has
  that architecture (matching_scale: its data and training recipe, e.g. dense_1p7b_28l's
  4096-token sequences for the authors' 1.7B models, and its name in config.scale), or on tiny's
  with config.scale = 'imported' when no scale has it; the directory's tokenizer.json; and
  `config.hf` recording the source. An import of a paper scale is analysed on one sequence of
  one batch (config.analysis: 1 x 4096 tokens, what docs/huggingface.md measured), not on its
  training batch of 1024."""
  check_hf(hf)
  dims = dims_from_hf(hf)
  theta, scaling = rope_from_hf(hf)
  scale = matching_scale(dims)
  c = scales.get_config(scale or 'tiny')
  c.scale = scale or IMPORTED_SCALE
  if scale in scales.PAPER_SCALES:
    c.analysis.update(batch_size=1, num_batches=1)
  c.variant = 'baseline' if dims.gate == 'none' else f'g1_{dims.gate}'
  c.model.update(vocab_size=dims.V, num_layers=dims.L, hidden_size=dims.D, num_heads=dims.H,
                 num_kv_heads=dims.K, head_dim=dims.d, ffn_size=dims.F, ffn_match_baseline=False,
                 tie_embeddings=dims.tied, qk_norm=bool(hf.get('use_qk_norm', True)),
                 sandwich_norm=False, norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
                 rope_base=theta, init_std=float(hf.get('initializer_range', 0.02)),
                 dtype=compute_dtype)
  c.model.rope_scaling.update(scaling)
  if dims.gate != 'none':
    c.model.gate.update(position='g1', granularity=dims.gate)
  record_source(c, hf, model_dir, generation_config)
  return c


def record_source(c, hf: dict, model_dir: str, generation_config: dict | None):
  """An import's run config keeps its source: the directory's tokenizer.json (when it has one)
  as data.tokenizer, config.json and generation_config.json under `hf` (source_configs reads
  them back for the export)."""
  tokenizer = os.path.join(os.path.abspath(model_dir), 'tokenizer.json')
  c.data.tokenizer = tokenizer if os.path.isfile(tokenizer) else ''
  c.hf = ml_collections.ConfigDict(dict(
      source=os.path.abspath(model_dir), config_json=json.dumps(hf, sort_keys=True),
      generation_config_json=json.dumps(generation_config or {}, sort_keys=True)))


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------

_G1_ONLY = dict(kind='gate', mode='multiplicative', activation='sigmoid', input_dependent=True,
                head_shared=False)


def _unexportable(field: str, value, why: str):
  raise HFExportError(
      f'config.model.{field}={value!r}: {why} Only the baseline (stock Qwen3) and the G1 '
      'headwise / elementwise sigmoid gate (the authors\' modeling_qwen3.py) have a Hugging Face '
      'model class; this run cannot be exported.')


def check_exportable(config):
  """Refuses (HFExportError, naming the config field) what no HF model class computes."""
  m = config.model
  if m.moe.num_experts > 0:
    _unexportable('moe.num_experts', m.moe.num_experts, 'no exported class has this '
                  'project\'s MoE (Qwen3-MoE has no attention gate and other routing).')
  if m.sandwich_norm:
    _unexportable('sandwich_norm', True, 'Qwen3 has no post-sublayer norms.')
  if not m.qk_norm:
    _unexportable('qk_norm', False, 'stock Qwen3 always applies QK-norm (and would load this '
                  'model with unit q_norm/k_norm scales, silently).')
  g = m.gate
  if g.position not in ('none', 'g1'):
    _unexportable('gate.position', g.position, 'only a gate on the SDPA output (G1) exists in '
                  'the authors\' model.')
  if g.position == 'g1':
    for field, want in _G1_ONLY.items():
      if g[field] != want:
        _unexportable(f'gate.{field}', g[field], f'the authors\' G1 gate has {field}={want!r}.')
  kind = m.rope_scaling.type
  if kind not in ('none', 'yarn'):
    _unexportable('rope_scaling.type', kind, 'only none and yarn map to HF RoPE types.')


def dims_from_run(config, params) -> Dims:
  m = config.model
  try:                         # the FFN width is the parameters' (ffn_match_baseline narrows it)
    F = int(np.shape(params['blocks']['ffn']['wi_gate'])[-1])
  except (KeyError, TypeError, IndexError) as e:
    raise HFExportError('the parameters have no blocks.ffn.wi_gate kernel: pass the pure dict '
                        'of the model\'s parameters (nnx.to_pure_dict(nnx.state(model, '
                        'nnx.Param))).') from e
  gate = 'none' if m.gate.position == 'none' else m.gate.granularity
  return Dims(L=m.num_layers, D=m.hidden_size, H=m.num_heads, K=m.num_kv_heads, d=m.head_dim,
              F=F, V=m.vocab_size, gate=gate, tied=bool(m.tie_embeddings))


def source_configs(config) -> tuple[dict, dict]:
  """(source config.json, source generation_config.json) of an imported run, else ({}, {})."""
  hf = config.get('hf')
  if not hf:
    return {}, {}
  return json.loads(hf.get('config_json') or '{}'), json.loads(
      hf.get('generation_config_json') or '{}')


def hf_config(config, dims: Dims, dtype: str, *, bos_id: int | None = None) -> dict:
  """config.json for the run: stock Qwen3 for the baseline, the authors' keys for G1."""
  m = config.model
  src, _ = source_configs(config)
  out = dict(architectures=[ARCHITECTURE], model_type='qwen3', vocab_size=dims.V,
             hidden_size=dims.D, intermediate_size=dims.F, num_hidden_layers=dims.L,
             num_attention_heads=dims.H, num_key_value_heads=dims.K, head_dim=dims.d,
             hidden_act='silu', max_position_embeddings=max(config.data.seq_len, 4096),
             initializer_range=m.init_std, rms_norm_eps=m.norm_eps, use_cache=True,
             tie_word_embeddings=dims.tied, rope_theta=m.rope_base, rope_scaling=None,
             attention_bias=False, use_sliding_window=False, sliding_window=None,
             max_window_layers=dims.L, attention_dropout=0.0, torch_dtype=dtype)
  token_ids_and_source(out, src, bos_id, PASSTHROUGH)
  if m.rope_scaling.type == 'yarn':
    rs = m.rope_scaling
    out['rope_scaling'] = dict(rope_type='yarn', factor=rs.factor,
                               original_max_position_embeddings=rs.original_max_len)
    # transformers 4.x recomputes factor = max_position_embeddings / original; keep them equal.
    out['max_position_embeddings'] = int(round(rs.original_max_len * rs.factor))
  if dims.gate != 'none':
    out.update(use_qk_norm=True, qkv_bias=False, auto_map=dict(AUTO_MAP),
               headwise_attn_output_gate=dims.gate == 'headwise',
               elementwise_attn_output_gate=dims.gate == 'elementwise')
  return out


def token_ids_and_source(out: dict, src: dict, bos_id: int | None, passthrough: tuple):
  """An export's config.json `out`: the tokenizer's BOS as bos and eos, then the source's own
  values of `passthrough` (an import's), except a missing token id the tokenizer supplies."""
  if bos_id is not None:
    out.update(bos_token_id=bos_id, eos_token_id=bos_id)
  out.update({k: src[k] for k in passthrough if k in src
              and not (src[k] is None and out.get(k) is not None)})


def generation_config(config, hf_cfg: dict) -> dict:
  """generation_config.json: the imported one, else the token ids of config.json."""
  _, gen = source_configs(config)
  if gen:   # the imported one, with the token ids it lacks (transformers' generate reads them)
    return {**gen, **{k: hf_cfg[k] for k in ('bos_token_id', 'eos_token_id')
                      if gen.get(k) is None and hf_cfg.get(k) is not None}}
  out = {'_from_model_config': True}
  out.update({k: hf_cfg[k] for k in ('bos_token_id', 'eos_token_id', 'pad_token_id')
              if hf_cfg.get(k) is not None})
  return out
