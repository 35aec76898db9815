"""Sharding: rules, meshes (DCN layouts on fake devices), shardings on abstract meshes, the
memory report, and on 8 fake CPU devices (a subprocess, tests/sharding_worker.py): every preset,
dense and MoE, gives the single-device loss and gradients with parameters really split, and a
checkpoint saved on 8 devices restores onto 4 and onto 1."""

import json
import logging
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from gated_attention.config import scales
from gated_attention import cluster, sharding
from gated_attention.compile import memory
from gated_attention.training import train
from gated_attention.model import transformer as model_lib
from tests import xla
from tests.jax_helpers import model_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ('data_parallel', 'fsdp', 'fsdp_tensor', 'fsdp_expert')
CASES = [f'{kind}:{rules}' for kind in ('dense', 'moe') for rules in PRESETS]
# The MoE through the megablox grouped matmuls (Pallas interpreter) against the ragged_dot reference.
GMM_CASES = [f'moegmm:{rules}' for rules in PRESETS]
# A Qwen3-Next-like hybrid (Gated DeltaNet + attention, MoE with a gated shared expert): heads
# over tensor, experts over expert.
HYBRID_CASES = ['hybrid:fsdp_tensor', 'hybrid:fsdp_expert']


def _mesh_cfg(**sizes):
  c = scales.get_config('tiny').mesh
  c.update(data=1, fsdp=1, tensor=1, expert=1)
  c.update(**sizes)
  return c


# ----------------------------------------------------------------------------------------------
# Rules.


def _logical_names(cfg_model):
  _, state = nnx.split(model_lib.abstract_model(model_config(cfg_model)))
  names = set()
  for v in jax.tree.leaves(state, is_leaf=lambda v: isinstance(v, nnx.Variable)):
    names.update(sharding.param_logical_axes(v))
  return names


def test_every_parameter_has_logical_axes_and_the_rules_name_only_mesh_axes():
  known = {'layers', 'vocab', 'embed', 'heads', 'kv_heads', 'head_dim', 'mlp', 'expert',
           'expert_mlp', 'gate_out'}
  for scale, gate in (('tiny', 'g1'), ('tiny', 'g5'), ('moe_tiny', 'g2')):
    c = scales.get_config(scale)
    c.model.gate.position = gate
    _, state = nnx.split(model_lib.abstract_model(model_config(c.model)))
    for v in jax.tree.leaves(state, is_leaf=lambda v: isinstance(v, nnx.Variable)):
      axes = v.get_metadata().get('logical_axes')
      ndim = len(sharding.value_shape(v))
      assert axes is not None and len(axes) in (ndim, ndim - 1), (v, axes)
    assert _logical_names(c.model) <= known
  for rules in sharding.RULES.values():
    for target in rules.values():
      targets = (target,) if isinstance(target, str) else tuple(target or ())
      assert set(targets) <= set(sharding.MESH_AXES)
    assert rules['batch'] == sharding.BATCH
    assert 'layers' not in rules and 'head_dim' not in rules and 'seq' not in rules


def test_logical_to_spec_uses_each_mesh_axis_once_and_drops_what_does_not_divide():
  rules = sharding.RULES['fsdp_expert']
  assert sharding.logical_to_spec(('batch', 'seq', 'embed'), rules) == P(sharding.BATCH, None,
                                                                         None)
  assert sharding.logical_to_spec(('expert', 'embed', 'expert_mlp'), rules) == P(
      'expert', 'fsdp', None)
  shape = dict(data=1, fsdp=2, tensor=1, expert=4)
  # 6 is not divisible by 2*4: 'expert' is dropped there, then 'fsdp' divides it.
  assert sharding.logical_to_spec(('embed',), rules, (6,), shape) == P('fsdp')
  assert sharding.logical_to_spec(('embed',), rules, (3,), shape) == P(None)
  assert sharding.logical_to_spec(('batch',), rules, (4,), shape) == P(('data', 'fsdp'))
  with pytest.raises(ValueError, match='not one of'):
    sharding.get_rules('zero3')


