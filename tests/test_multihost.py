"""Two processes on localhost (4 CPU devices each, gloo collectives, jax.distributed) train through
loop.run and report the same losses as one process with 8 devices (the same global stream);
only process 0 writes logs; the checkpoint is written by both and a resumed run continues
exactly. The pod's events (signals, lost processes, other slice sizes) are
tests/test_multihost_faults.py's.

Each process is tests/multihost_worker.py, started with its own XLA_FLAGS; the coordinator binds
127.0.0.1 on a free port; every wait is bounded.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, 'tests', 'multihost_worker.py')
TIMEOUT = 420
STEPS = 3


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(port=None):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  for v in ('XLA_FLAGS', 'JAX_COORDINATOR_ADDRESS', 'SLURM_STEP_ID', 'OMPI_COMM_WORLD_SIZE',
            'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS'):
    env.pop(v, None)
  if port:
    env['JAX_COORDINATOR_BIND_ADDRESS'] = f'127.0.0.1:{port}'   # loopback only
  return env


def _run_all(commands):
  """Starts every (argv, env, log) at once; waits for all, bounded; kills the rest on failure."""
  procs = []
  for argv, env, log in commands:
    procs.append((subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT),
                  log))
  try:
    for p, _ in procs:
      p.wait(timeout=TIMEOUT)
  finally:
    for p, _ in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for (p, log), (argv, _, _) in zip(procs, commands):
    if p.returncode != 0:
      log.seek(0)
      tail = log.read()[-4000:]
      raise AssertionError(f'{" ".join(argv[1:3])} exited {p.returncode}:\n{tail}')


def _run(tmp_path, mode):
  port = _free_port()
  workdir = tmp_path / 'run'
  outs = [tmp_path / f'process{i}.json' for i in range(2)] + [tmp_path / 'reference.json']
  logs = [open(tmp_path / f'log{i}.txt', 'w+') for i in range(3)]
  commands = [([sys.executable, WORKER, mode, str(outs[i]), str(workdir), '4', str(port), '2',
                str(i)], _env(port), logs[i]) for i in range(2)]
  commands.append(([sys.executable, WORKER, 'reference', str(outs[2]), str(tmp_path / 'ref'),
                    '8'], _env(), logs[2]))
  try:
    _run_all(commands)
  finally:
    for log in logs:
      log.close()
  results = [json.loads(p.read_text()) for p in outs]
  return workdir, results, [(tmp_path / f'log{i}.txt').read_text() for i in range(2)]


@pytest.fixture(scope='module')
def loop_run(tmp_path_factory):
  return _run(tmp_path_factory.mktemp('multihost'), 'loop')


def _rows(workdir):
  with open(workdir / 'metrics.jsonl') as f:
    return [json.loads(line) for line in f]


def test_two_processes_train_like_one_process_with_eight_devices(loop_run):
  workdir, (p0, p1, ref), _ = loop_run
  assert p0['cpu_collectives'] == 'gloo' and (p0['process_index'], p1['process_index']) == (0, 1)
  train = {r['step']: r['loss'] for r in _rows(workdir) if r['split'] == 'train'}
  assert sorted(train) == list(range(1, STEPS + 2))   # 3 steps, then 1 more after resuming
  assert [train[s] for s in sorted(train)] == pytest.approx(ref['losses'], rel=1e-5)
  # Evaluation: both processes return the same validation loss as the reference.
  assert p0['val']['loss'] == p1['val']['loss']
  assert p0['val']['loss'] == pytest.approx(ref['val_loss'], rel=1e-5)
  # The reference really used 8 devices in one process, the data axis across its two halves.
  assert ref['wi_gate_processes'] == [0] and ref['local_batch_rows'] == 8


def test_only_process_zero_writes_logs_and_checkpoints_are_coordinated(loop_run):
  workdir, (p0, p1, _), (log0, log1) = loop_run
  rows = _rows(workdir)
  assert len(rows) == len({(r['step'], r['split']) for r in rows})   # no row written twice
  assert f'step {STEPS}/{STEPS}' in log0 and 'val loss' in log0
  assert f'step {STEPS}/{STEPS}' not in log1 and 'val loss' not in log1
  assert p0['val_resumed'] == p1['val_resumed']
  assert 'resuming at step 3' in log0
  ckpt = workdir / 'checkpoints'
  assert sorted(os.listdir(ckpt)) == [str(STEPS), str(STEPS + 1)]
  # One data position for every process (issue 45: the global stream); both wrote array shards.
  data = sorted(os.listdir(ckpt / str(STEPS) / 'data'))
  assert 'position.json' in data and not [n for n in data if n.startswith('process_')]
  state = os.listdir(ckpt / str(STEPS) / 'state')
  assert 'ocdbt.process_0' in state and 'ocdbt.process_1' in state


@pytest.mark.slow
def test_setup_path_shards_over_both_processes(tmp_path):
  """train.Setup + build_data directly: the mesh's data axis is the process (DCN split), the
  parameters span both processes, each process feeds half of the global batch."""
  _, (p0, p1, ref), _ = _run(tmp_path, 'steps')
  assert p0['losses'] == pytest.approx(ref['losses_per_process_streams'], rel=1e-5)
  assert p1['losses'] == p0['losses']
  layout = p0['mesh_process_layout']   # (data, fsdp, tensor, expert) -> process index
  assert {x for row in layout[0] for y in row for x in y} == {0}
  assert {x for row in layout[1] for y in row for x in y} == {1}
  assert p0['wi_gate_processes'] == [0, 1] and p0['local_batch_rows'] == 4
  assert p0['wi_gate_spec'] == "P(None, 'expert', 'fsdp', None)"


@pytest.mark.slow   # 25-35 s: two more jax.distributed processes (run with -m slow)
def test_two_processes_write_one_run_on_object_storage(loop_run, gcs, tmp_path):
  """The same two-process run (and its resumption) with the run directory on gs:// (a real GCS
  API server, tests/gcs_server.py): both processes write array shards and their data positions
  there, process 0 the metrics chunks; the losses are the local run's, bitwise."""
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  local, (local0, _, _), _ = loop_run
  port, workdir = _free_port(), gcs.url('run')
  outs = [tmp_path / f'process{i}.json' for i in range(2)]
  logs = [open(tmp_path / f'log{i}.txt', 'w+') for i in range(2)]
  try:
    _run_all([([sys.executable, WORKER, 'loop', str(outs[i]), workdir, '4', str(port), '2',
                str(i)], _env(port), logs[i]) for i in range(2)])
  finally:
    for log in logs:
      log.close()
  p0, p1 = (json.loads(p.read_text()) for p in outs)
  rows = rundir.read_metrics(workdir, every_row=True)
  assert len(rows) == len({(r['step'], r['split']) for r in rows})   # no row written twice
  def losses(rs):
    return {(r['step'], r['split']): r['loss'] for r in rs if 'loss' in r}
  assert losses(rows) == losses(_rows(local))
  assert p0['val'] == local0['val'] and p0['val_resumed'] == p1['val_resumed']
  ckpt = storage.join(workdir, 'checkpoints')
  assert storage.listdir(ckpt) == [str(STEPS), str(STEPS + 1)]
  data = storage.listdir(storage.join(ckpt, str(STEPS), 'data'))
  assert 'position.json' in data and not [n for n in data if n.startswith('process_')]
  state = storage.listdir(storage.join(ckpt, str(STEPS), 'state'))
  assert 'ocdbt.process_0' in state and 'ocdbt.process_1' in state


