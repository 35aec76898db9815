"""Qwen3-Next and Qwen3.5 `config.json` <-> the project's run config (beyond the paper: the
hybrids that ship its G1 elementwise gate; docs/hybrid.md).

Import reads the text models (`model_type` qwen3_next, qwen3_5_text, qwen3_5_moe_text) and the
released Qwen3.5 checkpoints, which are multimodal (`qwen3_5` / `qwen3_5_moe`: the language model's
settings under `text_config`, its weights under `model.language_model.`; the vision tower and
the multi-token-prediction head are not read, hybrid_layout.skipped). The architecture becomes
`config.model` with the hybrid switches (model/config.py): `layer_types`, `deltanet`,
`rope_fraction` (partial_rotary_factor, 0.25 when absent, as transformers), `norm_zero_centered`
(every RMSNorm but the DeltaNet's gated one stores w of 1 + w), the G1 elementwise sigmoid gate
packed `[q_h | g_h]` per head (`gate.packing='head'`) and, for the MoE models, routed experts
plus one sigmoid-gated shared expert of `shared_expert_intermediate_size`
(= num_shared_experts x moe_intermediate_size). Text positions only: Qwen3.5's multimodal RoPE
(mrope_section) rotates every section by the same position when all three position ids are the
token's, which is plain RoPE (what the language model sees on text).

Refused, naming the field: biases, non-SiLU MLPs, `attn_output_gate: false`, RoPE types other
than default / YaRN, Qwen3-Next's mixed dense / MoE layers (decoder_sparse_step != 1,
mlp_only_layers), a shared expert whose width is not a multiple of the experts'.

Export writes the text model transformers loads without remote code: Qwen3NextForCausalLM,
Qwen3_5ForCausalLM or Qwen3_5MoeForCausalLM (an import's own family, its multimodal release as
its text model; a run trained here as qwen3_next, which holds a dense or a MoE hybrid).
"""

import json

import ml_collections

from gated_attention.config import scales
from gated_attention.runs.hf import hf_config
from gated_attention.runs.hf.errors import HFExportError, HFFormatError
from gated_attention.runs.hf.hybrid_layout import HybridDims

# Text model_type -> its CausalLM class; multimodal model_type -> (text model_type, class).
TEXT_TYPES = {'qwen3_next': 'Qwen3NextForCausalLM', 'qwen3_5_text': 'Qwen3_5ForCausalLM',
              'qwen3_5_moe_text': 'Qwen3_5MoeForCausalLM'}
MULTIMODAL_TYPES = {'qwen3_5': ('qwen3_5_text', 'Qwen3_5ForConditionalGeneration'),
                    'qwen3_5_moe': ('qwen3_5_moe_text', 'Qwen3_5MoeForConditionalGeneration')}
MOE_TYPES = ('qwen3_5_moe_text',)          # always MoE; qwen3_next when num_experts > 0
TEXT_PREFIX, MULTIMODAL_PREFIX = 'model.', 'model.language_model.'
# transformers 5.24's defaults of these configs, for fields a config.json leaves out.
DEFAULTS = dict(head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                rms_norm_eps=1e-6, initializer_range=0.02, full_attention_interval=4,
                partial_rotary_factor=0.25, decoder_sparse_step=1)
PASSTHROUGH = ('bos_token_id', 'eos_token_id', 'pad_token_id', 'max_position_embeddings')


def is_hybrid(hf: dict) -> bool:
  return hf.get('model_type') in TEXT_TYPES or hf.get('model_type') in MULTIMODAL_TYPES


def _refuse(field: str, value, why: str):
  raise HFFormatError(f'config.json: {field}={json.dumps(value)}: {why}')