def test_constrain_and_per_batch_shard_do_nothing_without_rules():
  x = np.arange(8.0).reshape(4, 2)
  assert sharding.constrain(x, ('batch', 'embed')) is x
  out = sharding.per_batch_shard(lambda a, k: a * k, x, 3)
  np.testing.assert_array_equal(out, x * 3)


# ----------------------------------------------------------------------------------------------
# Meshes and DCN device layouts (fake devices: the layout logic needs no real ones).


class FakeDevice:
  platform = 'cpu'
  device_kind = 'fake'

  def __init__(self, id_, process_index, slice_index=None):
    self.id, self.process_index = id_, process_index
    if slice_index is not None:
      self.slice_index = slice_index

  def __repr__(self):
    return f'D{self.id}p{self.process_index}'


def _devices(processes, per_process, slices=None):
  out = []
  for p in range(processes):
    for i in range(per_process):
      s = None if slices is None else p * slices // processes
      out.append(FakeDevice(p * per_process + i, p, s))
  return out


def _attr(arr, name):
  return np.vectorize(lambda d: getattr(d, name))(arr)


def test_mesh_shape_resolves_minus_one_and_rejects_bad_sizes():
  assert sharding.mesh_shape(_mesh_cfg(data=-1, fsdp=2), 8) == dict(data=4, fsdp=2, tensor=1,
                                                                    expert=1)
  assert sharding.mesh_shape(_mesh_cfg(fsdp=-1), 64)['fsdp'] == 64
  for cfg, match in ((_mesh_cfg(data=-1, fsdp=-1), 'at most one'),
                     (_mesh_cfg(data=3), 'needs 3 devices'),
                     (_mesh_cfg(data=-1, fsdp=3), 'not divisible'),
                     (_mesh_cfg(data=0), '>= 1'),
                     (_mesh_cfg(data=4, dcn_data=3), 'dcn_data=3')):
    with pytest.raises(ValueError, match=match):
      sharding.mesh_shape(cfg, 8 if 'dcn' not in match else 4)


def test_dcn_two_processes_is_the_hybrid_mesh_with_data_across_processes():
  devs = _devices(2, 4)
  arr = sharding.device_array(_mesh_cfg(data=2, dcn_data=2, fsdp=2, expert=2), devs)
  assert arr.shape == (2, 2, 1, 2)
  procs = _attr(arr, 'process_index')
  assert (procs[0] == 0).all() and (procs[1] == 1).all()   # the DCN axis is the process
  # More data parallelism inside each process too: data=4 -> (2 dcn) x (2 ici).
  arr = sharding.device_array(_mesh_cfg(data=4, dcn_data=2, fsdp=-1), devs)
  procs = _attr(arr, 'process_index')
  assert arr.shape == (4, 2, 1, 1)
  assert (procs[:2] == 0).all() and (procs[2:] == 1).all()


def test_dcn_groups_whole_processes_when_there_are_more_processes_than_groups():
  devs = _devices(4, 2)   # e.g. 4 GPU hosts, 2 data-parallel groups of 2 hosts
  arr = sharding.device_array(_mesh_cfg(data=2, dcn_data=2, fsdp=4), devs)
  procs = _attr(arr, 'process_index')
  assert set(procs[0].ravel()) == {0, 1} and set(procs[1].ravel()) == {2, 3}
  with pytest.raises(ValueError, match='divide the process count'):
    sharding.device_array(_mesh_cfg(data=2, dcn_data=2, fsdp=3), _devices(3, 2))


def test_dcn_within_one_process_splits_its_devices_contiguously():
  devs = _devices(1, 8)
  arr = sharding.device_array(_mesh_cfg(data=4, dcn_data=2, fsdp=2), devs)
  ids = _attr(arr, 'id')
  assert sorted(ids[:2].ravel()) == [0, 1, 2, 3] and sorted(ids[2:].ravel()) == [4, 5, 6, 7]
  # dcn_data=1 is jax's plain layout.
  arr = sharding.device_array(_mesh_cfg(data=-1), devs)
  assert _attr(arr, 'id').ravel().tolist() == list(range(8))


