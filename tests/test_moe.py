"""Tests for gated_attention/model/moe.py against naive numpy (float64) and dense-jax references."""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import scales
from gated_attention.model import grouped_matmul as gmm_lib
from gated_attention.model import moe as moe_lib
from tests.jax_helpers import model_config

B, T, D, E, K, F = 2, 6, 8, 4, 2, 5
jax.config.update('jax_default_matmul_precision', 'highest')


def make(dispatch='dropless', renormalize=False, shared=0, cf=1.25, lb='global', seed=0, dtype='float32',
         shared_gate=False):
  cfg = scales.model_config('moe_tiny')
  cfg.update(hidden_size=D, init_std=0.5, dtype=dtype)  # big std: well-separated router probabilities
  cfg.moe.update(num_experts=E, top_k=K, expert_ffn_size=F, num_shared_experts=shared,
                 renormalize=renormalize, dispatch=dispatch, capacity_factor=cf,
                 lb_loss_type=lb, shared_expert_gate=shared_gate)
  return moe_lib.MoE(model_config(cfg), rngs=nnx.Rngs(seed))


def rand_x(seed=1):
  return jax.random.normal(jax.random.key(seed), (B, T, D), jnp.float32)


def np_params(m):
  return {k: np.asarray(v[...], np.float64) for k, v in nnx.state(m, nnx.Param).items()}


def np_swiglu(x, wg, wu, wo):
  g = x @ wg
  return ((g / (1 + np.exp(-g))) * (x @ wu)) @ wo


def np_route(p, x, renormalize):
  logits = x @ p['router']
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  experts = np.argsort(-probs, axis=-1)[:, :K]
  w = np.take_along_axis(probs, experts, -1)
  if renormalize:
    w = w / w.sum(-1, keepdims=True)
  return logits, probs, experts, w


def np_moe(m, x, renormalize=False, capacity=None):
  """Naive per-token reference. capacity: k-major priority rule (all top-1 choices first)."""
  p = np_params(m)
  x = np.asarray(x, np.float64).reshape(-1, D)
  _, _, experts, w = np_route(p, x, renormalize)
  keep = np.ones(experts.shape, bool)
  if capacity is not None:
    used = np.zeros(E, int)
    for k in range(K):
      for n in range(len(x)):
        e = experts[n, k]
        keep[n, k] = used[e] < capacity
        used[e] += 1
  y = np.zeros_like(x)
  for n in range(len(x)):
    for k in range(K):
      if keep[n, k]:
        e = experts[n, k]
        y[n] += w[n, k] * np_swiglu(x[n], p['wi_gate'][e], p['wi_up'][e], p['wo'][e])
    if 'shared_wo' in p:
      gate = 1.0 / (1.0 + np.exp(-x[n] @ p['shared_gate'])) if 'shared_gate' in p else 1.0
      y[n] += gate * np_swiglu(x[n], p['shared_wi_gate'], p['shared_wi_up'], p['shared_wo'])
  return y.reshape(B, T, D), 1.0 - keep.mean()


@pytest.mark.parametrize('dispatch,renormalize,shared,shared_gate', [
    ('dropless', False, 0, False), ('dropless', True, 1, False), ('capacity', False, 1, False),
    ('capacity', True, 0, False), ('dropless', True, 1, True)])
def test_forward_matches_numpy(dispatch, renormalize, shared, shared_gate):
  m = make(dispatch, renormalize, shared, cf=float(E),  # cf=E: C >= N, nothing can drop
           shared_gate=shared_gate)
  x = rand_x()
  y, aux = m(x)
  y_ref, _ = np_moe(m, x, renormalize)
  assert y.shape == x.shape and y.dtype == x.dtype
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  assert float(aux['dropped_frac']) == 0.0


def test_shared_expert_gate_needs_a_shared_expert():
  with pytest.raises(moe_lib.ConfigError, match='shared_expert_gate.*num_shared_experts'):
    make(shared=0, shared_gate=True)


