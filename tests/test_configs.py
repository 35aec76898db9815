"""configs/: every variant builds and validates, scale errors, remat policies are exact, and the
model section is the model dataclasses' schema (unknown keys refused, older runs upgraded)."""

import dataclasses
import json
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import from_run
from gated_attention.runs import upgrade
from gated_attention.config import scales
from gated_attention.errors import CheckpointError, ConfigError
from gated_attention.model import config as model_config_lib
from gated_attention.model import deltanet as deltanet_lib
from gated_attention.model import gating, moe as moe_lib, rope as rope_lib, transformer as model
from tests import reference as ref
from tests.jax_helpers import model_config

VARIANTS = ref.variant_names()
DENSE_SCALES = ('tiny', 'dense_1p7b_28l', 'dense_1p7b_48l')

# What each variant file sets, relative to the base config (the paper's variant table).
EXPECTED_GATES = {
    'baseline': {},
    'baseline_more_experts': {},
    'baseline_more_kv_heads': {},
    'baseline_more_q_heads': {},
    'baseline_sandwich_norm': {},
    'g1_elementwise': dict(position='g1'),
    'g1_elementwise_silu': dict(position='g1', activation='silu'),
    'g1_additive_silu': dict(position='g1', mode='additive', activation='silu'),
    'g1_additive_identity': dict(position='g1', mode='additive', activation='identity'),
    'g1_headwise': dict(position='g1', granularity='headwise'),
    'g1_headshared': dict(position='g1', head_shared=True),
    'g1_input_independent': dict(position='g1', input_dependent=False),
    'g1_ns_sigmoid': dict(position='g1', activation='ns_sigmoid'),
    'g1_rmsnorm': dict(position='g1', kind='rmsnorm'),
    'g1_silu_noparam': dict(position='g1', kind='silu_noparam'),
    'g2_elementwise': dict(position='g2'),
    'g2_headwise': dict(position='g2', granularity='headwise'),
    'g2_headshared': dict(position='g2', head_shared=True),
    'g3_elementwise': dict(position='g3'),
    'g4_elementwise': dict(position='g4'),
    'g5_elementwise': dict(position='g5'),
}


def _scale_for(variant):
  return 'moe_tiny' if variant == 'baseline_more_experts' else 'tiny'


def test_expected_table_covers_every_config_file():
  assert sorted(EXPECTED_GATES) == VARIANTS


@pytest.mark.parametrize('variant', VARIANTS)
def test_variant_builds_and_validates(variant):
  c = ref.load_config(variant, _scale_for(variant))
  assert c.variant == variant
  assert c.scale == _scale_for(variant)
  spec = gating.GateSpec.from_config(c.model.gate)
  assert dict(c.model.gate) == dict(scales.gate_config(), **EXPECTED_GATES[variant])
  assert spec.position == EXPECTED_GATES[variant].get('position', 'none')
  # only the gate (and the baselines' documented changes) differ from the base config
  b = scales.get_config(c.scale)
  b.model.gate = c.model.gate
  b.variant = c.variant
  diff = {k for k in b.model if b.model[k] != c.model[k]}
  allowed = {'baseline_more_kv_heads': {'num_kv_heads'}, 'baseline_more_q_heads': {'num_heads'},
             'baseline_sandwich_norm': {'sandwich_norm'},
             'baseline_more_experts': {'moe'}}.get(variant, set())
  assert diff == allowed
  assert c.train == b.train and c.data == b.data
  # the model can be built (abstractly: no memory, no FLOPs)
  assert model.param_report(model_config(c.model))['total'] > 0


@pytest.mark.parametrize('variant', [v for v in VARIANTS if v != 'baseline_more_experts'])
@pytest.mark.parametrize('scale', DENSE_SCALES[1:])
def test_variant_builds_at_paper_scales(variant, scale):
  c = ref.load_config(variant, scale)
  gating.GateSpec.from_config(c.model.gate)
  assert c.model.num_heads % c.model.num_kv_heads == 0
  assert c.data.seq_len == 4096 and c.train.batch_size == 1024