def test_dcn_uses_slices_when_devices_have_them(caplog):
  devs = _devices(4, 2, slices=2)   # 2 slices of 2 hosts each
  arr = sharding.device_array(_mesh_cfg(data=2, dcn_data=2, fsdp=4), devs)
  slices = _attr(arr, 'slice_index')
  assert (slices[0] == 0).all() and (slices[1] == 1).all()
  with pytest.raises(ValueError, match='span 2 slices'):
    sharding.device_array(_mesh_cfg(data=4, dcn_data=4, fsdp=2), devs)
  with caplog.at_level(logging.WARNING):
    sharding.device_array(_mesh_cfg(data=-1), devs)
  assert 'dcn_data' in caplog.text


def test_build_mesh_on_real_devices():
  mesh = sharding.build_mesh(_mesh_cfg(data=-1))
  assert mesh.axis_names == sharding.MESH_AXES
  assert mesh.devices.size == jax.device_count()


# ----------------------------------------------------------------------------------------------
# Shardings on an abstract mesh (no devices), as train.Setup builds them.


def _setup(scale, rules, n, **mesh):
  c = scales.get_config(scale)
  c.model.gate.position = 'g1'
  c.mesh.update(data=1, fsdp=1, tensor=1, expert=1, rules=rules)
  c.mesh.update(**mesh)
  return train.Setup(c, sharding.abstract_mesh(c.mesh, n))


def _specs(tree):
  return jax.tree.map(lambda x: x.sharding.spec, tree)


def test_setup_shardings_follow_the_rules_on_an_abstract_mesh():
  s = _setup('moe_tiny', 'fsdp_expert', 8, fsdp=2, expert=4)
  p = _specs(s.abstract_params)
  assert p['blocks']['ffn']['wi_gate'] == P(None, 'expert', 'fsdp', None)
  assert p['blocks']['ffn']['wo'] == P(None, 'expert', None, 'fsdp')
  assert p['blocks']['attn']['wq'] == P(None, ('fsdp', 'expert'), None, None)
  assert p['embed']['embedding'] == P(None, ('fsdp', 'expert'))
  assert s.batch_sharding.spec == P(sharding.BATCH, None)
  # AdamW's moments are sharded like their parameters; the step count is replicated.
  opt = s.abstract_opt
  adam = [x for x in jax.tree.leaves(opt, is_leaf=lambda x: hasattr(x, 'mu'))
          if hasattr(x, 'mu')][0]
  assert _specs(adam.mu) == p and _specs(adam.nu) == p
  assert adam.count.sharding.spec == P()

  t = _setup('tiny', 'fsdp_tensor', 8, data=2, fsdp=2, tensor=2)
  p = _specs(t.abstract_params)
  assert p['blocks']['attn']['wq'] == P(None, 'fsdp', 'tensor', None)
  assert p['blocks']['attn']['wo'] == P(None, 'tensor', None, 'fsdp')
  assert p['blocks']['attn']['gate']['kernel'] == P(None, 'fsdp', 'tensor', None)
  assert p['blocks']['ffn']['wi_gate'] == P(None, 'fsdp', 'tensor')
  assert p['embed']['embedding'] == P('tensor', 'fsdp')
  # kv_heads=2 does not divide by tensor=4: replicated there, not an error.
  u = _setup('tiny', 'fsdp_tensor', 8, data=1, fsdp=2, tensor=4)
  assert _specs(u.abstract_params)['blocks']['attn']['wk'] == P(None, 'fsdp', None, None)
  assert _specs(u.abstract_params)['blocks']['attn']['wq'] == P(None, 'fsdp', 'tensor', None)


# ----------------------------------------------------------------------------------------------
# --mode=memory.


def _memory_report(*overrides):
  out = subprocess.run(
      [sys.executable, 'main.py', '--config=configs/baseline.py:moe_15a2b', '--mode=memory',
       *overrides], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout)


@pytest.fixture(scope='module')
def moe_15a2b_on_64():
  return _memory_report('--config.memory.num_devices=64', '--config.memory.device_memory_gib=95')


