"""The experiment runner with --out on object storage (a real GCS API server): the runs train,
analyse and report there as in a local --out, and a second invocation trains nothing."""

import json

import pytest

from experiments import report, run
from gated_attention import storage
from tests.test_experiments import EXPERIMENT


@pytest.mark.slow   # ~35 s: a whole runner invocation (run with -m slow)
def test_the_runner_with_out_on_gcs(gcs, tmp_path, capsys):
  path, results = tmp_path / 'tiny.py', tmp_path / 'docs' / 'results.md'
  path.write_text(EXPERIMENT.replace("VARIANTS = ['baseline', 'g1_elementwise']",
                                     "VARIANTS = ['g1_elementwise']"))
  results.parent.mkdir()
  results.write_text('# Results\n')
  out = gcs.url('experiments/tiny')
  assert run.main([str(path), '--out', out, '--results', str(results),
                   f'--compilation-cache={tmp_path / "xla"}']) == 0
  workdir = storage.join(out, 'runs', 'g1_elementwise_s0')
  state = report.read_runner(workdir)
  assert state['status'] == 'done' and state['attempts'] == 1
  names = set(storage.listdir(workdir))
  assert {'config.json', 'checkpoints', 'metrics', 'analysis', 'runner.json',
          'train.log'} <= names, names
  assert 'step 10/10' in storage.read_text(storage.join(workdir, 'train.log'))
  assert {'results.md', 'summary.json', 'loss_curves.png'} <= set(storage.listdir(out))
  assert json.loads(storage.read_bytes(storage.join(out, 'summary.json')))
  assert (tmp_path / 'docs' / 'figures' / 'tiny' / 'loss_curves.png').exists()
  table = capsys.readouterr().out
  assert 'g1_elementwise' in table
  # Everything finished: the same command trains nothing and writes the same table.
  assert run.main([str(path), '--out', out, f'--compilation-cache={tmp_path / "xla"}']) == 0
  assert report.read_runner(workdir) == state