def test_baseline_head_changes():
  assert ref.load_config('baseline_more_kv_heads', 'moe_15a2b').model.num_kv_heads == 8   # 4 -> 8
  assert ref.load_config('baseline_more_q_heads', 'moe_15a2b').model.num_heads == 48      # 32 -> 48
  c = ref.load_config('baseline_more_experts', 'moe_15a2b').model.moe
  assert (c.num_experts, c.top_k) == (132, 12)


@pytest.mark.parametrize('variant', ['baseline', 'g1_elementwise', 'baseline_more_experts'])
def test_unknown_scale_names_the_choices(variant):
  with pytest.raises(ValueError) as e:
    ref.load_config(variant, 'dense_7b')
  msg = str(e.value)
  assert 'dense_7b' in msg
  for scale in scales.SCALES:
    assert scale in msg


def test_empty_scale_is_tiny():
  assert ref.load_config('g1_elementwise', '').scale == 'tiny'
  assert scales.get_config().scale == 'tiny'


@pytest.mark.parametrize('scale', DENSE_SCALES)
def test_more_experts_on_dense_scale_is_a_clear_error(scale):
  with pytest.raises(ValueError, match=r'baseline_more_experts needs an MoE scale.*moe_tiny'):
    ref.load_config('baseline_more_experts', scale)


def test_paper_scale_shapes():
  m = scales.model_config('dense_1p7b_28l')
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_size,
          m.vocab_size, m.tie_embeddings) == (28, 2048, 16, 8, 128, 6144, 151_936, True)
  m = scales.model_config('dense_1p7b_48l')
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_size,
          m.tie_embeddings) == (48, 1536, 16, 8, 128, 4608, True)
  m = scales.model_config('moe_15a2b')
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
          m.tie_embeddings) == (24, 2048, 32, 4, 128, False)
  assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_size) == (128, 8, 768)
  for scale in scales.SCALES:
    m = scales.model_config(scale)
    assert m.qk_norm and m.rope_scaling.type == 'none'


# --------------------------------------------------------------------------------------------
# Remat policies give the same loss and gradients
# --------------------------------------------------------------------------------------------

def _loss_and_grads(remat, T=8, jaxpr=False, **overrides):
  cfg = ref.tiny_model_config('g1_elementwise', remat=remat, **overrides)
  m = model.Transformer(model_config(cfg), rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (2, T + 1), 0, cfg.vocab_size)

  def loss_and_grads(m, tokens):
    def loss_fn(m):
      logits, _ = m(tokens[:, :-1])
      logp = jax.nn.log_softmax(logits)
      return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
    return nnx.value_and_grad(loss_fn)(m)

  if jaxpr:
    graphdef, state = nnx.split(m)
    return jax.make_jaxpr(lambda s, t: loss_and_grads(nnx.merge(graphdef, s), t))(state, tokens)
  loss, grads = nnx.jit(loss_and_grads)(m, tokens)
  return float(loss), nnx.to_pure_dict(grads)


@pytest.fixture(scope='module')
def no_remat():
  return _loss_and_grads('none')


def _assert_same(loss_grads0, loss_grads, rtol=1e-5, atol=1e-7):
  (loss0, grads0), (loss, grads) = loss_grads0, loss_grads
  np.testing.assert_allclose(loss, loss0, rtol=1e-6)
  flat0 = jax.tree_util.tree_leaves_with_path(grads0)
  flat = jax.tree_util.tree_leaves_with_path(grads)
  assert [p for p, _ in flat0] == [p for p, _ in flat]
  for (path, g0), (_, g) in zip(flat0, flat):
    assert np.abs(np.asarray(g0)).max() > 0, path
    np.testing.assert_allclose(g, g0, rtol=rtol, atol=atol, err_msg=str(path))


@pytest.mark.parametrize('remat', ['full', 'save_attention', 'dots'])
def test_remat_policy_gives_same_loss_and_grads(no_remat, remat):
  _assert_same(no_remat, _loss_and_grads(remat))