def test_memory_report_moe_15a2b_on_64_devices(moe_15a2b_on_64):
  r = moe_15a2b_on_64
  assert r['devices'] == 64 and r['mesh'] == dict(data=1, fsdp=64, tensor=1, expert=1)
  assert r['batch']['micro_batch_per_device'] == 1024 // 64
  total = r['params_total']
  assert 15.0e9 < total < 16.0e9
  d = r['per_device']
  # Every parameter has an 'embed' dimension divisible by 64: fully split, float32.
  assert d['params']['bytes'] == pytest.approx(total * 4 / 64, rel=1e-3)
  assert d['opt_state']['bytes'] == pytest.approx(2 * d['params']['bytes'], rel=1e-3)
  assert d['grads']['bytes'] == d['params']['bytes']
  assert d['fsdp_transient']['bytes'] > 0   # under 'fsdp' a layer's 128 experts are gathered
  acts = r['activations']
  assert acts['configured']['remat'] == 'save_attention'   # as 'full' off TPU (no splash)
  assert acts['none']['peak']['bytes'] > 5 * acts['configured']['peak']['bytes']
  assert acts['configured']['saved_per_layer']['bytes'] == 16 * 4096 * 2048 * 2  # layer input
  parts = ('params', 'opt_state', 'grads', 'fsdp_transient', 'activations')
  assert abs(d['total']['bytes'] - sum(d[k]['bytes'] for k in parts)) <= len(parts)
  assert r['device_memory']['gib'] == 95.0
  assert r['fits'] == (d['total']['bytes'] <= r['device_memory']['bytes'])
  assert r['max_micro_batch_per_device_that_fits'] >= 1
  if not r['fits']:
    assert r['suggested_grad_accum'] > 1
  print(json.dumps(d))


def test_memory_report_in_process_small_config_and_mesh():
  c = scales.get_config('moe_tiny')
  c.model.gate.position = 'g1'
  c.mesh.update(data=2, fsdp=2, expert=2, rules='fsdp_expert')
  c.memory.num_devices = 8
  r = memory.report(c)
  s = _setup('moe_tiny', 'fsdp_expert', 8, data=2, fsdp=2, expert=2)
  expected = sum(int(np.prod(x.sharding.shard_shape(x.shape))) * 4
                 for x in jax.tree.leaves(s.abstract_params))
  assert r['per_device']['params']['bytes'] == expected
  assert r['mesh'] == dict(data=2, fsdp=2, tensor=1, expert=2)
  assert 'fits' not in r   # no device memory configured and a CPU here
  assert r['activations']['configured']['peak']['bytes'] > 0


