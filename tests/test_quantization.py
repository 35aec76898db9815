"""model/quantization.py and inference/quantized.py (--mode=quantization): the grids against
numpy loops (round to nearest, symmetric, the exact scale rules, int4 in [-7, 7]), which
parameters are quantized, the linear inputs' sites and moments against the numpy reference
model, and the mode on a tiny run."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.errors import ConfigError
from gated_attention.inference import quantized
from gated_attention.model import quantization as Q
from gated_attention.model import transformer as model
from tests import reference as ref
from tests.jax_helpers import model_config, perturb


def _same_grid(got, values, bits):
  """`got` is `values` on the grid of their scale: the same integers q (exactly) and q * scale
  to one float32 rounding (XLA may turn the division by 2^(b-1) - 1 into a product)."""
  want, q, scale = _np_grid(values, bits)
  np.testing.assert_array_equal(np.round(np.asarray(got, np.float64) / scale), q)
  np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=0)
  return q


def _np_grid(values, bits):
  """One scale's worth of values: (dequantized, q, scale), float32 like the code."""
  qmax = 2 ** (bits - 1) - 1
  values = np.asarray(values, np.float32)
  amax = np.float32(np.max(np.abs(values)))
  scale = np.float32(amax / np.float32(qmax)) if amax > 0 else np.float32(1)
  q = np.clip(np.round(values / scale), -qmax, qmax)
  return (q * scale).astype(np.float32), q, scale


def test_weights_per_output_channel_int8_against_a_numpy_loop():
  w = np.array(jax.random.normal(jax.random.key(0), (2, 6, 3, 4)) *
                 jnp.exp(jax.random.normal(jax.random.key(1), (2, 6, 3, 4))))   # heavy tails
  got = np.asarray(Q.quantize_weight(jnp.asarray(w), input_axes=1, bits=8))
  for l in range(2):
    for h in range(3):
      for e in range(4):          # output channel (h, e) of layer l: its 6 inputs share a scale
        q = _same_grid(got[l, :, h, e], w[l, :, h, e], 8)
        assert np.abs(q).max() == 127


def test_output_projection_contracts_two_axes():
  w = np.asarray(jax.random.normal(jax.random.key(2), (1, 2, 3, 5)))   # [L, H, d, D]
  got = np.asarray(Q.quantize_weight(jnp.asarray(w), input_axes=2, bits=8))
  for o in range(5):
    _same_grid(got[0, :, :, o].reshape(-1), w[0, :, :, o].reshape(-1), 8)


def test_weights_int4_group_wise_against_a_numpy_loop():
  w = np.asarray(jax.random.normal(jax.random.key(3), (2, 16, 5)))
  got = np.asarray(Q.quantize_weight(jnp.asarray(w), input_axes=1, bits=4, group=4))
  levels = set()
  for l in range(2):
    for o in range(5):
      for g in range(4):
        q = _same_grid(got[l, 4 * g:4 * g + 4, o], w[l, 4 * g:4 * g + 4, o], 4)
        levels |= set(q.astype(int).tolist())
  assert levels <= set(range(-7, 8)) and {-7, 7} <= levels      # symmetric: -8 never used
  with pytest.raises(ConfigError, match='group_size=5 does not divide'):
    Q.quantize_weight(jnp.asarray(w), input_axes=1, bits=4, group=5)


def test_experts_are_quantized_per_expert():
  w = np.asarray(jax.random.normal(jax.random.key(4), (1, 3, 8, 2)))    # [L, E, D, F]
  got = np.asarray(Q.quantize_weight(jnp.asarray(w), input_axes=1, bits=8, lead_axes=2))
  for e in range(3):
    for f in range(2):
      _same_grid(got[0, e, :, f], w[0, e, :, f], 8)