def text_config(hf: dict) -> tuple[dict, str, str]:
  """(the language model's settings, its text model_type, the prefix of its weights). A
  multimodal release's `text_config`, with the top level's tie_word_embeddings (transformers
  ties the composite model's head by it) and token ids where the text config lacks them."""
  mt = hf.get('model_type')
  if mt in TEXT_TYPES:
    return hf, mt, TEXT_PREFIX
  text = hf.get('text_config')
  if not isinstance(text, dict):
    _refuse('text_config', text, f'a {mt} (multimodal) config.json holds the language model\'s '
            'settings in a text_config object.')
  text = dict(text)
  family = MULTIMODAL_TYPES[mt][0]
  if text.setdefault('model_type', family) != family:
    _refuse('text_config.model_type', text['model_type'], f'a {mt} release\'s language model is '
            f'{family}.')
  text['tie_word_embeddings'] = bool(hf.get('tie_word_embeddings', False))
  for key in ('bos_token_id', 'eos_token_id', 'pad_token_id'):
    if text.get(key) is None and hf.get(key) is not None:
      text[key] = hf[key]
  return text, family, MULTIMODAL_PREFIX


def _get(text: dict, key: str):
  """text[key], or transformers' default when it is absent or null."""
  value = text.get(key)
  return DEFAULTS.get(key) if value is None else value


def layer_types(text: dict) -> tuple:
  L = text.get('num_hidden_layers')
  types = text.get('layer_types')
  if types is None:
    interval = _get(text, 'full_attention_interval')
    types = ['linear_attention' if (i + 1) % interval else 'full_attention' for i in range(L)]
  if not isinstance(types, list) or len(types) != L or not set(types) <= {
      'full_attention', 'linear_attention'}:
    _refuse('layer_types', types, f'one entry per layer ({L}), each full_attention or '
            'linear_attention.')
  return tuple(types)


def rope(text: dict) -> tuple[float, dict, float]:
  """(rope_base, config.model.rope_scaling, rope_fraction): hf_config's RoPE (default or YaRN)
  on the rotated part, partial_rotary_factor the fraction."""
  _, rp = hf_config.rope_params(text)
  fraction = rp.get('partial_rotary_factor', text.get('partial_rotary_factor'))
  fraction = DEFAULTS['partial_rotary_factor'] if fraction is None else fraction
  if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
    _refuse('partial_rotary_factor', fraction, 'a number in (0, 1] is required.')
  plain = {k: v for k, v in text.items() if k != 'partial_rotary_factor'}
  for key in ('rope_parameters', 'rope_scaling'):
    if isinstance(plain.get(key), dict):
      plain[key] = {k: v for k, v in plain[key].items()
                    if k not in ('partial_rotary_factor', 'mrope_section', 'mrope_interleaved')}
  theta, scaling = hf_config.rope_from_hf(plain)
  return theta, scaling, float(fraction)


def _positive(text: dict, key: str) -> int:
  v = _get(text, key)
  if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
    _refuse(key, v, 'a positive integer is required.')
  return v


