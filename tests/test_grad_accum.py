"""train.grad_accum=auto (training/grad_accum.py): the step compiled on this session's devices at
1, 2, 4, ... until its memory fits the device's (faked here with config.memory.device_memory_gib:
the CPU reports none), one line saying what was chosen and why, the global batch and schedule
unchanged, the choice recorded in the run and kept when it resumes on the same devices."""

import json
import os

import jax
import numpy as np
import pytest

from gated_attention import sharding
from gated_attention.errors import UserError
from gated_attention.runs import rundir
from gated_attention.training import fit
from gated_attention.training import grad_accum
from gated_attention.training import loop
from gated_attention.training import train as train_lib
from tests import xla
from tests.test_train import read_metrics, tiny_config

GIB = 2 ** 30
STEPS = {'train.steps': 4, 'train.log_every': 1, 'train.eval_every': 4,
         'train.checkpoint_every': 4}


def _mesh(cfg):
  return sharding.build_mesh(cfg.mesh)


@pytest.fixture(scope='module')
def step_bytes():
  """The compiled step's bytes per device at grad_accum 1 and 2 (the tiny test model, batch 8)."""
  cfg = tiny_config(**STEPS)
  return {ga: grad_accum.compiled_bytes(train_lib.Setup(fit.with_grad_accum(cfg, ga), _mesh(cfg)))
          for ga in (1, 2)}


def test_the_compiled_step_needs_less_memory_with_more_micro_batches(step_bytes):
  assert step_bytes[1] > step_bytes[2] > 0


def _fake(bytes_by_ga):
  return lambda setup: bytes_by_ga[setup.cfg.train.grad_accum]


def test_the_walk_takes_the_smallest_that_fits_and_says_why(tmp_path):
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  cfg.memory.device_memory_gib = 50 / 1024   # 50 MiB
  lines = []
  sizes = {1: 90 * 2**20, 2: 60 * 2**20, 4: 40 * 2**20, 8: 30 * 2**20}
  out, setup, record = grad_accum.resolve(cfg, str(tmp_path), _mesh(cfg), say=lines.append,
                                          measure=_fake(sizes))
  assert out.train.grad_accum == 4 and setup.cfg.train.grad_accum == 4
  assert out.train.batch_size == cfg.train.batch_size and out.train.steps == cfg.train.steps
  assert out.train.learning_rate == cfg.train.learning_rate
  assert [a['grad_accum'] for a in record['attempts']] == [1, 2, 4]
  assert [a['fits'] for a in record['attempts']] == [False, False, True]
  assert record['devices'] == {'platform': 'cpu', 'kind': 'cpu', 'count': jax.device_count()}
  assert len(lines) == 1, lines
  line = lines[0]
  assert line.startswith('grad_accum=auto: 4 (2 sequence(s) per device per micro-batch)'), line
  assert ('the smallest whose compiled step fits config.memory.device_memory_gib (1: 0.09 GiB '
          'of 0.05 GiB per device, does not fit; 2: 0.06 GiB of 0.05 GiB per device, does not '
          'fit; 4: 0.04 GiB of 0.05 GiB per device)') in line, line
  assert 'global batch and the schedule are unchanged' in line


def test_a_step_the_compiler_refuses_does_not_fit(tmp_path):
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  cfg.memory.device_memory_gib = 1.0

  def measure(setup):
    if setup.cfg.train.grad_accum == 1:
      raise MemoryError('RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm')
    return 2 ** 20
  lines = []
  out, _, record = grad_accum.resolve(cfg, str(tmp_path), _mesh(cfg), say=lines.append,
                                      measure=measure)
  assert out.train.grad_accum == 2
  assert record['attempts'][0]['message'].startswith('refused by the compiler (RESOURCE_EXH')