def test_activations_per_tensor_and_per_token_against_numpy():
  x = np.array(jax.random.normal(jax.random.key(5), (2, 3, 4, 2)))
  x[1, 2, 0, 1] = 40.0                                          # an outlier
  tensor = np.asarray(Q.quantize_activation(jnp.asarray(x), bits=8, per='tensor'))
  _same_grid(tensor.reshape(-1), x.reshape(-1), 8)
  token = np.asarray(Q.quantize_activation(jnp.asarray(x), bits=8, per='token', feature_axes=2))
  for b in range(2):
    for t in range(3):
      _same_grid(token[b, t].reshape(-1), x[b, t].reshape(-1), 8)
  # the outlier's scale zeroes the small values per tensor, only in its own row per token
  assert (tensor == 0).mean() > (token == 0).mean()
  zeros = np.asarray(Q.quantize_activation(jnp.zeros((2, 3)), bits=8, per='token'))
  assert (zeros == 0).all() and np.isfinite(zeros).all()
  with pytest.raises(ConfigError):
    Q.quantize_activation(jnp.asarray(x), bits=8, per='channel')


def test_kurtosis_from_pooled_moments_against_numpy():
  rng = np.random.default_rng(0)
  x = rng.standard_t(3, size=4000).astype(np.float32) + 0.3
  parts = [Q.input_moments(jnp.asarray(p)) for p in np.split(x, 4)]
  pooled = {k: sum(float(p[k]) for p in parts) for k in ('count', 'sum1', 'sum2', 'sum3', 'sum4')}
  c = x.astype(np.float64) - x.mean()
  want = np.mean(c ** 4) / np.mean(c ** 2) ** 2
  got = Q.kurtosis(pooled['count'], pooled['sum1'], pooled['sum2'], pooled['sum3'],
                   pooled['sum4'])
  assert got == pytest.approx(want, rel=1e-3)
  assert max(float(p['absmax']) for p in parts) == np.abs(x).max()


def _tiny(variant):
  cfg = ref.tiny_model_config(variant, num_layers=2)
  m = model.Transformer(model_config(cfg), rngs=nnx.Rngs(0))
  perturb(m, 1)
  return m, cfg


def test_quantize_params_takes_the_block_linears_only():
  m, _ = _tiny('g1_elementwise')
  params = nnx.to_pure_dict(nnx.state(m))
  q, names = Q.quantize_params(params, bits=8)
  assert sorted(names) == sorted(['blocks.attn.wq', 'blocks.attn.wk', 'blocks.attn.wv',
                                  'blocks.attn.wo', 'blocks.attn.gate.kernel',
                                  'blocks.ffn.wi_gate', 'blocks.ffn.wi_up', 'blocks.ffn.wo'])
  leaves_p = jax.tree_util.tree_flatten_with_path(params)[0]
  leaves_q = dict(jax.tree_util.tree_flatten_with_path(q)[0])
  for path, a in leaves_p:
    name = '.'.join(str(getattr(k, 'key', k)) for k in path)
    b = leaves_q[path]
    if name in names:
      assert not np.array_equal(np.asarray(a), np.asarray(b)), name
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=np.abs(a).max() / 127)
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_linear_input_sites_against_the_numpy_model():
  """The moments each site records are those of the tensors the numpy reference computes: the
  attention's normalised input, W_O's input (the SDPA output after the gate), the FFN's input
  and its down projection's input, per layer."""
  m, cfg = _tiny('g1_headwise')
  tokens = jax.random.randint(jax.random.key(7), (2, 9), 0, cfg.vocab_size)
  view = nnx.view(m, linear_inputs=Q.LinearInputs(stats=True))
  _, sown = nnx.capture(view, nnx.Intermediate)(tokens)
  stats = {path[-1]: (v.get_value() if isinstance(v, nnx.Variable) else v)[0]
           for path, v in nnx.to_flat_state(sown)}
  params = ref.to_float64(nnx.to_pure_dict(nnx.state(m)))
  mc = cfg.to_dict()
  _, per_layer = ref.forward(params, np.asarray(tokens), mc)
  eps = mc['norm_eps']
  h = ref.embed(params['embed']['embedding'], np.asarray(tokens))
  for i, extras in enumerate(per_layer):
    lp = ref.layer(params['blocks'], i)
    x_ffn = ref.rms_norm(extras['attn_residual'], lp['ffn_norm']['scale'], eps)
    want = {'attn_in': ref.rms_norm(h, lp['attn_norm']['scale'], eps),
            'attn_out_proj_in': extras['y_post_gate'], 'ffn_in': x_ffn,
            'ffn_down_in': ref.silu(x_ffn @ lp['ffn']['wi_gate']) * (x_ffn @ lp['ffn']['wi_up'])}
    for site, x in want.items():
      s = {k: float(v[i]) for k, v in stats[f'linear_in_{site}'].items()}
      assert s['absmax'] == pytest.approx(np.abs(x).max(), rel=1e-4), (site, i)
      assert s['count'] == x.size
      c = x - x.mean()
      assert Q.kurtosis(s['count'], s['sum1'], s['sum2'], s['sum3'], s['sum4']) == pytest.approx(
          np.mean(c ** 4) / np.mean(c ** 2) ** 2, rel=1e-3), (site, i)
    h = extras['ffn_residual']
  # quantized inputs change the logits, a little at 8 bits and more at 4
  float_logits = np.asarray(m(tokens)[0])
  err = {bits: np.abs(np.asarray(nnx.view(m, linear_inputs=Q.LinearInputs(
      per='tensor', bits=bits))(tokens)[0]) - float_logits).max() for bits in (8, 4)}
  assert 0 < err[8] < err[4]