def _splash_forward_calls(closed_jaxpr) -> int:
  """Splash forward kernels whose results are used (a call inside a jit without outputs, which
  the remat leaves behind, is dead code the compiler removes)."""
  from gated_attention.compile.hlo_cost import _subjaxprs  # pylint: disable=g-import-not-at-top
  def count(jx):
    return sum(count(sub) for e in jx.eqns if e.outvars for sub in _subjaxprs(e.params)) + sum(
        e.primitive.name == 'pallas_call' and 'splash_mha_fwd' in str(
            e.params.get('name', e.params.get('name_and_src_info'))) for e in jx.eqns)
  return count(closed_jaxpr.jaxpr)


def test_save_attention_keeps_splash_output_so_backward_skips_its_forward():
  """With splash (the Pallas interpreter on CPU, T=128): remat='save_attention' gives the loss
  and gradients of no remat, and the step runs splash's forward kernel once per layer scan,
  where 'full' runs it again in the backward pass."""
  splash = dict(T=128, attention_impl='splash')
  _assert_same(_loss_and_grads('none', **splash), _loss_and_grads('save_attention', **splash),
               rtol=1e-4, atol=1e-6)
  assert _splash_forward_calls(_loss_and_grads('full', jaxpr=True, **splash)) == 2
  assert _splash_forward_calls(_loss_and_grads('save_attention', jaxpr=True, **splash)) == 1


def test_unknown_remat_policy_is_rejected():
  cfg = ref.tiny_model_config('baseline', remat='everything')
  with pytest.raises(ValueError, match='remat'):
    m = model.Transformer(model_config(cfg), rngs=nnx.Rngs(0))
    m(jax.random.randint(jax.random.key(0), (1, 4), 0, cfg.vocab_size))


# --------------------------------------------------------------------------------------------
# One schema: the model section is the dataclasses' fields and defaults; what a saved run may
# change is declared on the fields; unknown keys are refused by name
# --------------------------------------------------------------------------------------------

SCHEMA_SECTIONS = {'': model_config_lib.ModelConfig, 'gate': gating.GateSpec,
                   'moe': moe_lib.MoESpec, 'rope_scaling': rope_lib.RopeScaling,
                   'deltanet': deltanet_lib.DeltaNetSpec}


def _section(m, path):
  return m if not path else m[path]


def _config_fields(cls):
  return [f for f in dataclasses.fields(cls) if f.metadata.get('in_config', True)]


@pytest.mark.parametrize('scale', scales.SCALES)
def test_model_section_keys_are_the_dataclass_fields(scale):
  """Every key of the `model` section (and of its gate, moe, rope_scaling sections) is a field
  of its dataclass or a declared resolved key, and every field is a key, with a value of the
  field's type (int stays int, float float)."""
  m = scales.model_config(scale).to_dict()
  for path, cls in SCHEMA_SECTIONS.items():
    section = _section(m, path)
    keys = {f.name for f in _config_fields(cls)}
    if cls is model_config_lib.ModelConfig:
      keys |= set(model_config_lib.RESOLVED_KEYS)
    assert set(section) == keys, path
    for f in _config_fields(cls):
      if 'section' in f.metadata:
        assert isinstance(section[f.name], dict), f.name
        continue
      assert type(section[f.name]) is typing.get_type_hints(cls)[f.name], (path, f.name)


def test_model_section_defaults_are_the_dataclass_defaults():
  """The section's defaults are the dataclasses' defaults (the tiny scale adds only
  scan_layers=False), and ModelConfig.from_config of the defaults is the dataclass default but
  for what it resolves."""
  m = scales.model_config('tiny').to_dict()
  assert m.pop('scan_layers') is False
  for path, cls in SCHEMA_SECTIONS.items():
    for f in _config_fields(cls):
      if 'section' not in f.metadata and f.name in _section(m, path):
        assert _section(m, path)[f.name] == f.default, (path, f.name)
  for name, (default, into) in model_config_lib.RESOLVED_KEYS.items():
    assert m[name] == default and into in {f.name for f in dataclasses.fields(
        model_config_lib.ModelConfig)}
  assert dict(scales.gate_config()) == dataclasses.asdict(gating.GateSpec())
  assert dict(scales.moe_config()) == {f.name: f.default for f in dataclasses.fields(
      moe_lib.MoESpec)}
  cfg = model_config_lib.ModelConfig.from_config(scales.model_config('tiny'), platform='cpu')
  assert cfg == dataclasses.replace(model_config_lib.ModelConfig(), scan_layers=False,
                                    platform='cpu')