def test_none_fits_is_one_paragraph_naming_the_largest_tried(tmp_path):
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  cfg.memory.device_memory_gib = 1e-6
  with pytest.raises(UserError, match=r'grad_accum=auto: No grad_accum fits on 1 x cpu .*tried '
                     r'1, 2, 4, 8; the largest, 8 \(1 sequence\(s\) per device'):
    grad_accum.resolve(cfg, str(tmp_path), _mesh(cfg), measure=lambda s: 2 ** 20)


def test_without_a_memory_limit_the_first_is_taken_and_said(tmp_path):
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  lines = []
  out, _, record = grad_accum.resolve(cfg, str(tmp_path), _mesh(cfg), say=lines.append,
                                      measure=lambda s: 2 ** 20)
  assert out.train.grad_accum == 1 and record['device_memory_gib'] is None
  assert 'the cpu devices report no memory limit, so the first candidate is taken' in lines[0]
  assert 'set --config.memory.device_memory_gib to fit one' in lines[0]


def _limit_between(step_bytes, small, large):
  """A device memory (GiB) that the step at grad_accum `large` fits and at `small` does not."""
  return (step_bytes[small] + step_bytes[large]) / 2 / GIB


@pytest.fixture(scope='module')
def auto_run(tmp_path_factory, step_bytes):
  """A run trained with grad_accum=auto under a fake limit that grad_accum=2 fits, 1 does not;
  and the same run with grad_accum=2 given."""
  root = tmp_path_factory.mktemp('auto')
  auto, given = str(root / 'auto'), str(root / 'given')
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  cfg.memory.device_memory_gib = _limit_between(step_bytes, 1, 2)
  loop.run(cfg, auto)
  loop.run(tiny_config(**STEPS, **{'train.grad_accum': 2}), given)
  return auto, given, cfg


def test_a_run_with_auto_trains_as_the_chosen_number_given(auto_run, capsys):
  auto, given, _ = auto_run
  with open(os.path.join(auto, rundir.CONFIG_FILE)) as f:
    saved = json.load(f)
  assert saved['train']['grad_accum'] == 2 and saved['train']['batch_size'] == 8
  record = rundir.read_grad_accum(auto)
  assert record['grad_accum'] == 2 and [a['fits'] for a in record['attempts']] == [False, True]
  assert record['limit_source'] == 'config.memory.device_memory_gib'
  a, g = read_metrics(auto), read_metrics(given)
  assert sorted(a) == sorted(g) == [1, 2, 3, 4]
  for step in a:   # the same run: the same losses, learning rates and norms
    for key in ('loss', 'learning_rate', 'grad_norm'):
      assert a[step][key] == g[step][key], (step, key)


def test_a_resumed_run_keeps_its_choice_on_the_same_devices(auto_run, capsys):
  auto, _, cfg = auto_run
  more = cfg.copy_and_resolve_references()
  more.train.steps = 6
  more.memory.device_memory_gib = 100.0          # now 1 would fit: the run's 2 is kept
  loop.run(more, auto)
  out = capsys.readouterr().out
  assert ('grad_accum=auto: 2, as chosen when this run started on these devices (1 x cpu; '
          f'{os.path.join(auto, rundir.GRAD_ACCUM_FILE)})') in out, out
  assert 'resuming at step 4' in out
  with open(os.path.join(auto, rundir.CONFIG_FILE)) as f:
    assert json.load(f)['train']['grad_accum'] == 2
  # on other devices (the record says 64 of them) it chooses again, and records that
  record = rundir.read_grad_accum(auto)
  record['devices']['count'] = 64
  rundir.write_grad_accum(auto, record)
  more.train.steps = 7
  loop.run(more, auto)
  out = capsys.readouterr().out
  assert 'grad_accum=auto: 1 (chosen again: this run chose 2 on 64 x cpu)' in out, out
  assert rundir.read_grad_accum(auto)['devices']['count'] == 1
  with open(os.path.join(auto, rundir.CONFIG_FILE)) as f:
    assert json.load(f)['train']['grad_accum'] == 1