def dims_from_hf(hf: dict, *, fused_experts: bool = False) -> HybridDims:
  """The checkpoint's shapes (validates what the project cannot represent, naming the field)."""
  mt = hf.get('model_type')
  if not is_hybrid(hf):
    _refuse('model_type', mt, f'not one of {", ".join(list(TEXT_TYPES) + list(MULTIMODAL_TYPES))}.')
  text, family, prefix = text_config(hf)
  expected = MULTIMODAL_TYPES[mt][1] if mt in MULTIMODAL_TYPES else TEXT_TYPES[mt]
  archs = hf.get('architectures') or [expected]
  if archs != [expected]:
    _refuse('architectures', archs, f'a {mt} checkpoint is read as {expected} (decoder + LM '
            'head) only.')
  if text.get('hidden_act', 'silu') != 'silu':
    _refuse('hidden_act', text['hidden_act'], 'the MLPs are SwiGLU (silu) only.')
  for key in ('attention_bias', 'mlp_bias'):
    if text.get(key):
      _refuse(key, text[key], 'the project\'s projections have no biases.')
  if text.get('attn_output_gate') is False:
    _refuse('attn_output_gate', False, 'the attention layers are read with the G1 elementwise '
            'output gate that transformers\' Qwen3-Next / Qwen3.5 always apply.')
  H, L = _positive(text, 'num_attention_heads'), _positive(text, 'num_hidden_layers')
  K = text.get('num_key_value_heads') or H
  if not isinstance(K, int) or H % K:
    _refuse('num_key_value_heads', K, f'must divide num_attention_heads={H}.')
  Kh, Hv = _positive(text, 'linear_num_key_heads'), _positive(text, 'linear_num_value_heads')
  if Hv % Kh:
    _refuse('linear_num_value_heads', Hv, f'must be a multiple of linear_num_key_heads={Kh}.')
  eps = _get(text, 'rms_norm_eps')
  if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
    _refuse('rms_norm_eps', eps, 'a positive number is required.')
  rope(text)
  moe = family in MOE_TYPES or (family == 'qwen3_next' and (text.get('num_experts') or 0) > 0)
  E = topk = I = S = F = 0
  renormalize = True
  if moe:
    E, topk = _positive(text, 'num_experts'), _positive(text, 'num_experts_per_tok')
    I, S = _positive(text, 'moe_intermediate_size'), _positive(text, 'shared_expert_intermediate_size')
    if topk > E:
      _refuse('num_experts_per_tok', topk, f'must be at most num_experts={E}.')
    if S % I:
      _refuse('shared_expert_intermediate_size', S, f'the shared expert is num_shared_experts x '
              f'moe_intermediate_size={I} wide here: a multiple of it is required.')
    if family == 'qwen3_next':
      renormalize = bool(text.get('norm_topk_prob', True))
      if _get(text, 'decoder_sparse_step') != 1:
        _refuse('decoder_sparse_step', text['decoder_sparse_step'], 'layers alternating dense '
                'MLPs and experts are not supported (every layer\'s FFN is the same here).')
      if text.get('mlp_only_layers'):
        _refuse('mlp_only_layers', text['mlp_only_layers'], 'dense-MLP layers among MoE layers '
                'are not supported (every layer\'s FFN is the same here).')
  else:
    F = _positive(text, 'intermediate_size')
  return HybridDims(
      family=family, prefix=prefix, L=L, D=_positive(text, 'hidden_size'), H=H, K=K,
      d=_positive(text, 'head_dim'), V=_positive(text, 'vocab_size'),
      tied=bool(text.get('tie_word_embeddings', False)), layer_types=layer_types(text),
      Kh=Kh, Hv=Hv, dk=_positive(text, 'linear_key_head_dim'),
      dv=_positive(text, 'linear_value_head_dim'), W=_positive(text, 'linear_conv_kernel_dim'),
      F=F, E=E, top_k=topk, I=I, S=S, renormalize=renormalize, fused_experts=fused_experts)


# The model fields an import is compared on to find its scale (scales.HYBRID_SCALES).
_SCALE_FIELDS = ('vocab_size', 'num_layers', 'hidden_size', 'num_heads', 'num_kv_heads',
                 'head_dim', 'ffn_size', 'tie_embeddings', 'layer_types')


def _matching_scale(model: ml_collections.ConfigDict) -> str | None:
  """The hybrid scale whose model is `model`'s architecture (e.g. an import of the released
  Qwen3.5-35B-A3B is qwen3_5_35b_a3b), or None."""
  for scale in scales.HYBRID_SCALES:
    m = scales.model_config(scale)
    if (all(tuple(m[f]) == tuple(model[f]) if f == 'layer_types' else m[f] == model[f]
            for f in _SCALE_FIELDS)
        and m.deltanet.to_dict() == model.deltanet.to_dict()
        and all(m.moe[k] == model.moe[k] for k in ('num_experts', 'top_k', 'expert_ffn_size',
                                                   'num_shared_experts'))):
      return scale
  return None