def test_matches_transformers_qwen3_next_sparse_moe_block():
  """transformers' Qwen3NextSparseMoeBlock (softmax top-k renormalised, a sigmoid-gated shared
  expert), random float32 weights copied in: the same output."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.models.qwen3_next import modeling_qwen3_next as hf_lib  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = transformers.Qwen3NextConfig(hidden_size=D, num_experts=E, num_experts_per_tok=K,
                                        moe_intermediate_size=F, norm_topk_prob=True,
                                        shared_expert_intermediate_size=F)
  hf = hf_lib.Qwen3NextSparseMoeBlock(config).float().eval()
  with torch.no_grad():
    for p in hf.parameters():
      p.copy_(0.5 * torch.randn_like(p))
  m = make('dropless', renormalize=True, shared=1, shared_gate=True)
  t = lambda p: jnp.asarray(p.detach().numpy())  # noqa: E731
  gate_up = t(hf.experts.gate_up_proj)                   # [E, 2F, D]: gate rows, then up rows
  nnx.update(m, nnx.State({
      'router': t(hf.gate.weight).T, 'wi_gate': gate_up[:, :F].transpose(0, 2, 1),
      'wi_up': gate_up[:, F:].transpose(0, 2, 1), 'wo': t(hf.experts.down_proj).transpose(0, 2, 1),
      'shared_wi_gate': t(hf.shared_expert.gate_proj.weight).T,
      'shared_wi_up': t(hf.shared_expert.up_proj.weight).T,
      'shared_wo': t(hf.shared_expert.down_proj.weight).T,
      'shared_gate': t(hf.shared_expert_gate.weight)[0]}))
  x = rand_x(5)
  with torch.no_grad():
    want = hf(torch.from_numpy(np.array(x))).numpy()
  y, _ = m(x)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
  assert np.abs(want).max() > 0.1


def test_capacity_equals_dropless_without_drops():
  x = rand_x()
  y_d, _ = make('dropless', shared=1)(x)
  y_c, aux = make('capacity', shared=1, cf=float(E))(x)
  np.testing.assert_allclose(y_c, y_d, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('cf', [0.5, 1.0])
def test_capacity_drop_rule(cf):
  m = make('capacity', cf=cf)
  x = rand_x(seed=3)
  y, aux = m(x)
  capacity = math.ceil(cf * B * T * K / E)
  y_ref, dropped_ref = np_moe(m, x, capacity=capacity)
  assert dropped_ref > 0  # the test must actually exercise drops
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(aux['dropped_frac'], dropped_ref, atol=1e-7)


def dense_reference(params, x_BxTxD, renormalize=False):
  """Every expert for every token, masked by the top-k weights (plain jax)."""
  x = x_BxTxD.reshape(-1, D)
  w_NxK, e_NxK = jax.lax.top_k(jax.nn.softmax(x @ params['router'], axis=-1), K)
  if renormalize:
    w_NxK = w_NxK / jnp.sum(w_NxK, axis=-1, keepdims=True)
  w_NxE = jnp.sum(jax.nn.one_hot(e_NxK, E) * w_NxK[..., None], axis=1)
  h = (jax.nn.silu(jnp.einsum('nd,edf->nef', x, params['wi_gate']))
       * jnp.einsum('nd,edf->nef', x, params['wi_up']))
  y = jnp.einsum('nef,efd,ne->nd', h, params['wo'], w_NxE)
  return y.reshape(x_BxTxD.shape)


@pytest.mark.parametrize('dispatch,renormalize', [('dropless', False), ('capacity', True)])
def test_grads_match_dense_reference(dispatch, renormalize):
  m = make(dispatch, renormalize, cf=float(E))
  graphdef, params = nnx.split(m, nnx.Param)
  x = rand_x()
  r = jax.random.normal(jax.random.key(7), x.shape)

  @jax.jit
  def grads(params, x):
    def loss_moe(params, x):
      return jnp.sum(nnx.merge(graphdef, params)(x)[0] * r)
    def loss_ref(params, x):
      return jnp.sum(dense_reference({k: v[...] for k, v in params.items()}, x, renormalize) * r)
    return (jax.grad(loss_moe, argnums=(0, 1))(params, x),
            jax.grad(loss_ref, argnums=(0, 1))(params, x))

  (gp, gx), (gp_ref, gx_ref) = grads(params, x)
  np.testing.assert_allclose(gx, gx_ref, rtol=1e-5, atol=1e-6)
  for k in ('router', 'wi_gate', 'wi_up', 'wo'):
    assert float(jnp.abs(gp[k][...]).max()) > 0
    np.testing.assert_allclose(gp[k][...], gp_ref[k][...], rtol=1e-5, atol=1e-6, err_msg=k)


def np_lb(probs, experts, seq):
  onehot = np.zeros(probs.shape)
  for n in range(len(probs)):
    onehot[n, experts[n]] += 1
  if not seq:
    return E * np.sum(onehot.mean(0) / K * probs.mean(0)), onehot.sum(0) / (K * len(probs))
  o, p = onehot.reshape(B, T, E), probs.reshape(B, T, E)
  return E * np.mean(np.sum(o.mean(1) / K * p.mean(1), -1)), None


def test_aux_losses_match_numpy():
  x = rand_x(seed=5)
  m_g, m_s = make(lb='global'), make(lb='sequence')
  (_, aux_g), (_, aux_s) = m_g(x), m_s(x)
  logits, probs, experts, _ = np_route(np_params(m_g), np.asarray(x, np.float64).reshape(-1, D), False)
  lb_g, load = np_lb(probs, experts, seq=False)
  lb_s, _ = np_lb(probs, experts, seq=True)
  np.testing.assert_allclose(aux_g['lb_loss'], lb_g, rtol=1e-5)
  np.testing.assert_allclose(aux_s['lb_loss'], lb_s, rtol=1e-5)
  assert abs(lb_g - lb_s) > 1e-3  # global f really pools all tokens of the batch
  np.testing.assert_allclose(aux_g['load_E'], load, rtol=1e-6)
  np.testing.assert_allclose(aux_g['prob_E'], probs.mean(0), rtol=1e-5)
  lse = logits.max(-1) + np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
  np.testing.assert_allclose(aux_g['router_z_loss'], np.mean(lse ** 2), rtol=1e-5)
  counts = load * K * B * T
  np.testing.assert_allclose(aux_g['load_cv'], counts.std() / counts.mean(), rtol=1e-5)
  np.testing.assert_allclose(aux_g['load_max_over_mean'], counts.max() / counts.mean(), rtol=1e-6)
  # global_load_E override replaces the local f.
  f_glob = jax.random.dirichlet(jax.random.key(9), jnp.ones(E))
  _, aux_o = m_g(x, pooled=f_glob)
  np.testing.assert_allclose(aux_o['lb_loss'], E * np.sum(np.asarray(f_glob) * probs.mean(0)), rtol=1e-5)


def test_lb_loss_gradient_flows_through_probs_only():
  m = make()
  graphdef, params = nnx.split(m, nnx.Param)
  x = rand_x()
  g = jax.grad(lambda p: nnx.merge(graphdef, p)(x)[1]['lb_loss'])(params)
  p = np_params(m)
  _, _, experts, _ = np_route(p, np.asarray(x, np.float64).reshape(-1, D), False)
  f = jnp.asarray(np_lb(np.ones((B * T, E)), experts, False)[1], jnp.float32)

  def ref(router):  # E * sum(sg(f) * mean softmax)
    return E * jnp.sum(f * jnp.mean(jax.nn.softmax(x.reshape(-1, D) @ router), 0))
  np.testing.assert_allclose(g['router'][...], jax.grad(ref)(params['router'][...]),
                             rtol=1e-5, atol=1e-7)
  assert float(jnp.abs(g['wo'][...]).max()) == 0.0


def test_jit_bfloat16_and_metadata():
  m = make('dropless', shared=1, dtype='bfloat16')
  assert m.router.get_metadata()['logical_axes'] == ('embed', 'expert')
  assert m.wo.get_metadata()['logical_axes'] == ('expert', 'expert_mlp', 'embed')
  assert m.shared_wi_gate.get_metadata()['logical_axes'] == ('embed', 'mlp')
  x = rand_x().astype(jnp.bfloat16)
  y, aux = nnx.jit(lambda m, x: m(x))(m, x)
  assert y.dtype == jnp.bfloat16 and aux['lb_loss'].dtype == jnp.float32
  y_ref, _ = np_moe(m, x.astype(jnp.float32))
  np.testing.assert_allclose(np.asarray(y, np.float32), y_ref, rtol=0.1, atol=0.1)


# --- grouped_matmul: megablox (Pallas interpreter on CPU) == ragged_dot ----------------------------

@pytest.mark.parametrize('M,Kd,N,grouped', [(256, 128, 128, False), (200, 128, 128, False),
                                            (256, 96, 192, False), (1100, 128, 384, False),
                                            (1100, 128, 384, True)])
def test_grouped_matmul_megablox_matches_ragged_dot(M, Kd, N, grouped):
  # M=200: rows padded to the 128-row tile, 7 tail rows; K=96/N=192: whole-dimension tiles;
  # M=1100: 512-row tiles (padded to 1536), groups straddling tiles, a 100-row tail, or (grouped)
  # every row in a group and no masking (all_rows_grouped), only the padding
  sizes = {256: [70, 0, 93, 30], 200: [50, 0, 93, 50], 1100: [300, 0, 500, 200]}[M]
  sizes = np.array(sizes, np.int32) + np.array([0, 0, 0, 100 if grouped else 0], np.int32)
  sizes = jnp.asarray(sizes)          # uneven, one empty group; M=256 leaves a 63-row tail
  kx, kw, kc = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (M, Kd), jnp.float32)
  w = jax.random.normal(kw, (4, Kd, N), jnp.float32) / np.sqrt(Kd)
  c = jax.random.normal(kc, (M, N), jnp.float32)

  def loss(x, w, impl):
    y = gmm_lib.grouped_matmul(x, w, sizes, impl, all_rows_grouped=grouped)
    return jnp.sum(y * c), y

  (l_r, y_r), (gx_r, gw_r) = jax.value_and_grad(loss, (0, 1), has_aux=True)(x, w, 'ragged_dot')
  (l_m, y_m), (gx_m, gw_m) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True),
                                     static_argnums=2)(x, w, 'megablox_interpret')
  for a, b in ((y_m, y_r), (gx_m, gx_r), (gw_m, gw_r)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
  assert np.all(np.asarray(y_m)[int(sizes.sum()):] == 0)
  assert np.all(np.asarray(gx_m)[int(sizes.sum()):] == 0)
  assert np.all(np.asarray(gw_m)[1] == 0)   # empty group


def test_grouped_matmul_config_and_errors():
  assert scales.moe_config().grouped_matmul == 'auto'
  assert gmm_lib.resolve('auto', 'tpu') == 'megablox'
  assert gmm_lib.resolve('auto', 'cpu') == 'ragged_dot'
  assert gmm_lib.resolve('megablox', 'cpu') == 'megablox'
  with pytest.raises(ValueError, match='grouped_matmul'):
    gmm_lib.resolve('dense', 'cpu')
  with pytest.raises(ValueError, match='config.model.moe.grouped_matmul'):
    gmm_lib.grouped_matmul(jnp.ones((128, 2100)), jnp.ones((2, 2100, 128)),
                           jnp.array([64, 64], jnp.int32), 'megablox_interpret')


def test_moe_layer_megablox_interpret_matches_ragged_dot():
  """The whole dropless layer (with its gradients) through megablox equals ragged_dot."""
  def build(impl):
    cfg = scales.model_config('moe_tiny')
    cfg.update(hidden_size=128, init_std=0.05, dtype='float32')
    cfg.moe.update(num_experts=4, top_k=2, expert_ffn_size=96, dispatch='dropless',
                   grouped_matmul=impl)
    return moe_lib.MoE(model_config(cfg), rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 24, 128), jnp.float32)
  outs = []
  for impl in ('ragged_dot', 'megablox_interpret'):
    m = build(impl)
    assert m.spec.grouped_matmul == impl
    def loss(m, x):
      y = m(x)[0]
      return jnp.sum(y ** 2), y
    (l, y), (gm, gx) = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(m, x)
    outs.append((y, gx, gm.wi_gate[...], gm.wo[...]))
  for a, b in zip(*outs):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