def test_what_a_saved_run_may_change_is_declared_on_the_fields():
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  assert set(rundir.MODEL_FREE) == {'remat', 'attention_impl', 'attention_block_q',
                                    'attention_block_kv', 'attention_fused_bwd', 'dtype',
                                    'scan_layers', 'fused_gate_projection'}
  assert set(rundir.EVAL_FREE) == set(rundir.MODEL_FREE) | {'rope_base', 'rope_scaling'}
  assert rundir.CHECKPOINT_FIELDS == ('data.tokenizer',)
  assert set(rundir.ITERATOR_FIELDS) == {
      'seed', 'train.batch_size', 'data.seq_len', 'data.source', 'data.path', 'data.hf_config',
      'data.hf_split', 'data.text_field', 'data.val_fraction', 'data.shuffle_buffer',
      'data.task', 'data.synthetic', 'data.mix_tasks', 'data.mix_ratio', 'data.mix_tokens',
      'data.mixture'}
  c = scales.get_config('tiny').to_dict()
  for path in rundir.ITERATOR_FIELDS + rundir.CHECKPOINT_FIELDS:
    node = c
    for part in path.split('.'):
      node = node[part]                                   # every declared path exists
  saved, now = dict(c, seed=0), dict(c, seed=7, model=dict(c['model'], remat='full'))
  assert rundir.config_differences(saved, now) == []
  assert rundir.iterator_differences(saved, now) == ['seed: saved 0, now 7']
  now['data'] = dict(c['data'], tokenizer='other.json')
  assert rundir.config_differences(saved, now) == [
      "data.tokenizer: saved 'byte', now 'other.json'"]


@pytest.mark.parametrize('path, key', [('', 'num_layer'), ('gate', 'postion'),
                                       ('moe', 'topk'), ('rope_scaling', 'facter')])
def test_unknown_model_keys_are_refused_by_name(path, key):
  m = scales.model_config('moe_tiny').to_dict()
  _section(m, path)[key] = 1
  where = 'config.model' + (f'.{path}' if path else '')
  with pytest.raises(ConfigError, match=rf'{re.escape(where)} has unknown field\(s\) {key};'
                     r'.*Remove or rename'):
    model_config_lib.ModelConfig.from_config(m, platform='cpu')


def _write_run(tmp_path, saved):
  run = tmp_path / 'run'
  run.mkdir()
  with open(run / 'config.json', 'w') as f:
    json.dump(saved, f)
  return str(run)


def test_saved_config_with_unknown_keys_is_refused_by_name(tmp_path):
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  saved = scales.get_config('tiny').to_dict()
  saved['model']['gate']['sharpness'] = 2.0
  saved['train']['lr_schedule'] = 'linear'
  run = _write_run(tmp_path, saved)
  with pytest.raises(ConfigError, match=r'has key\(s\) that this version of the code does not '
                     r'know: model\.gate\.sharpness, train\.lr_schedule\. .*remove those keys'):
    from_run.get_config(run)
  with pytest.raises(CheckpointError, match=r'config\.json has key.*model\.gate\.sharpness.*new '
                     r'--workdir'):
    rundir.check_or_write_config(run, scales.get_config('tiny'))


def test_saved_config_from_an_earlier_version_opens(tmp_path, monkeypatch):
  """A key that an earlier version wrote and was renamed since moves to its new name; one that
  was removed is dropped; a field added since takes its default; the import's hf section stays."""
  monkeypatch.setattr(upgrade, 'RETIRED_KEYS', {
      'model.attn_impl': ('rename', 'model.attention_impl'),
      'train.old_schedule': ('drop', 'the schedule is always cosine')})
  saved = scales.get_config('tiny').to_dict()
  del saved['model']['attention_impl'], saved['model']['fused_gate_projection']
  saved['model']['attn_impl'] = 'xla'
  saved['train']['old_schedule'] = 'cosine'
  saved['hf'] = {'source': '/hf/model', 'config_json': '{}'}
  c = from_run.get_config(_write_run(tmp_path, saved))
  assert c.model.attention_impl == 'xla' and 'attn_impl' not in c.model
  assert 'old_schedule' not in c.train
  assert c.model.fused_gate_projection is True
  assert c.hf.source == '/hf/model'
  expected = scales.get_config('tiny')
  expected.model.attention_impl = 'xla'
  assert {k: v for k, v in c.to_dict().items() if k != 'hf'} == expected.to_dict()