@pytest.mark.slow   # two more jax.distributed processes, and a refused single-process resume
def test_runs_saved_with_a_stream_per_process_resume_with_their_process_count(tmp_path):
  """Runs saved by several processes before issue 45 hold a data position per process, of a
  stream per process: they resume so (the losses of those streams) with the same process count,
  and another count is refused before anything is written."""
  from gated_attention.errors import CheckpointError  # pylint: disable=g-import-not-at-top
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from tests import multihost_worker  # pylint: disable=g-import-not-at-top
  port, workdir = _free_port(), tmp_path / 'run'
  outs = [tmp_path / f'process{i}.json' for i in range(2)] + [tmp_path / 'reference.json']
  logs = [open(tmp_path / f'log{i}.txt', 'w+') for i in range(3)]
  commands = [([sys.executable, WORKER, 'legacy', str(outs[i]), str(workdir), '4', str(port),
                '2', str(i)], _env(port), logs[i]) for i in range(2)]
  commands.append(([sys.executable, WORKER, 'reference', str(outs[2]), str(tmp_path / 'ref'),
                    '8'], _env(), logs[2]))
  try:
    _run_all(commands)
  finally:
    for log in logs:
      log.close()
  ref = json.loads(outs[2].read_text())
  train = {r['step']: r['loss'] for r in _rows(workdir) if r['split'] == 'train'}
  assert [train[s] for s in sorted(train)][:STEPS] == pytest.approx(
      ref['losses_per_process_streams'], rel=1e-5)
  data = sorted(os.listdir(workdir / 'checkpoints' / str(STEPS + 1) / 'data'))
  assert 'process_0-of-2.json' in data and 'process_1-of-2.json' in data   # still per process
  before = sorted(os.listdir(workdir / 'checkpoints'))
  with pytest.raises(CheckpointError, match='saved by 2 processes, each reading its own data'):
    loop.run(multihost_worker.config(steps=STEPS + 2), str(workdir))
  assert sorted(os.listdir(workdir / 'checkpoints')) == before