def test_settings_are_parsed_and_refused_with_the_fix():
  s = quantized.parse('w8a16, W4A8', 'tensor,token', 32)
  assert [x['key'] for x in s] == ['w8a16', 'w4a8_tensor', 'w4a8_token']
  assert s[1]['weights'] == 'int4 per group of 32 inputs' and s[1]['group'] == 32
  assert s[2]['activations'] == 'int8 per token, dynamic'
  with pytest.raises(ConfigError, match='w8a9'):
    quantized.parse('w8a9', 'tensor', 32)
  with pytest.raises(ConfigError, match='activations'):
    quantized.parse('w8a8', 'channel', 32)
  with pytest.raises(ConfigError, match='group_size'):
    quantized.parse('w4a16', 'tensor', 0)


@pytest.mark.slow  # trains nothing, but compiles five programs: ~40 s on the loaded machine
def test_quantization_mode_on_a_tiny_run(tmp_path_factory):
  from gated_attention.modes import quantization as mode  # pylint: disable=g-import-not-at-top
  from tests.test_analysis import make_tiny_run  # pylint: disable=g-import-not-at-top
  run = make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=False)
  out = str(tmp_path_factory.getbasetemp() / 'quant')
  rep = mode.run(run, out_dir=out, overrides={
      'quantization.settings': 'w8a16,w4a8', 'quantization.group_size': 16,
      'quantization.num_batches': 2})
  assert [s['key'] for s in rep['settings']] == ['w8a16', 'w4a8_tensor', 'w4a8_token']
  for s in rep['settings']:
    assert s['increase'] == pytest.approx(s['loss'] - rep['float']['loss'])
  layers = json.load(open(os.path.join(run, 'config.json')))['model']['num_layers']
  assert set(rep['linear_inputs']) == set(Q.SITES)
  assert all(len(v['absmax']) == layers for v in rep['linear_inputs'].values())
  with open(os.path.join(out, 'quantization.md')) as f:
    assert '| W4A8 (per token) | int4 per group of 16 inputs | int8 per token, dynamic |' in f.read()
  with pytest.raises(ConfigError, match='group_size=7 does not divide'):
    mode.run(run, out_dir=out, overrides={'quantization.settings': 'w4a16',
                                          'quantization.group_size': 7})
