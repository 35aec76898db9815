"""Costs of the Pallas TPU kernels that XLA's cost analysis cannot see (gated_attention/compile/kernel_cost.py).

The default-suite tests check the analytic counts against reference computations on CPU; the
compile test (slow, needs libtpu) checks them on a real TPU compile of splash attention:
  python -m pytest -m slow tests/test_kernel_cost.py
"""

import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention.compile import hlo_cost, kernel_cost

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                                  reason='libtpu not installed (pip install -r requirements-tpu.txt)')


def _attention_BxHxTxd(q, k, v):
  """Plain causal attention, the reference (two matmuls forward, four backward)."""
  s = jnp.einsum('bhqd,bhkd->bhqk', q, k)
  s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -1e30)
  return jnp.einsum('bhqk,bhkd->bhqd', jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize('T,bq,bkv', [(4096, 512, 512), (1024, 256, 128), (1024, 128, 512),
                                      (512, 512, 512)])
def test_causal_tiles_match_splash_mask_info(T, bq, bkv):
  """The tiles the splash kernel computes: its own mask processing keeps exactly these."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as info
  mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((T, T))])
  mask_info, _ = info.process_mask(mask, (bq, bkv))
  if mask_info.block_mask is None:    # every tile computed
    kept = (T // bq) * (T // bkv)
  else:
    kept = int(np.count_nonzero(np.asarray(mask_info.block_mask)))
  assert kernel_cost.causal_tiles(T, T, bq, bkv) == kept


def test_causal_tiles_approach_half_for_small_tiles():
  assert kernel_cost.causal_tiles(4096, 4096, 512, 512) == 36          # of 64
  assert kernel_cost.causal_tiles(4096, 4096, 4096, 4096) == 1
  assert kernel_cost.causal_tiles(4096, 4096, 128, 128) / 32**2 == pytest.approx(0.5, abs=0.02)


def test_splash_flops_match_reference_attention_matmuls():
  """One tile spanning the sequence: the forward kernel does the reference's two matmuls; the
  dq (3) and dkv (4) kernels the reference backward's four (dV, dP, dQ, dK) plus three
  recomputed (QK^T in each, dP twice); fused, dkv's five add only QK^T's recomputation."""
  B, H, T, d = 2, 3, 256, 64
  x = jnp.ones((B, H, T, d))
  f = lambda q, k, v: _attention_BxHxTxd(q, k, v).sum()  # noqa: E731
  fwd = hlo_cost.jaxpr_cost(jax.make_jaxpr(f)(x, x, x))['flops']
  fwd_bwd = hlo_cost.jaxpr_cost(jax.make_jaxpr(jax.value_and_grad(f, argnums=(0, 1, 2)))(
      x, x, x))['flops']
  one_matmul = fwd / 2
  flops = {kind: kernel_cost.splash_flops(kind, B * H, T, T, d, T, T)
           for kind in kernel_cost.SPLASH_MATMULS}
  assert flops['fwd'] == fwd
  assert flops['fwd'] + flops['dq'] + flops['dkv'] == fwd_bwd + 3 * one_matmul
  assert flops['fwd'] + flops['dkv_fused'] == fwd_bwd + one_matmul


def test_splash_flops_scale_with_computed_tiles():
  full = kernel_cost.splash_flops('fwd', 4, 4096, 4096, 128, 4096, 4096)
  tiled = kernel_cost.splash_flops('fwd', 4, 4096, 4096, 128, 512, 512)
  assert tiled / full == 36 / 64


_SPLASH_HLO = '''HloModule m

%body (p: (s32[], bf16[2,4,1024,128])) -> (s32[], bf16[2,4,1024,128]) {
  %p = (s32[], bf16[2,4,1024,128]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %q = bf16[2,4,1024,128]{3,2,1,0} get-tuple-element(%p), index=1
  %m0 = s8[1,2,2]{2,1,0} constant({...})
  %seq = s32[1024,128]{1,0} iota(), iota_dimension=0
  %splash_mha_fwd_no_residuals.1 = (f32[2,512,128]{2,1,0}, bf16[2,4,1024,128]{3,2,1,0}) custom-call(%m0, %m0, %q, %q, %q, %seq), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 512, \\"block_kv\\": 512, \\"use_fused_bwd_kernel\\": false, \\"q_layout\\": 1, \\"k_layout\\": 1, \\"v_layout\\": 1}"
}}, metadata={op_name="jit(f)/splash_mha_fwd_no_residuals/pallas_call"}, backend_config={"custom_call_config":{"body":"xx"}}
  %o = bf16[2,4,1024,128]{3,2,1,0} get-tuple-element(%splash_mha_fwd_no_residuals.1), index=1
  %t = bf16[2,4,1024,128]{3,2,1,0} tanh(%o)
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[2,4,1024,128]) tuple(%n, %t)
}

%cond (p: (s32[], bf16[2,4,1024,128])) -> pred[] {
  %p = (s32[], bf16[2,4,1024,128]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %c = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: (s32[], bf16[2,4,1024,128])) -> (s32[], bf16[2,4,1024,128]) {
  %a = (s32[], bf16[2,4,1024,128]) parameter(0)
  ROOT %w = (s32[], bf16[2,4,1024,128]) while(%a), condition=%cond, body=%body
}
'''


def test_hlo_loop_cost_adds_splash_kernels_and_reads_past_their_attributes():
  """A kernel's frontend attributes span lines; the instructions after it still count, and the
  kernel's FLOPs and bytes are added per loop iteration."""
  c = hlo_cost.hlo_loop_cost(_SPLASH_HLO)
  size = 2 * 4 * 1024 * 128 * 2
  assert c['bytes:elementwise / reductions / other'] >= 5 * 2 * size   # the tanh after the kernel
  tiles = kernel_cost.causal_tiles(1024, 1024, 512, 512)
  assert c['kernel_flops'] == 5 * 2 * 2 * 512 * 512 * 128 * tiles * 8
  assert c['kernel_flops_once'] == c['kernel_flops'] / 5
  # q, k, v, the output and scratch once, plus K and V re-read for the second query tile.
  once = 4 * size + 2 * 512 * 128 * 4 + 1024 * 128 * 4 + 2 * 2 * 2 * 2
  reread = 2 * size * (tiles / 2 - 1)
  assert c['kernel_bytes'] == pytest.approx(5 * (once + reread))


def test_fused_dkv_kernel_is_recognised_by_its_partial_dq():
  """The fused kernel's metadata omits the flag; its extra output (partial dq per key tile,
  here behind the vmapped batch axis) marks it."""
  B, H, K, T, d = 16, 16, 8, 4096, 128
  attrs = ('metadata={op_name="jit(f)/splash_mha_dkv_no_residuals/pallas_call"}, '
           'frontend_attributes={kernel_metadata={"xprof_metadata":"{\\"block_q_dkv\\": 512, '
           '\\"block_kv_dkv\\": 512, \\"q_layout\\": 1, \\"k_layout\\": 1}"}}')
  q, kv = ((B, H, T, d), B * H * T * d * 2.0), ((B, K, T, d), B * K * T * d * 2.0)
  outs = [(B, 8, H, T, d), (B, K, T, d), (B, K, T, d)]
  fused = kernel_cost.custom_call_cost('dkv', attrs, [q, kv, kv], 1.0, outs)
  plain = kernel_cost.custom_call_cost('dkv', attrs, [q, kv, kv], 1.0, outs[1:])
  assert fused['flops'] == kernel_cost.splash_flops('dkv_fused', B * H, T, T, d, 512, 512)
  assert plain['flops'] == kernel_cost.splash_flops('dkv', B * H, T, T, d, 512, 512)


def test_kernels_with_a_cost_estimate_are_left_to_xla():
  attrs = ('metadata={op_name="jit(f)/gmm/pallas_call"}, backend_config={"custom_call_config":'
           '{"body":"x", "cost_estimate": {"flops": 1000, "transcendentals": 0, '
           '"bytes_accessed": 64}}}')
  c = kernel_cost.custom_call_cost('pallas_call.3', attrs, [((8, 8), 128.0)], 128.0)
  assert c == dict(kernel='megablox', flops=1000.0, bytes=64.0, xla_flops=1000.0, xla_bytes=64.0)
  unknown = kernel_cost.custom_call_cost('my_kernel', 'metadata={op_name="x"}',
                                         [((8, 8), 128.0)], 128.0)
  assert unknown['kernel'] == 'uncounted' and unknown['bytes'] == 256.0
  assert unknown['xla_flops'] == unknown['xla_bytes'] == 0


def test_megablox_flops_count_every_visited_row_tile():
  """Operands as in a compiled gmm: num_active_tiles, group_offsets [G+1], group_ids and
  m_tile_ids [tiles_m + G - 1], group_offset [1], lhs, rhs. 8 groups over 8 row tiles: up to
  15 tile visits, each a full tile matmul."""
  attrs = ('metadata={op_name="jit(f)/jit(gmm)/pallas_call"}, backend_config={"custom_call_'
           'config":{"cost_estimate":{"flops":"268435456","bytes_accessed":"5505024"}}}')
  ops = [((), 4.0), ((9,), 36.0), ((15,), 60.0), ((15,), 60.0), ((1,), 4.0),
         ((1024, 512), 2**20), ((8, 512, 256), 2**21)]
  c = kernel_cost.custom_call_cost('gmm', attrs, ops, 2**19)
  assert c['xla_flops'] == 2 * 1024 * 512 * 256 and c['xla_bytes'] == 5505024
  assert c['flops'] == c['xla_flops'] * 15 / 8 and c['bytes'] == c['xla_bytes']


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize('fused_bwd', [True, False])
def test_splash_on_a_tpu_compile_is_invisible_to_xla_and_counted_here(fused_bwd):
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from gated_attention.compile import tpu
  from gated_attention.model import attention_kernels
  _, devices = tpu.topology_devices('v5p:2x2x1')
  mesh = Mesh(devices[:1], ('data',))
  B, T, H, K, d = 2, 1024, 4, 2, 128
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, P()))  # noqa: E731

  def loss(q, k, v):
    return attention_kernels.attend(q, k, v, 'splash', platform='tpu',
                                    fused_bwd=fused_bwd).astype(jnp.float32).sum()

  with jax.set_mesh(mesh):
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        spec(B, T, H, d), spec(B, T, K, d), spec(B, T, K, d)).compile()
  xla = compiled.cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  c = hlo_cost.hlo_loop_cost(compiled.as_text())
  expected = sum(kernel_cost.splash_flops(kind, B * H, T, T, d, 512, 512)
                 for kind in (('fwd', 'dkv_fused') if fused_bwd else ('fwd', 'dq', 'dkv')))
  assert c['kernel_flops'] == expected
  assert xla['flops'] < 0.01 * expected      # XLA sees (almost) none of it
  assert c['kernel_bytes'] >= 4 * math.prod((B, T, H, d)) * 2