def test_saved_config_with_the_retired_step_keys_opens(tmp_path):
  """analysis.step and long_context.step (before issue 38: which checkpoint is --step now) are
  dropped from a saved config; the default quietly, another value with a warning."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  saved = scales.get_config('tiny').to_dict()
  saved['analysis']['step'] = -1
  saved['long_context']['step'] = 400
  warnings = []
  original = logging.warning
  logging.warning = lambda *a: warnings.append(a[0] % a[1:])
  try:
    c = from_run.get_config(_write_run(tmp_path, saved))
  finally:
    logging.warning = original
  assert 'step' not in c.analysis and 'step' not in c.long_context
  assert c.to_dict() == scales.get_config('tiny').to_dict()
  assert len(warnings) == 1 and 'long_context.step (= 400) is ignored' in warnings[0]


@pytest.mark.parametrize('overrides,match', [
    (dict(layer_types=['linear_attention', 'full_attention']), r'layer_types: has 2 entries for '
     r'num_layers=4'),
    (dict(layer_types=['linear_attention', 'attention', 'full_attention', 'full_attention']),
     r"layer_types: \['attention'\] are not layer types"),
    (dict(layer_types=['linear_attention'] * 4), r'gate\.position: .g1. gates attention'),
    (dict(rope_fraction=0.3), r'rope_fraction: 0\.3 must be in \(0, 1\]'),
    (dict(rope_fraction=0.0), r'rope_fraction'),
    (dict(norm_zero_centered=1), r'norm_zero_centered: must be True or False'),
    (dict(deltanet=dict(num_key_heads=3)), r'deltanet\.num_value_heads: 4 must be a multiple'),
    (dict(gate=dict(packing='group')), r'gate\.packing: .group. is not one of kv_group, head'),
    (dict(moe=dict(num_experts=4, top_k=2, expert_ffn_size=8, shared_expert_gate=True)),
     r'moe\.shared_expert_gate: .*num_shared_experts is 0'),
])
def test_hybrid_fields_are_validated_by_name(overrides, match):
  """The hybrid's switches refuse what cannot work, naming the config.model field."""
  m = scales.get_config('hybrid_tiny').to_dict()['model']
  m['gate']['position'] = 'g1'
  for k, v in overrides.items():
    if isinstance(v, dict):
      m[k].update(v)
    else:
      m[k] = v
  with pytest.raises(ConfigError, match=match):
    model_config_lib.ModelConfig.from_config(m, platform='cpu')


def test_hybrid_tiny_is_tiny_with_the_hybrid_switches():
  """hybrid_tiny: tiny's width and depth, three DeltaNet layers then attention, partial RoPE on a
  quarter of head_dim, zero-centred norms, the gate packed per head; the variant files decide
  the gate (g1_elementwise gated, baseline ungated)."""
  tiny, hybrid = scales.model_config('tiny').to_dict(), scales.model_config('hybrid_tiny').to_dict()
  for k in ('num_layers', 'hidden_size', 'num_heads', 'num_kv_heads', 'head_dim', 'ffn_size',
            'vocab_size'):
    assert tiny[k] == hybrid[k], k
  assert list(hybrid['layer_types']) == scales.HYBRID_PERIOD
  assert (hybrid['rope_fraction'], hybrid['norm_zero_centered']) == (0.25, True)
  assert hybrid['gate']['packing'] == 'head'
  assert ref.load_config('g1_elementwise', 'hybrid_tiny').model.gate.position == 'g1'
  assert ref.load_config('baseline', 'hybrid_tiny').model.gate.position == 'none'
  cfg = model_config(ref.load_config('g1_elementwise', 'hybrid_tiny').model)
  assert cfg.is_hybrid and cfg.layer_period == tuple(scales.HYBRID_PERIOD)
  assert cfg.num_attention_layers == 1
