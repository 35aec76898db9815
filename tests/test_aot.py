"""Ahead-of-time compilation for TPU topologies (gated_attention/compile/aot.py, tpu.py,
aot_long_context.py).

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
from gated_attention.compile import aot, aot_long_context, hlo_cost, memory, tpu
from gated_attention.training import fit
from gated_attention.errors import UserError
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
  assert tpu.parse_topology('v5p:4x4x4') == ('v5p', 'v5p:4x4x4')
  assert tpu.parse_topology('v5litepod:2x2') == ('v5e', 'v5e:2x2')
  for bad in ('v5p', 'h100:8', ''):
    with pytest.raises(ValueError, match='topology'):
      tpu.parse_topology(bad)


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


# ----------------------------------------------------------------------------------------------
# --fit_grad_accum (training/fit.py, shared with benchmarks/aot_table.py) and --plan=long_context


def test_grad_accum_candidates_keep_a_whole_sequence_per_device():
  assert fit.candidates(1024, 4) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
  assert fit.candidates(1024, 4, start=8) == [8, 16, 32, 64, 128, 256]  # the config's x 2^k
  assert fit.candidates(48, 4) == [1, 2, 4]     # 12 sequences a device: 8 does not divide them
  assert fit.candidates(6, 4) == []             # no whole number of sequences per shard
  assert fit.batch_shards(tiny_fsdp(), 4) == 4
  data_parallel = tiny_fsdp()
  data_parallel.mesh.update(data=2, fsdp=-1)
  assert fit.batch_shards(data_parallel, 8) == 8   # batch over data and fsdp


def test_walk_stops_at_the_first_fit_or_at_an_error():
  lines = []
  found, tried = fit.walk([1, 2, 4, 8, 16], lambda ga: {'fits': ga >= 4, 'message': f'{ga}'},
                          per_device_batch=64, log=lines.append)
  assert found.grad_accum == 4 and [a.grad_accum for a in tried] == [1, 2, 4]
  assert lines[0] == 'grad_accum=1 (64 seq/device per micro-batch): does NOT fit: 1'
  assert lines[2].startswith('grad_accum=4 (16 seq/device per micro-batch): fits')
  found, tried = fit.walk([1, 2, 4], lambda ga: {'fits': None if ga == 2 else False,
                                                 'error': 'compile timed out'}, 64, lines.append)
  assert found is None and [a.grad_accum for a in tried] == [1, 2]
  assert 'Stopped at grad_accum=2' in fit.none_fits(tried, 'here')


def _fake_compile(seen, max_micro_batch):
  """A stand-in for aot.report: fits when a device's micro-batch is at most max_micro_batch."""
  def compile_fn(cfg, topology):
    tc = cfg.train
    seen.append(tc.grad_accum)
    micro = tc.batch_size // 4 // tc.grad_accum
    return {'fits': micro <= max_micro_batch, 'topology': topology,
            'message': ('Fits: 1 GiB' if micro <= max_micro_batch else
                        f'Does NOT fit: {micro} sequences. Largest buffers: a; b')}
  return compile_fn


def test_fit_grad_accum_compiles_until_one_fits():
  seen, lines = [], []
  cfg = tiny_fsdp(batch_size=64, grad_accum=2)
  r = aot.fit_grad_accum(cfg, 'v5p:2x2x1', log=lines.append, num_devices=4,
                         compile_fn=_fake_compile(seen, max_micro_batch=2))
  assert seen == [2, 4, 8]   # the config's grad_accum, doubled: 8, 4, then 2 sequences a device
  assert r['fit_grad_accum']['grad_accum'] == 8 and r['fits'] is True
  assert [a['fits'] for a in r['fit_grad_accum']['attempts']] == [False, False, True]
  assert cfg.train.grad_accum == 2   # the caller's config is left alone
  assert lines[0].startswith('grad_accum=2 (8 seq/device per micro-batch): does NOT fit: 8 '
                             'sequences [')            # the verdict once, without the buffers
  assert 'Largest buffers' not in lines[0]
  assert lines[-1].endswith('v5p:2x2x1 (global batch 64, sequence 128, 4 data-parallel '
                            'shards): 8.')