def model_section(hf: dict, dims: HybridDims, compute_dtype: str) -> ml_collections.ConfigDict:
  """config.model of the import (on hybrid_tiny's defaults, every architecture field set)."""
  text, _, _ = text_config(hf)
  theta, scaling, fraction = rope(text)
  m = scales.model_config('hybrid_tiny')
  m.update(vocab_size=dims.V, num_layers=dims.L, hidden_size=dims.D, num_heads=dims.H,
           num_kv_heads=dims.K, head_dim=dims.d, ffn_size=dims.F, ffn_match_baseline=False,
           tie_embeddings=dims.tied, qk_norm=True, sandwich_norm=False,
           norm_eps=float(_get(text, 'rms_norm_eps')), rope_base=theta,
           init_std=float(_get(text, 'initializer_range')), dtype=compute_dtype,
           layer_types=dims.layer_types, rope_fraction=fraction, norm_zero_centered=True)
  m.rope_scaling.update(scaling)
  m.gate.update(position='g1', kind='gate', granularity='elementwise', head_shared=False,
                mode='multiplicative', activation='sigmoid', input_dependent=True,
                packing='head')
  m.deltanet.update(num_key_heads=dims.Kh, num_value_heads=dims.Hv, key_head_dim=dims.dk,
                    value_head_dim=dims.dv, conv_kernel=dims.W)
  if dims.E:
    m.moe.update(num_experts=dims.E, top_k=dims.top_k, expert_ffn_size=dims.I,
                 num_shared_experts=dims.S // dims.I, shared_expert_gate=True,
                 renormalize=dims.renormalize, dispatch='dropless')
  return m


def run_config(hf: dict, model_dir: str, dims: HybridDims, *, compute_dtype: str = 'float32',
               generation_config: dict | None = None) -> ml_collections.ConfigDict:
  """The run config of an import: the architecture from config.json (model_section) on the
  defaults of the hybrid scale that has it (its data and training recipe; a published shape is
  analysed on one sequence of one batch), or on hybrid_tiny's with config.scale 'imported'."""
  model = model_section(hf, dims, compute_dtype)
  scale = _matching_scale(model)
  c = scales.get_config(scale or 'hybrid_tiny')
  c.scale = scale or hf_config.IMPORTED_SCALE
  if scale in scales.PUBLISHED_HYBRIDS:
    c.analysis.update(batch_size=1, num_batches=1)
  c.variant = 'g1_elementwise'
  c.model = model
  hf_config.record_source(c, hf, model_dir, generation_config)
  return c


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------

_GATE = dict(position='g1', kind='gate', granularity='elementwise', mode='multiplicative',
             activation='sigmoid', input_dependent=True, head_shared=False)


def is_hybrid_run(config) -> bool:
  """A run exported in the Qwen3-Next / Qwen3.5 format: one with a layer pattern, or a gate
  packed [q_h | g_h] per head."""
  m = config.model
  return bool(m.get('layer_types')) or m.gate.get('packing', 'kv_group') == 'head'


def _unexportable(field: str, value, why: str):
  raise HFExportError(
      f'config.model.{field}={value!r}: {why} A hybrid is exported as transformers\' Qwen3-Next '
      '/ Qwen3.5, whose attention layers carry the G1 elementwise sigmoid gate, with QK-norm and '
      'zero-centred RMSNorms; this run cannot be exported.')


def check_exportable(config):
  """Refuses (HFExportError, naming the config field) what Qwen3-Next / Qwen3.5 do not compute."""
  m = config.model
  for field, want in _GATE.items():
    if m.gate[field] != want:
      _unexportable(f'gate.{field}', m.gate[field], f'their attention gate has {field}={want!r}'
                    + (' (an ungated attention layer exists in no such class).'
                       if field == 'position' else '.'))
  for field, want in (('qk_norm', True), ('norm_zero_centered', True), ('sandwich_norm', False)):
    if bool(m[field]) != want:
      _unexportable(field, m[field], f'Qwen3-Next / Qwen3.5 have {field}={want}.')
  if m.moe.num_experts and not (m.moe.num_shared_experts and m.moe.shared_expert_gate):
    _unexportable('moe.shared_expert_gate', m.moe.shared_expert_gate, 'their MoE adds one '
                  'sigmoid-gated shared expert (num_shared_experts >= 1, shared_expert_gate).')
  if m.rope_scaling.type not in ('none', 'yarn'):
    _unexportable('rope_scaling.type', m.rope_scaling.type, 'only none and yarn map to HF.')


def _source_text(config) -> tuple[dict, str | None]:
  """(the imported language model's settings, its text model_type), or ({}, None)."""
  src, _ = hf_config.source_configs(config)
  if not src or not is_hybrid(src):
    return {}, None
  text, family, _ = text_config(src)
  return text, family


