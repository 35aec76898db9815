"""configs/: every variant builds and validates, scale errors, and remat policies are exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from gated_attention.model import gating, transformer as model
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
  assert dict(c.model.gate) == dict(base.gate_config(), **EXPECTED_GATES[variant])
  assert spec.position == EXPECTED_GATES[variant].get('position', 'none')
  # only the gate (and the baselines' documented changes) differ from the base config
  b = base.get_config(c.scale)
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
  for scale in base.SCALES:
    assert scale in msg


def test_empty_scale_is_tiny():
  assert ref.load_config('g1_elementwise', '').scale == 'tiny'
  assert base.get_config().scale == 'tiny'


@pytest.mark.parametrize('scale', DENSE_SCALES)
def test_more_experts_on_dense_scale_is_a_clear_error(scale):
  with pytest.raises(ValueError, match=r'baseline_more_experts needs an MoE scale.*moe_tiny'):
    ref.load_config('baseline_more_experts', scale)


def test_paper_scale_shapes():
  m = base.model_config('dense_1p7b_28l')
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_size,
          m.vocab_size, m.tie_embeddings) == (28, 2048, 16, 8, 128, 6144, 151_936, True)
  m = base.model_config('dense_1p7b_48l')
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_size,
          m.tie_embeddings) == (48, 1536, 16, 8, 128, 4608, True)
  m = base.model_config('moe_15a2b')
  assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
          m.tie_embeddings) == (24, 2048, 32, 4, 128, False)
  assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_size) == (128, 8, 768)
  for scale in base.SCALES:
    m = base.model_config(scale)
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
