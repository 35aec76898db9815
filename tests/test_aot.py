"""Ahead-of-time compilation for TPU topologies (gated_attention/compile/aot.py).

The compile tests need libtpu (pip install -r requirements-tpu.txt) but no TPU; they are marked
slow (about a minute on 2 CPU cores) and skipped without libtpu:
  python -m pytest -m slow tests/test_aot.py
The helpers below them run in the default suite.
"""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from configs import g1_elementwise
from gated_attention import chips
from gated_attention.compile import aot, hlo_cost
from gated_attention.model import transformer as model_lib
from tests.jax_helpers import model_config

HAS_LIBTPU = importlib.util.find_spec('libtpu') is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason='libtpu not installed '
                                  '(pip install -r requirements-tpu.txt)')


def tiny_fsdp(seq_len=128, **train):
  cfg = g1_elementwise.get_config('tiny')
  cfg.mesh.update(data=1, fsdp=-1, rules='fsdp')
  cfg.data.seq_len = seq_len
  cfg.train.update(**train)
  return cfg


def test_parse_topology():
  assert aot.parse_topology('v5p:4x4x4') == ('v5p', 'v5p:4x4x4')
  assert aot.parse_topology('v5litepod:2x2') == ('v5e', 'v5e:2x2')
  for bad in ('v5p', 'h100:8', ''):
    with pytest.raises(ValueError, match='topology'):
      aot.parse_topology(bad)


def test_chip_specs():
  for name, spec in chips.CHIPS.items():
    assert spec['peak_bf16_flops'] > 1e14 and spec['hbm_bytes'] >= 16 * 2**30, name
    assert spec['hbm_bandwidth'] > 5e11, name
  assert chips.chip_spec('TPU v5 lite')['chip'] == 'v5e'
  assert chips.chip_spec('cpu') is None
  assert set(chips.TPU_CHIPS) <= set(chips.CHIPS) and 'h100' not in chips.TPU_CHIPS


def test_count_collectives():
  hlo = ('%all-gather.3 = bf16[8]{0} all-gather(%p), dimensions={0}\n'
         '%ag = (bf16[8]) all-gather-start(%p)\n'
         '%fusion.1 = f32[2]{0} fusion(%x), kind=kCustom, calls=%all-reduce-scatter.9.clone\n'
         '%all-reduce.1 = f32[] all-reduce(%y), to_apply=%add\n')
  c = hlo_cost.count_collectives(hlo)
  assert c['all-gather'] == 2 and c['reduce-scatter'] == 1 and c['all-reduce'] == 1
  assert c['all-to-all'] == 0


def test_jaxpr_cost_counts_scan_trip_counts():
  def f(x, ws):
    def body(h, w):
      return h @ w, None
    return jax.lax.scan(body, x, ws)[0].sum()
  x, ws = jnp.ones((4, 8)), jnp.ones((6, 8, 8))
  cost = hlo_cost.jaxpr_cost(jax.make_jaxpr(f)(x, ws))
  assert cost['flops'] == 6 * 2 * 4 * 8 * 8
  assert cost['flops_once'] == 2 * 4 * 8 * 8


def test_jaxpr_cost_ragged_dot_counts_each_row_once():
  def f(x, w, gs):
    return jax.lax.ragged_dot(x, w, gs).sum()
  x, w, gs = jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5])
  cost = hlo_cost.jaxpr_cost(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, w, gs))
  assert cost['flops'] == 3 * 2 * 8 * 4 * 3  # forward, d/dx, d/dw: each 2 m k n


def test_hlo_loop_cost_counts_loop_bodies_per_iteration():
  def f(x, ws):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]
  costs = {}
  for n in (3, 6):
    hlo = jax.jit(f).lower(jnp.ones((64, 256)), jnp.ones((n, 256, 256))).compile().as_text()
    costs[n] = hlo_cost.hlo_loop_cost(hlo)
  per_iteration = [(c['bytes'] - c['bytes_once']) / (n - 1) for n, c in costs.items()]
  # Per iteration: the weight slice (256 KiB; sliced, then read by the matmul) and the small
  # activations, not the whole stacked weights: the same for 3 and 6 layers.
  assert per_iteration[0] == per_iteration[1]
  assert 2 * 256 * 256 * 4 <= per_iteration[0] < 5 * 256 * 256 * 4


