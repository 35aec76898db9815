"""The experiment runner with --out on object storage (a real GCS API server): the runs train,
analyse and report there as in a local --out, and a second invocation trains nothing."""

import json
import os
import tempfile

import pytest

from experiments import processes, rundata, run, running
from gated_attention import storage
from gated_attention.runs import rundir as runs_lib
from tests.test_experiments import EXPERIMENT


def test_command_logs_on_gcs_are_uploaded_whole(gcs, tmp_path, monkeypatch):
  """A command's log on gs:// (no append there): written to a local file, uploaded whole when
  the command ends, appended to by the next command; the failure is read from it."""
  local_tmp = tmp_path / 'tmp'
  local_tmp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(local_tmp))
  log = storage.join(gcs.url('out/runs/a'), 'train.log')
  first = ['-c', 'print("first command")']
  assert processes.call(first, log)[0] == 0
  assert storage.read_text(log).endswith('first command\n')
  second = ['-c', 'import sys; print("Training stopped at step 3"); sys.exit(3)']
  assert processes.call(second, log)[0] == 3
  text = storage.read_text(log)
  assert text.index('first command') < text.index('Training stopped at step 3')
  assert text.count('\n$ ') == 2                        # each command's line, then its output
  assert processes.failure(log, 3) == 'diverged'
  assert os.listdir(local_tmp) == []                      # the local copies are removed
  # A local log is appended to in place, as before.
  local = tmp_path / 'train.log'
  assert processes.call(['-c', 'raise SystemExit(2)'], str(local))[0] == 2
  assert processes.failure(str(local), 2) == 'failed (exit 2)'


def test_compilation_cache_is_local_when_out_is_remote(tmp_path):
  remote = running.cache_dir('gs://bucket/out', '')
  assert not storage.is_remote(remote) and os.path.isabs(remote)
  assert running.cache_dir(str(tmp_path), '') == os.path.join(str(tmp_path), 'xla_cache')
  assert running.cache_dir('gs://bucket/out', 'off') == ''
  assert running.cache_dir('gs://bucket/out', str(tmp_path / 'x')) == str(tmp_path / 'x')


@pytest.mark.slow   # ~40 s: a whole runner invocation (run with -m slow)
def test_the_runner_with_out_on_gcs(gcs, tmp_path, capsys, monkeypatch):
  path, results = tmp_path / 'tiny.py', tmp_path / 'docs' / 'results.md'
  path.write_text(EXPERIMENT.replace("VARIANTS = ['baseline', 'g1_elementwise']",
                                     "VARIANTS = ['g1_elementwise']"))
  results.parent.mkdir()
  results.write_text('# Results\n')
  out = gcs.url('experiments/tiny')
  assert run.main([str(path), '--out', out, '--results', str(results),
                   f'--compilation-cache={tmp_path / "xla"}']) == 0
  workdir = storage.join(out, 'runs', 'g1_elementwise_s0')
  state = rundata.read_runner(workdir)
  assert state['status'] == 'done' and state['attempts'] == 1
  assert f'--workdir={workdir}' in state['command']
  names = set(storage.listdir(workdir))
  assert {'config.json', 'checkpoints', 'metrics', 'analysis', 'runner.json',
          'train.log'} <= names, names
  assert runs_lib.latest_step(workdir) == 10
  assert any(r.get('step') == 10 for r in runs_lib.read_metrics(workdir))
  analysis = storage.join(workdir, runs_lib.ANALYSIS_DIR, runs_lib.REPORT_FILE)
  assert json.loads(storage.read_bytes(analysis))['step'] == 10
  assert 'step 10/10' in storage.read_text(storage.join(workdir, 'train.log'))
  assert {'results.md', 'summary.json', 'loss_curves.png'} <= set(storage.listdir(out))
  assert json.loads(storage.read_bytes(storage.join(out, 'summary.json')))
  assert '| g1_elementwise | 1/1 |' in storage.read_text(storage.join(out, 'results.md'))
  assert (tmp_path / 'docs' / 'figures' / 'tiny' / 'loss_curves.png').exists()   # local docs/
  assert '| g1_elementwise | 1/1 |' in results.read_text()
  assert '| g1_elementwise | 1/1 |' in capsys.readouterr().out
  # Everything finished: the same command runs no main.py command and writes the same table.
  def no_command(args, log):
    raise AssertionError(f'ran {args} into {log}')
  monkeypatch.setattr(processes, 'call', no_command)
  assert run.main([str(path), '--out', out, f'--compilation-cache={tmp_path / "xla"}']) == 0
  assert rundata.read_runner(workdir) == state
  assert '| g1_elementwise | 1/1 |' in capsys.readouterr().out