def test_the_first_step_runs_the_step_compiled_to_choose(tmp_path, step_bytes):
  """No second compile: the first step after the walk reuses the chosen step's executable."""
  from jax._src import monitoring  # pylint: disable=g-import-not-at-top
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  cfg.memory.device_memory_gib = _limit_between(step_bytes, 1, 2)
  out, setup, _ = grad_accum.resolve(cfg, str(tmp_path), _mesh(cfg), say=lambda _: None)
  assert out.train.grad_accum == 2
  params, opt_state = setup.init(0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 250, (8, 33)).astype(np.int32)
  batch = setup.global_batch({'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
                              'loss_mask': np.ones((8, 32), np.float32)}, whole=True)
  compiles = []
  listener = lambda event, duration, **kw: compiles.append(event) if 'backend_compile' in event else None  # noqa: E731,E501
  monitoring.register_event_duration_secs_listener(listener)
  try:
    with jax.set_mesh(setup.mesh):
      _, _, metrics = setup.train_step(params, opt_state, batch, 1.0)
    assert np.isfinite(float(metrics['loss']))
  finally:
    monitoring.unregister_event_duration_listener(listener)
  assert not compiles, compiles


def test_other_modes_refuse_or_walk_auto():
  """A Setup never takes 'auto' (one paragraph naming where it is chosen)."""
  cfg = tiny_config(**STEPS)
  cfg.train.grad_accum = 'auto'
  with pytest.raises(Exception, match="grad_accum='auto' is chosen by --mode=train of one run"):
    train_lib.Setup(cfg, _mesh(cfg))


@pytest.mark.slow
def test_main_py_chooses_on_eight_devices(tmp_path):
  """`main.py --config.train.grad_accum=auto` on 8 (fake CPU) devices with FSDP: the walk's
  attempts on the real mesh, its one line, the choice in the run; and the paragraph when nothing
  fits, with nothing of the run written."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS=xla.flags(8),
             JAX_PLATFORMS='cpu')
  common = ['--config.train.grad_accum=auto', '--config.mesh.data=2', '--config.mesh.fsdp=4',
            '--config.mesh.rules=fsdp', '--config.train.batch_size=32', '--config.data.seq_len=32',
            '--config.model.num_layers=2', '--config.train.steps=2', '--config.train.log_every=1',
            '--config.train.eval_every=2', '--config.data.val_batches=1']
  nothing = str(tmp_path / 'nothing')
  out = subprocess.run([sys.executable, 'main.py', f'--workdir={nothing}', *common,
                        '--config.memory.device_memory_gib=1e-6'], cwd=root, env=env,
                       capture_output=True, text=True, timeout=900)
  text = ' '.join((out.stdout + out.stderr).split())
  assert out.returncode == 1 and 'Traceback' not in text, text
  assert ('--config.train.grad_accum=auto: No grad_accum fits on 8 x cpu (global batch 32, '
          'sequence 32, 8 data-parallel shards): tried 1, 2, 4') in text, text
  assert not os.path.exists(os.path.join(nothing, rundir.CONFIG_FILE))
  run = str(tmp_path / 'run')
  out = subprocess.run([sys.executable, 'main.py', f'--workdir={run}', *common,
                        '--config.memory.device_memory_gib=100'], cwd=root, env=env,
                       capture_output=True, text=True, timeout=900)
  text = ' '.join((out.stdout + out.stderr).split())
  assert out.returncode == 0, text
  assert ('grad_accum=auto: 1 (4 sequence(s) per device per micro-batch) on 8 x cpu (global '
          'batch 32, sequence 32, 8 data-parallel shards), the smallest whose compiled step fits '
          'config.memory.device_memory_gib (1: ') in text, text
  record = rundir.read_grad_accum(run)
  assert record['devices'] == {'platform': 'cpu', 'kind': 'cpu', 'count': 8}
  with open(os.path.join(run, rundir.CONFIG_FILE)) as f:
    assert json.load(f)['train']['grad_accum'] == 1