def test_largest_hlo_arrays_names_the_big_ones():
  cfg = tiny_fsdp()
  def f(x, w):
    return jnp.tanh(x @ w).sum()
  hlo = jax.jit(f).lower(jnp.ones((512, 1024)), jnp.ones((1024, 2048))).compile().as_text()
  arrays = aot.largest_hlo_arrays(hlo, cfg, 1)
  assert arrays[0]['shapes'].startswith('f32[') and arrays[0]['size'].endswith('MiB')
  assert {'f32[1024,2048]', 'f32[512,2048]'} & {a['shapes'] for a in arrays[:3]}


@pytest.fixture(scope='module')
def fitting_report():
  return aot.report(tiny_fsdp(), 'v5p:2x2x1', keep_hlo=True)


@pytest.mark.slow
@needs_libtpu
def test_compiles_for_four_chip_topology_with_fsdp(fitting_report):
  r = fitting_report
  assert r['devices'] == 4 and r['mesh'] == {'data': 1, 'fsdp': 4, 'tensor': 1, 'expert': 1}
  assert r['fits'] is True and r['message'].startswith('Fits')
  mem = r['memory']
  for k in ('arguments_bytes', 'outputs_bytes', 'temporaries_bytes', 'total_bytes',
            'state_bytes_per_device'):
    assert mem[k] > 0, k
  assert mem['total_bytes'] < mem['hbm_bytes_per_device']
  # Arguments: this device's quarter of params + optimizer state (TPU tiles pad the tiny model's
  # small dimensions), and its batch shard.
  assert mem['state_bytes_per_device'] <= mem['arguments_bytes'] < 3 * mem['state_bytes_per_device']
  assert r['batch']['per_device_batch'] == 4 and r['batch']['data_parallel_shards'] == 4
  # FSDP: parameters all-gathered for the forward/backward, gradients reduce-scattered.
  assert r['collectives']['all-gather'] > 0, r['collectives']
  assert r['collectives']['reduce-scatter'] > 0, r['collectives']
  assert 'all-gather' in r['_hlo']
  # XLA's FLOPs (scaled for loop trip counts) agree with the analytic count.
  cfg = tiny_fsdp()
  analytic = model_lib.train_flops_per_token(model_config(cfg.model), cfg.data.seq_len) * 16 * 128
  assert r['flops']['analytic_per_step'] == analytic
  assert 0.9 < r['flops']['xla_over_analytic'] < 1.5, r['flops']
  assert r['flops']['loop_scale'] > 1  # the scanned layers are a while loop
  rf = r['roofline']
  assert rf['step_seconds'] > 0 and 0 < rf['mfu'] <= 1 and rf['bound'] in ('compute', 'memory')
  assert r['compile_seconds']['compile'] > 0


@pytest.mark.slow
@needs_libtpu
def test_grad_accum_is_reported_and_fsdp_replicates_nothing(fitting_report):
  r = aot.report(tiny_fsdp(grad_accum=2), 'v5p:2x2x1')
  assert r['fits'] and r['batch']['grad_accum'] == 2 and r['batch']['per_device_micro_batch'] == 2
  # Same work per step; the micro-batch loop is one more while loop for XLA's cost analysis.
  assert r['flops']['xla_per_step'] == pytest.approx(fitting_report['flops']['xla_per_step'],
                                                     rel=0.1)


@pytest.mark.slow
@needs_libtpu
def test_too_big_batch_gets_a_clear_message():
  # 4096 sequences of 1024 tokens per chip: ~180 GiB of activations, a v5p chip has 95.
  r = aot.report(tiny_fsdp(seq_len=1024, batch_size=16384), 'v5p:2x2x1')
  assert r['fits'] is False
  assert 'Does NOT fit' in r['message'] and 'Largest buffers' in r['message']
  mem = r['memory']
  assert mem['required_bytes'] > mem['hbm_available_to_xla_bytes'] > 80 * 2**30
  assert mem['largest_buffers'], mem
  assert mem['largest_buffers'][0]['shapes']


def test_jaxpr_cost_counts_every_shard_of_a_shard_map():
  from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P
  mesh = AbstractMesh((4,), ('x',), axis_types=(AxisType.Explicit,))
  f = jax.shard_map(lambda a: a @ a.T, mesh=mesh, in_specs=P('x'), out_specs=P('x'))
  x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P('x')))
  with jax.sharding.use_abstract_mesh(mesh):
    cost = hlo_cost.jaxpr_cost(jax.make_jaxpr(f)(x))
  assert cost['flops'] == 4 * (2 * 4 * 4 * 8)  # 4 shards, each [4, 8] @ [8, 4]