def dims_from_run(config, params) -> HybridDims:
  m = config.model
  _, family = _source_text(config)
  moe = bool(m.moe.num_experts)
  if family is None or (family == 'qwen3_5_moe_text' and not m.moe.renormalize):
    family = 'qwen3_next'
  elif family.startswith('qwen3_5'):
    family = 'qwen3_5_moe_text' if moe else 'qwen3_5_text'
  try:
    ffn = params['blocks']
    ffn = (ffn['layer_0'] if 'layer_0' in ffn else ffn)['ffn']
    F = 0 if moe else int(ffn['wi_gate'].shape[-1])
  except (KeyError, TypeError, AttributeError) as e:
    raise HFExportError('the parameters have no blocks[.layer_0].ffn: pass the pure dict of the '
                        'model\'s parameters (nnx.to_pure_dict(nnx.state(model, '
                        'nnx.Param))).') from e
  types = tuple(m.layer_types) or ('full_attention',) * m.num_layers
  dn = m.deltanet
  I = m.moe.expert_ffn_size if moe else 0
  return HybridDims(
      family=family, prefix=TEXT_PREFIX, L=m.num_layers, D=m.hidden_size, H=m.num_heads,
      K=m.num_kv_heads, d=m.head_dim, V=m.vocab_size, tied=bool(m.tie_embeddings),
      layer_types=types, Kh=dn.num_key_heads, Hv=dn.num_value_heads, dk=dn.key_head_dim,
      dv=dn.value_head_dim, W=dn.conv_kernel, F=F, E=m.moe.num_experts if moe else 0,
      top_k=m.moe.top_k if moe else 0, I=I, S=m.moe.num_shared_experts * I if moe else 0,
      renormalize=bool(m.moe.renormalize) if moe else True)


def hf_config_json(config, dims: HybridDims, dtype: str, *, bos_id: int | None = None) -> dict:
  """config.json of the export: the text model of dims.family, transformers 5's spelling."""
  m = config.model
  src, _ = _source_text(config)
  rope_parameters = dict(rope_type='default', rope_theta=m.rope_base,
                         partial_rotary_factor=m.rope_fraction)
  src_rope = src.get('rope_parameters') if isinstance(src.get('rope_parameters'), dict) else {}
  rope_parameters.update({k: src_rope[k] for k in ('mrope_section', 'mrope_interleaved')
                          if k in src_rope})
  out = dict(architectures=[TEXT_TYPES[dims.family]], model_type=dims.family,
             vocab_size=dims.V, hidden_size=dims.D, num_hidden_layers=dims.L,
             num_attention_heads=dims.H, num_key_value_heads=dims.K, head_dim=dims.d,
             hidden_act='silu', max_position_embeddings=max(config.data.seq_len, 4096),
             initializer_range=m.init_std, rms_norm_eps=m.norm_eps, use_cache=True,
             tie_word_embeddings=dims.tied, attention_bias=False, attention_dropout=0.0,
             layer_types=list(dims.layer_types), linear_conv_kernel_dim=dims.W,
             linear_key_head_dim=dims.dk, linear_value_head_dim=dims.dv,
             linear_num_key_heads=dims.Kh, linear_num_value_heads=dims.Hv, dtype=dtype)
  if dims.E:
    out.update(num_experts=dims.E, num_experts_per_tok=dims.top_k,
               moe_intermediate_size=dims.I, shared_expert_intermediate_size=dims.S,
               router_aux_loss_coef=m.moe.lb_loss_coef, output_router_logits=False)
    if dims.family == 'qwen3_next':
      out.update(norm_topk_prob=dims.renormalize, decoder_sparse_step=1, mlp_only_layers=[],
                 intermediate_size=src.get('intermediate_size') or dims.I)
  else:
    out['intermediate_size'] = dims.F
    if dims.family == 'qwen3_next':
      out['num_experts'] = 0
  hf_config.token_ids_and_source(out, src, bos_id, PASSTHROUGH)
  if m.rope_scaling.type == 'yarn':
    rs = m.rope_scaling
    rope_parameters.update(rope_type='yarn', factor=rs.factor,
                           original_max_position_embeddings=rs.original_max_len)
    out['max_position_embeddings'] = int(round(rs.original_max_len * rs.factor))
  out['rope_parameters'] = rope_parameters
  return out
