"""gating.py: every gate variant against numpy float64, and the properties the paper defines."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.model import gating, layers
from tests import reference as ref

B, T, D, H, K, d = 2, 8, 32, 4, 2, 8
HOOK_SHAPES = {'q': (B, T, H, d), 'q_rope': (B, T, H, d), 'k': (B, T, K, d),
               'k_rope': (B, T, K, d), 'v': (B, T, K, d), 'sdpa': (B, T, H, d), 'out': (B, T, D)}
TOL = dict(rtol=1e-5, atol=1e-5)


def _randn(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _f64(a):
  return np.asarray(a, np.float64)


def make_gate(spec: gating.GateSpec, seed=0, perturb=True, std=0.3):
  spec.validate()
  gate = gating.Gate(spec, hidden_size=D, num_heads=H, num_kv_heads=K, head_dim=d,
                     init_std=std, rngs=nnx.Rngs(seed))
  if perturb:  # random noise on every parameter, so zero/one-initialised ones are generic
    state = nnx.state(gate, nnx.Param)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    keys = jax.random.split(jax.random.key(seed + 100), max(len(leaves), 1))
    leaves = [x + 0.5 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    nnx.update(gate, jax.tree_util.tree_unflatten(treedef, leaves))
  return gate


def spec_of(variant):
  return gating.GateSpec.from_config(ref.load_config(variant).model.gate)


def gate_params(gate):
  return ref.to_float64(nnx.to_pure_dict(nnx.state(gate, nnx.Param)))


GATED = ref.gated_variant_names()
EXPECTED_PARAM_SHAPES = {                 # the paper's shapes, one scalar per head for headwise
    'g1_elementwise': {'kernel': (D, H, d)},
    'g1_elementwise_silu': {'kernel': (D, H, d)},
    'g1_additive_silu': {'kernel': (D, H, d)},
    'g1_additive_identity': {'kernel': (D, H, d)},
    'g1_ns_sigmoid': {'kernel': (D, H, d)},
    'g1_headshared': {'kernel': (D, H, d)},   # the full gate is computed, then averaged
    'g1_headwise': {'kernel': (D, H)},
    'g1_input_independent': {'bias': (H, d)},
    'g1_rmsnorm': {'scale': (H, d)},
    'g1_silu_noparam': {},
    'g2_elementwise': {'kernel': (D, K, d)},
    'g2_headshared': {'kernel': (D, K, d)},
    'g2_headwise': {'kernel': (D, K)},
    'g3_elementwise': {'kernel': (D, K, d)},
    'g4_elementwise': {'kernel': (D, H, d)},
    'g5_elementwise': {'kernel': (D, D)},
}


def test_every_gated_variant_has_expected_shapes():
  assert sorted(EXPECTED_PARAM_SHAPES) == GATED


@pytest.mark.parametrize('variant', GATED)
def test_variant_matches_reference_and_ignores_other_hooks(variant):
  spec = spec_of(variant)
  gate = make_gate(spec, seed=1)
  params = gate_params(gate)
  assert {k: v.shape for k, v in params.items()} == EXPECTED_PARAM_SHAPES[variant]
  x = _randn(2, (B, T, D))
  spec_dict = dict(ref.load_config(variant).model.gate)
  assert spec.hook == ref.gate_hook(spec_dict)
  for i, (hook, shape) in enumerate(HOOK_SHAPES.items()):
    y = _randn(10 + i, shape, 2.0)
    out = gate(hook, y, x)
    if hook != spec.hook:
      assert out is y                                        # untouched at every other hook
      continue
    assert out.shape == y.shape and out.dtype == y.dtype
    want = ref.gate_apply(spec_dict, params, hook, _f64(y), _f64(x))
    np.testing.assert_allclose(out, want, **TOL)
    assert not np.allclose(want, _f64(y), atol=1e-3)         # the gate did something


@pytest.mark.parametrize('position,hook', [('g1', 'sdpa'), ('g2', 'v'), ('g3', 'k'), ('g4', 'q'),
                                           ('g5', 'out')])
def test_positions_hooks(position, hook):
  assert gating.GateSpec(position=position).hook == hook
  if position in ('g3', 'g4'):
    assert gating.GateSpec(position=position, after_qk_norm_rope=True).hook == hook + '_rope'


def test_baseline_gate_is_identity_everywhere():
  spec = gating.GateSpec()
  gate = make_gate(spec)
  assert spec.hook is None and not spec.has_params
  assert len(jax.tree_util.tree_leaves(nnx.state(gate, nnx.Param))) == 0
  x = _randn(0, (B, T, D))
  for hook, shape in HOOK_SHAPES.items():
    y = _randn(1, shape)
    assert gate(hook, y, x) is y


@pytest.mark.parametrize('position,n', [('g1', H), ('g2', K)])
def test_headwise_uses_one_scalar_per_head(position, n):
  gate = make_gate(gating.GateSpec(position=position, granularity='headwise'), seed=3)
  assert gate.kernel[...].shape == (D, n)
  x = _randn(4, (B, T, D))
  s = gate.scores(x)
  assert s.shape == (B, T, n, 1)
  y = _randn(5, (B, T, n, d), 3.0)
  out = np.asarray(gate(gate.spec.hook, y, x))
  ratio = out / np.asarray(y)                                # the same across head_dim
  np.testing.assert_allclose(ratio, np.broadcast_to(ratio[..., :1], ratio.shape), rtol=1e-4)
  np.testing.assert_allclose(ratio[..., 0], np.asarray(s)[..., 0], rtol=1e-4)
  # the scalar of head i is sigmoid(x . W[:, i])
  np.testing.assert_allclose(s[..., 0], ref.sigmoid(_f64(x) @ _f64(gate.kernel[...])), **TOL)


@pytest.mark.parametrize('position,n', [('g1', H), ('g2', K)])
@pytest.mark.parametrize('granularity', ['elementwise', 'headwise'])
@pytest.mark.parametrize('reduce', ['score', 'logit'])
def test_head_shared_is_the_mean_over_heads(position, n, granularity, reduce):
  shared = make_gate(gating.GateSpec(position=position, granularity=granularity,
                                     head_shared=True, shared_reduce=reduce), seed=6)
  specific = make_gate(gating.GateSpec(position=position, granularity=granularity), seed=7)
  specific.kernel[...] = shared.kernel[...]                  # same parameters, head-specific
  x = _randn(8, (B, T, D))
  per_head = np.asarray(specific.scores(x), np.float64)      # [B, T, n, d or 1]
  if reduce == 'score':
    want = per_head.mean(axis=2, keepdims=True)
  else:
    logits = np.tensordot(_f64(x), _f64(shared.kernel[...]), axes=([-1], [0]))
    logits = logits[..., None] if granularity == 'headwise' else logits
    want = ref.sigmoid(logits.mean(axis=2, keepdims=True))
  s = shared.scores(x)
  np.testing.assert_allclose(s, want, **TOL)
  assert not np.allclose(per_head, want, atol=1e-3)          # heads did differ
  y = _randn(9, (B, T, n, d))
  out = np.asarray(shared(shared.spec.hook, y, x))
  for h in range(n):                                         # every head gets the same gate
    np.testing.assert_allclose(out[:, :, h], np.asarray(y)[:, :, h] * want[:, :, 0], **TOL)
  # same parameter count as head-specific
  assert shared.kernel[...].shape == specific.kernel[...].shape


def test_head_shared_score_vs_logit_differ():
  a = make_gate(gating.GateSpec(position='g1', head_shared=True, shared_reduce='score'), seed=1)
  b = make_gate(gating.GateSpec(position='g1', head_shared=True, shared_reduce='logit'), seed=1)
  x = _randn(2, (B, T, D))
  assert not np.allclose(a.scores(x), b.scores(x), atol=1e-3)


@pytest.mark.parametrize('granularity', ['elementwise', 'headwise'])
def test_input_independent_starts_at_half_and_ignores_x(granularity):
  spec = gating.GateSpec(position='g1', input_dependent=False, granularity=granularity)
  gate = make_gate(spec, perturb=False)
  assert not hasattr(gate, 'kernel')
  assert gate.bias[...].shape == ((H, d) if granularity == 'elementwise' else (H,))
  np.testing.assert_array_equal(gate.bias[...], 0.0)         # zero-initialised
  x1, x2 = _randn(1, (B, T, D)), _randn(2, (B, T, D), 5.0)
  np.testing.assert_array_equal(np.broadcast_to(gate.scores(x1), (B, T, H, d)), 0.5)
  y = _randn(3, (B, T, H, d))
  np.testing.assert_array_equal(gate('sdpa', y, x1), 0.5 * np.asarray(y))
  # after training (a perturbed bias): still the same for every token and every input
  gate = make_gate(spec, perturb=True)
  s1, s2 = np.asarray(gate.scores(x1)), np.asarray(gate.scores(x2))
  np.testing.assert_array_equal(np.broadcast_to(s1, s2.shape), s2)
  np.testing.assert_array_equal(gate('sdpa', y, x1), gate('sdpa', y, x2))
  want = ref.sigmoid(_f64(gate.bias[...]))
  want = want[..., None] if granularity == 'headwise' else want
  np.testing.assert_allclose(np.asarray(gate('sdpa', y, x1)), _f64(y) * want, **TOL)


def test_ns_sigmoid_stays_in_half_to_one():
  gate = make_gate(gating.GateSpec(position='g1', activation='ns_sigmoid'), seed=4, std=1.0)
  x = _randn(5, (B, T, D), 50.0)                             # large logits, both signs
  s = np.asarray(gate.scores(x))
  assert s.min() >= 0.5 and s.max() <= 1.0
  assert s.min() < 0.51 and s.max() > 0.99                   # and reaches both ends
  np.testing.assert_allclose(
      gate.scores(x[:, :, :]), 0.5 + 0.5 * ref.sigmoid(np.tensordot(
          _f64(x), _f64(gate.kernel[...]), axes=([-1], [0]))), **TOL)


def test_sigmoid_gate_is_sparse_capable():
  gate = make_gate(gating.GateSpec(position='g1'), seed=4, std=1.0)
  s = np.asarray(gate.scores(_randn(5, (B, T, D), 50.0)))
  assert s.min() < 0.01 and s.max() > 0.99 and s.min() >= 0.0


def test_additive_identity_is_y_plus_xw():
  gate = make_gate(spec_of('g1_additive_identity'), seed=5)
  x, y = _randn(6, (B, T, D)), _randn(7, (B, T, H, d))
  xw = np.einsum('btd,dhk->bthk', _f64(x), _f64(gate.kernel[...]))
  np.testing.assert_allclose(gate('sdpa', y, x), _f64(y) + xw, **TOL)


def test_additive_silu_is_y_plus_silu_xw():
  gate = make_gate(spec_of('g1_additive_silu'), seed=5)
  x, y = _randn(6, (B, T, D)), _randn(7, (B, T, H, d))
  xw = np.einsum('btd,dhk->bthk', _f64(x), _f64(gate.kernel[...]))
  np.testing.assert_allclose(gate('sdpa', y, x), _f64(y) + ref.silu(xw), **TOL)


def test_rmsnorm_kind_is_per_head_rmsnorm_of_y():
  gate = make_gate(spec_of('g1_rmsnorm'), seed=8)
  x, y = _randn(9, (B, T, D)), _randn(10, (B, T, H, d), 4.0)
  y64 = _f64(y)
  want = y64 / np.sqrt((y64 ** 2).mean(-1, keepdims=True) + 1e-6) * _f64(gate.scale[...])
  np.testing.assert_allclose(gate('sdpa', y, x), want, **TOL)
  # it does not look at x
  np.testing.assert_array_equal(gate('sdpa', y, x), gate('sdpa', y, 3 * x))


def test_silu_noparam_is_silu_of_y():
  gate = make_gate(spec_of('g1_silu_noparam'))
  assert not gate.spec.has_params
  assert len(jax.tree_util.tree_leaves(nnx.state(gate, nnx.Param))) == 0
  x, y = _randn(9, (B, T, D)), _randn(10, (B, T, H, d), 4.0)
  np.testing.assert_allclose(gate('sdpa', y, x), _f64(y) / (1 + np.exp(-_f64(y))), **TOL)


def test_g5_gates_the_model_dimension():
  gate = make_gate(spec_of('g5_elementwise'), seed=11)
  x, y = _randn(12, (B, T, D)), _randn(13, (B, T, D))
  want = _f64(y) * ref.sigmoid(_f64(x) @ _f64(gate.kernel[...]))
  np.testing.assert_allclose(gate('out', y, x), want, **TOL)


def test_bfloat16_tensor_keeps_its_dtype():
  gate = make_gate(spec_of('g1_elementwise'), seed=1)
  x = _randn(2, (B, T, D)).astype(jnp.bfloat16)
  y = _randn(3, (B, T, H, d)).astype(jnp.bfloat16)
  out = gate('sdpa', y, x)
  assert out.dtype == jnp.bfloat16
  want = ref.gate_apply({'position': 'g1'}, gate_params(gate), 'sdpa', _f64(y), _f64(x))
  np.testing.assert_allclose(_f64(out), want, rtol=2e-2, atol=2e-2)


def test_stats_record_gate_scores():
  gate = make_gate(spec_of('g1_elementwise'), seed=1)
  x, y = _randn(2, (B, T, D)), _randn(3, (B, T, H, d))
  _, stats = layers.capture_stats(gate, 'sdpa', y, x)
  s = np.asarray(gate.scores(x))
  np.testing.assert_allclose(stats['gate']['mean'], s.mean(), rtol=1e-5)
  np.testing.assert_allclose(stats['gate']['frac_below_0.1'], (s < 0.1).mean(), atol=1e-6)
  hist = np.asarray(stats['gate']['hist'])
  assert hist.shape == (gating.HIST_BINS,)
  np.testing.assert_allclose(hist.sum(), 1.0, rtol=1e-5)
  np.testing.assert_allclose(hist, np.histogram(s, bins=gating.HIST_BINS, range=(0, 1))[0] / s.size,
                             atol=1.5 / s.size)


# --------------------------------------------------------------------------------------------
# Invalid specs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('kwargs,field', [
    (dict(position='g5', granularity='headwise'), 'granularity'),
    (dict(position='g5', head_shared=True), 'head_shared'),
    (dict(position='g2', kind='rmsnorm'), 'kind'),
    (dict(position='g3', kind='silu_noparam'), 'kind'),
    (dict(position='g1', after_qk_norm_rope=True), 'after_qk_norm_rope'),
    (dict(position='g2', after_qk_norm_rope=True), 'after_qk_norm_rope'),
    (dict(position='g1', activation='tanh'), 'activation'),
    (dict(position='g6'), 'position'),
    (dict(position='g1', granularity='channelwise'), 'granularity'),
    (dict(position='g1', mode='subtractive'), 'mode'),
    (dict(position='g1', shared_reduce='max'), 'shared_reduce'),
    (dict(position='g1', kind='layernorm'), 'kind'),
])
def test_invalid_specs_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=rf'config\.model\.gate\.{field}'):
    gating.GateSpec(**kwargs).validate()
  cfg = ref.load_config('baseline').model.gate
  cfg.update(kwargs)
  with pytest.raises(ValueError, match=field):
    gating.GateSpec.from_config(cfg)


@pytest.mark.parametrize('variant', ref.variant_names())
def test_every_config_gate_is_valid(variant):
  if variant == 'baseline_more_experts':
    pytest.skip('dense tiny scale is rejected; see test_configs')
  spec = spec_of(variant)
  assert (spec.position == 'none') == variant.startswith('baseline')