def test_fit_grad_accum_names_the_largest_tried_when_none_fits():
  seen = []
  with pytest.raises(UserError) as e:
    aot.fit_grad_accum(tiny_fsdp(batch_size=64), 'v5p:2x2x1', log=lambda _: None, num_devices=4,
                       compile_fn=_fake_compile(seen, max_micro_batch=0))
  assert seen == [1, 2, 4, 8, 16]   # down to one sequence a device, not beyond
  text = str(e.value)
  assert 'tried 1, 2, 4, 8, 16; the largest, 16 (1 sequence(s) per device' in text
  assert 'a bigger slice' in text and '--config.model.remat=full' in text


def test_fit_grad_accum_stops_at_a_compile_error():
  def broken(cfg, topology):
    raise RuntimeError('Compiling tiny for v5p:2x2x1 failed: INTERNAL: something else')
  with pytest.raises(UserError, match='Stopped at grad_accum=1 .*INTERNAL: something else'):
    aot.fit_grad_accum(tiny_fsdp(batch_size=64), 'v5p:2x2x1', log=lambda _: None,
                       num_devices=4, compile_fn=broken)


def tiny_on_four(**train):
  cfg = tiny_fsdp(**train)
  cfg.memory.num_devices = 4
  return cfg


def test_memory_fit_grad_accum_is_the_smallest_whose_estimate_fits():
  totals = {ga: memory.report(tiny_on_four(batch_size=64, grad_accum=ga))['per_device']['total']
            ['bytes'] for ga in (1, 2, 4, 8, 16)}
  assert totals[2] > totals[4] > totals[8] > totals[16]
  cfg = tiny_on_four(batch_size=64)
  cfg.memory.device_memory_gib = (totals[4] + totals[8]) / 2 / 2**30   # 8 fits, 4 does not
  lines = []
  r = memory.fit_grad_accum(cfg, log=lines.append)
  assert r['fit_grad_accum']['grad_accum'] == 8 and r['batch']['grad_accum'] == 8
  assert r['per_device']['total']['bytes'] == totals[8] and r['fits'] is True
  assert [a['fits'] for a in r['fit_grad_accum']['attempts']] == [False, False, False, True]
  assert len(lines) == 5 and lines[3].startswith('grad_accum=8 (2 seq/device per micro-batch): '
                                                 'fits: ')
  cfg.memory.device_memory_gib = totals[16] / 2 / 2**30               # nothing fits
  with pytest.raises(UserError, match=r'tried 1, 2, 4, 8, 16; the largest, 16 \(1 sequence'):
    memory.fit_grad_accum(cfg, log=lambda _: None)
  cfg.memory.device_memory_gib = 0                                     # a CPU: no memory to fit
  with pytest.raises(UserError, match='set --config.memory.device_memory_gib'):
    memory.fit_grad_accum(cfg, log=lambda _: None)


def _long_context_config(length=1024, batch=2, devices=4):
  cfg = tiny_on_four()
  cfg.memory.num_devices = devices
  cfg.long_context.lengths = str(length)
  cfg.long_context.batch_size = batch
  return cfg


def test_long_context_estimate_counts_the_replicated_cache():
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  r = memory.long_context_report(_long_context_config())
  m = model_config(tiny_fsdp().model)
  cache = generate.init_cache(m, 2, 1024 + 64)       # what the evaluation allocates
  d = r['per_device']
  assert r['evaluation']['cache_length'] == 1024 + 64
  assert d['kv_cache']['bytes'] == cache['k'].nbytes + cache['v'].nbytes
  item = jnp.dtype(m.compute_dtype).itemsize   # float32 scores and probabilities, and the latter
  assert d['attention_scores_one_layer']['bytes'] == 2 * m.num_heads * 256 * 1088 * (8 + item)
  parts = ('params', 'kv_cache_in_and_out', 'attention_scores_one_layer', 'chunk_logits',
           'layer_weights_gathered')
  assert d['scoring_total']['bytes'] == sum(d[k]['bytes'] for k in parts)
  assert d['ruler_prefill_logits']['bytes'] == 2 * 2 * 1024 * m.vocab_size * 4
  # More devices split the parameters, not the cache; the batch multiplies the cache.
  one = memory.long_context_report(_long_context_config(devices=1))['per_device']
  assert one['params']['bytes'] == pytest.approx(4 * d['params']['bytes'], rel=0.05)
  assert one['kv_cache']['bytes'] == d['kv_cache']['bytes']
  four = memory.long_context_report(_long_context_config(batch=8))['per_device']
  assert four['kv_cache']['bytes'] == 4 * d['kv_cache']['bytes']