def test_memory_report_of_a_hybrid_counts_its_layer_periods():
  """--mode=memory of a hybrid traces its scan's unit, a period of the layer pattern (3 DeltaNet
  layers, 1 attention layer): two periods save twice one period's activations, and the
  parameters are counted exactly."""
  reports = {}
  for layers in (4, 8):
    c = scales.get_config('hybrid_tiny')
    c.model.update(num_layers=layers, layer_types=scales.HYBRID_PERIOD * (layers // 4))
    c.memory.num_devices = 1
    reports[layers] = memory.report(c)
  one, two = (reports[n]['activations']['configured'] for n in (4, 8))
  assert one['saved_per_layer'] == two['saved_per_layer']
  assert two['saved']['bytes'] == one['saved']['bytes'] + one['saved_per_layer']['bytes']
  assert one['saved_per_layer']['bytes'] > 0
  for n, r in reports.items():
    c = scales.get_config('hybrid_tiny')
    c.model.update(num_layers=n, layer_types=scales.HYBRID_PERIOD * (n // 4))
    assert r['per_device']['params']['bytes'] == 4 * model_lib.param_report(
        model_config(c.model))['total']


# ----------------------------------------------------------------------------------------------
# cluster: process start-up.


def test_distributed_is_a_no_op_for_one_process_and_checks_the_config(monkeypatch):
  for v in ('JAX_COORDINATOR_ADDRESS', 'SLURM_STEP_ID', 'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE',
            'MEGASCALE_COORDINATOR_ADDRESS', 'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(v, raising=False)
  cfg = scales.get_config('tiny').distributed
  assert cluster.launcher() is None
  assert cluster.initialize(cfg) is False
  monkeypatch.setenv('SLURM_NTASKS', '1')
  monkeypatch.setenv('SLURM_STEP_ID', '0')
  assert cluster.launcher() is None   # a one-task SLURM job is a single process
  monkeypatch.setenv('SLURM_NTASKS', '16')
  assert cluster.launcher() == 'slurm'
  monkeypatch.delenv('SLURM_NTASKS')
  monkeypatch.setenv('TPU_WORKER_HOSTNAMES', 'host-0,host-1')
  assert cluster.launcher() == 'tpu'
  bad = scales.get_config('tiny').distributed
  bad.coordinator_address = 'localhost:1234'
  with pytest.raises(ValueError, match='num_processes'):
    cluster.initialize(bad)


# ----------------------------------------------------------------------------------------------
# 8 fake CPU devices, in a subprocess (XLA_FLAGS must be set before jax is imported).


@pytest.fixture(scope='module')
def eight_devices(tmp_path_factory):
  out = tmp_path_factory.mktemp('sharding') / 'results.json'
  env = dict(os.environ, XLA_FLAGS=xla.flags(), JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, os.path.join(REPO, 'tests', 'sharding_worker.py'),
                         str(out), *CASES, *GMM_CASES, *HYBRID_CASES, 'restore'], cwd=REPO, env=env,
                        capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-5000:]
  return json.loads(out.read_text())


@pytest.mark.parametrize('case', CASES + GMM_CASES + HYBRID_CASES)
def test_loss_and_gradients_match_one_device(eight_devices, case):
  r = eight_devices[case]
  assert r['loss'] == pytest.approx(r['ref_loss'], rel=1e-5)
  for k, v in r['ref_metrics'].items():
    if k.startswith('moe_') or k in ('loss', 'z_loss'):
      assert r['metrics'][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
  assert r['max_rel_grad_err'] < 2e-5, sorted(r['grad_errs'].items(), key=lambda kv: -kv[1])[:3]


def _shard(report, key):
  spec, shape, local = report[key]
  return spec, shape, local


# What each preset does to some parameters: {param: (spec, local shard shape)} on its mesh.
EXPECTED = {
    'data_parallel': {'blocks/attn/wq': ('P(None, None, None, None)', [2, 64, 4, 16])},
    'fsdp': {'blocks/attn/wq': ("P(None, 'fsdp', None, None)", [2, 16, 4, 16]),
             'embed/embedding': ("P(None, 'fsdp')", [128, 16])},
    'fsdp_tensor': {'blocks/attn/wq': ("P(None, 'fsdp', 'tensor', None)", [2, 32, 2, 16]),
                    'blocks/attn/gate/kernel': ("P(None, 'fsdp', 'tensor', None)", [2, 32, 2, 16]),
                    'embed/embedding': ("P('tensor', 'fsdp')", [64, 32])},
    'fsdp_expert': {'blocks/attn/wq': ("P(None, ('fsdp', 'expert'), None, None)", [2, 8, 4, 16])},
}
EXPECTED_MOE = {
    'data_parallel': ('P(None, None, None, None)', [2, 8, 64, 32]),
    'fsdp': ("P(None, None, 'fsdp', None)", [2, 8, 16, 32]),
    'fsdp_tensor': ("P(None, None, 'fsdp', 'tensor')", [2, 8, 32, 16]),
    'fsdp_expert': ("P(None, 'expert', 'fsdp', None)", [2, 2, 32, 32]),
}
EXPECTED_DENSE_MLP = {
    'data_parallel': ('P(None, None, None)', [2, 64, 128]),
    'fsdp': ("P(None, 'fsdp', None)", [2, 16, 128]),
    'fsdp_tensor': ("P(None, 'fsdp', 'tensor')", [2, 32, 64]),
    'fsdp_expert': ("P(None, ('fsdp', 'expert'), None)", [2, 8, 128]),
}


@pytest.mark.parametrize('case', CASES)
def test_parameters_gradients_and_batches_are_really_split(eight_devices, case):
  kind, rules = case.split(':')
  r = eight_devices[case]
  expected = dict(EXPECTED[rules])
  expected['blocks/ffn/wi_gate'] = (EXPECTED_MOE if kind == 'moe' else EXPECTED_DENSE_MLP)[rules]
  for key, (spec, local) in expected.items():
    got_spec, _, got_local = _shard(r['params'], key)
    assert (got_spec, got_local) == (spec, local), key
    assert _shard(r['grads'], key)[0] == spec, key   # gradients come out sharded the same way
  if rules != 'data_parallel':
    full = sum(int(np.prod(s)) for _, s, _ in r['params'].values())
    local = sum(int(np.prod(s)) for _, _, s in r['params'].values())
    assert local < full / 3   # most bytes are split
  # The batch is split over every device (data x fsdp x expert), 8 rows -> 1 per device,
  # except under fsdp_tensor where the 2 tensor devices share their rows.
  rows = _shard(r['batch'], 'inputs')[2][0]
  assert rows == (2 if rules == 'fsdp_tensor' else 1)
  # The optimizer state's moments are sharded like the parameters.
  mu = [v for k, v in r['opt_specs'].items() if k.endswith('blocks/ffn/wi_gate') and 'mu' in k]
  assert mu == [expected['blocks/ffn/wi_gate'][0]]


# The hybrid's layers (blocks/layer_<i>, stacked over 2 periods): {param: (spec, local shape)}.
EXPECTED_HYBRID = {
    'fsdp_tensor': {  # mesh data 2, fsdp 2, tensor 2: DeltaNet key / value heads over tensor
        'blocks/layer_0/linear_attn/wq': ("P(None, 'fsdp', 'tensor', None)", [2, 32, 1, 16]),
        'blocks/layer_0/linear_attn/wv': ("P(None, 'fsdp', 'tensor', None)", [2, 32, 2, 16]),
        'blocks/layer_0/linear_attn/conv_v': ("P(None, None, 'tensor', None)", [2, 4, 2, 16]),
        'blocks/layer_0/linear_attn/A_log': ("P(None, 'tensor')", [2, 2]),
        'blocks/layer_0/linear_attn/wo': ("P(None, 'tensor', None, 'fsdp')", [2, 2, 16, 32]),
        'blocks/layer_1/attn/wq': ("P(None, 'fsdp', 'tensor', None)", [2, 32, 2, 16]),
        'blocks/layer_0/ffn/wi_gate': ("P(None, None, 'fsdp', 'tensor')", [2, 8, 32, 16]),
    },
    'fsdp_expert': {  # mesh fsdp 2, expert 4: experts over expert
        'blocks/layer_0/ffn/wi_gate': ("P(None, 'expert', 'fsdp', None)", [2, 2, 32, 32]),
        'blocks/layer_1/ffn/wo': ("P(None, 'expert', None, 'fsdp')", [2, 2, 32, 32]),
        'blocks/layer_0/ffn/shared_gate': ("P(None, ('fsdp', 'expert'))", [2, 8]),
        'blocks/layer_0/linear_attn/wv': ("P(None, ('fsdp', 'expert'), None, None)",
                                          [2, 8, 4, 16]),
    },
}


@pytest.mark.parametrize('case', HYBRID_CASES)
def test_hybrid_heads_and_experts_are_split(eight_devices, case):
  """The hybrid shards over the same mesh axes: Gated DeltaNet heads over tensor, experts over
  expert (its gradients the same way), and its loss and gradients equal one device's (above)."""
  r = eight_devices[case]
  for key, (spec, local) in EXPECTED_HYBRID[case.split(':')[1]].items():
    assert _shard(r['params'], key)[0::2] == (spec, local), key
    assert _shard(r['grads'], key)[0] == spec, key


def test_checkpoint_restores_onto_a_different_mesh(eight_devices):
  r = eight_devices['restore']
  assert _shard(r['saved'], 'blocks/ffn/wi_gate')[0] == "P(None, 'expert', 'fsdp', None)"
  for n in ('4', '1'):
    assert r[n]['equal'], n
    assert r[n]['shardings_match'], n
    assert len(r[n]['devices']) == int(n)
  assert _shard(r['4']['params'], 'blocks/ffn/wi_gate')[0] == "P(None, None, 'fsdp', None)"
  assert _shard(r['4']['params'], 'blocks/ffn/wi_gate')[2] == [2, 8, 16, 32]
  assert _shard(r['1']['params'], 'blocks/ffn/wi_gate')[2] == [2, 8, 64, 32]