def test_long_context_step_is_the_evaluations_and_gives_the_cache_back_replicated():
  """The compiled scoring step (what --plan=long_context compiles for a TPU) on this machine's
  devices: the Generator's own jitted step, its cache in and out replicated."""
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  cfg = _long_context_config(length=512, batch=2)
  gen, _, args, lengths = aot_long_context.long_context_step(cfg, jax.devices())
  assert lengths == [512] and gen.max_len == 512 + 64 and args[1].shape == (2, 256)
  step = generate.Generator._chunk_scores  # pylint: disable=protected-access
  nll, argmax, kv = jax.eval_shape(lambda *a: step(gen, *a), *args)
  assert nll.shape == argmax.shape == (2, 256) and kv['k'].shape == args[4]['k'].shape
  assert args[4]['k'].sharding.is_fully_replicated


@pytest.mark.slow
@needs_libtpu
def test_long_context_step_compiles_for_a_topology_and_the_estimate_is_near():
  cfg = _long_context_config(length=4096, batch=8)
  r = aot_long_context.long_context_report(cfg, 'v5p:2x2x1')
  assert r['fits'] is True and r['message'].startswith('Fits')
  mem = r['memory']
  assert mem['total_bytes'] >= 2 * r['kv_cache_bytes_per_device']   # in and out
  assert r['ruler_total_bytes'] == mem['total_bytes'] + r['ruler_prefill_logits_bytes']
  estimate = memory.long_context_report(cfg)['per_device']['scoring_total']['bytes']
  assert 0.6 < estimate / mem['total_bytes'] < 1.4, (estimate, mem)


def test_aot_table_walks_like_fit_grad_accum_and_serves_only_this_codes_cache(tmp_path,
                                                                              monkeypatch):
  """benchmarks/aot_table.py's search: training/fit.py's walk over grad_accum on each slice
  (a fake compile: fits at 2 sequences a chip), results cached; an entry of other code is
  compiled again, and with cache_only an entry it lacks ends the search ("not computed")."""
  import argparse  # pylint: disable=g-import-not-at-top
  from benchmarks import aot_table  # pylint: disable=g-import-not-at-top
  compiled = []

  def fake_compile(variant, scale, topology, ga, extra, timeout, seq=4096, flags=None):
    compiled.append((topology, ga))
    micro = aot_table.BATCH // aot_table.chips(topology.split(':')[1]) // ga
    return {'fits': micro <= 2, 'message': f'{micro} a chip'}
  monkeypatch.setattr(aot_table, 'compile_one', fake_compile)
  monkeypatch.setattr(aot_table, 'CACHE', str(tmp_path / 'cache.json'))
  monkeypatch.setattr(aot_table, 'estimate_state_bytes', lambda scale, n: 0)
  args = argparse.Namespace(extra=(), timeout=1, code_tree='tree-a', used=set())
  cache = {'baseline|dense_1p7b_28l|v5p:2x2x1|128': {'fits': True, 'code_tree': 'tree-old'}}
  r, attempts = aot_table.search('baseline', 'dense_1p7b_28l', ['2x2x1'], cache, args,
                                 lambda _: None)
  assert r['fits'] and [ga for _, ga in compiled] == [1, 2, 4, 8, 16, 32, 64, 128]
  assert [a['fits'] for a in attempts] == [False] * 7 + [True]
  assert cache['baseline|dense_1p7b_28l|v5p:2x2x1|128']['code_tree'] == 'tree-a'  # recompiled
  compiled.clear()
  aot_table.search('baseline', 'dense_1p7b_28l', ['2x2x1'], cache, args, lambda _: None)
  assert not compiled                                   # all served from the cache now
  args.cache_only = True
  r, attempts = aot_table.search('g1_elementwise', 'dense_1p7b_28l', ['2x2x1', '2x2x2'], cache,
                                 args, lambda _: None)
  assert r is None and not compiled and attempts[-1]['error'] == aot_table.NOT_COMPUTED
  assert len(attempts) == 1                             # not on to the next slice
