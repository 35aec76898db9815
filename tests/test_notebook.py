"""notebooks/inspect_checkpoint.ipynb executes headless (nbclient) against a tiny run, so it
cannot rot. The run's directory reaches the notebook through GA_RUN_DIR."""

import json
import os

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')

from tests.test_analysis import make_tiny_run  # noqa: E402  pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, 'notebooks', 'inspect_checkpoint.ipynb')


def _execute(monkeypatch, env: dict):
  for k in ('GA_RUN_DIR', 'GA_TEXT', 'GA_RUN_ANALYSIS'):
    monkeypatch.delenv(k, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                   resources={'metadata': {'path': os.path.dirname(NOTEBOOK)}})
  client.execute()   # raises CellExecutionError, with the cell and traceback, if a cell fails
  texts, images = [], 0
  for cell in nb.cells:
    for out in cell.get('outputs', []):
      texts.append(out.get('text', ''))
      data = out.get('data', {})
      texts.append(data.get('text/markdown', '') + data.get('text/plain', ''))
      images += 'image/png' in data
  return '\n'.join(texts), images


def test_notebook_runs_against_a_tiny_run(tmp_path_factory, monkeypatch):
  run_dir = make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=True)
  text, images = _execute(monkeypatch, {'GA_RUN_DIR': run_dir, 'GA_TEXT': 'abc abc'})
  assert f'Run {run_dir}: g1_elementwise (tiny), checkpoint step 6' in text
  assert '| g1_elementwise | 6 |' in text                      # the analysis table
  assert '8 tokens; F-Attn of this text per layer' in text     # BOS + 7 bytes
  # loss curves + the analysis figures + the attention map of the text
  with open(os.path.join(run_dir, 'analysis', 'report.json')) as f:
    n_figures = len(json.load(f)['figures'])
  assert images == 1 + n_figures + 1


def test_notebook_runs_without_a_run(monkeypatch):
  text, images = _execute(monkeypatch, {})
  assert 'GA_RUN_DIR is not set' in text
  assert images == 1                                           # the attention map only


@pytest.fixture(scope='module')
def imported_tiny_release(tmp_path_factory):
  """A fake release at tiny's architecture (benchmarks/fake_release.py: random bf16 weights in
  the authors' headwise layout, a BPE tokenizer.json), imported into a run directory."""
  from benchmarks import fake_release  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('release')
  release, run = str(root / 'fake_tiny_headwise'), str(root / 'imported')
  fake_release.make(release, 'headwise', 2 * 10**9, scale='tiny')
  interop.import_run(release, run)
  return release, run


def test_notebook_on_an_imported_release(imported_tiny_release, monkeypatch):
  """The header names the scale the imported model is and where it came from; the analysis runs
  at the import's own settings from the weights the notebook loaded (analyze.loaded)."""
  release, run = imported_tiny_release
  text, images = _execute(monkeypatch, {'GA_RUN_DIR': run, 'GA_TEXT': 'abc'})
  assert f'Run {run}: g1_headwise (tiny, imported from {release}), checkpoint step 0' in text
  assert '| g1_headwise | 0 |' in text                          # the analysis table
  with open(os.path.join(run, 'analysis', 'report.json')) as f:
    report = json.load(f)
  assert report['step'] == 0 and report['num_batches'] == 4     # tiny's own data settings
  nb = nbformat.read(NOTEBOOK, as_version=4)
  code = '\n'.join(c.source for c in nb.cells if c.cell_type == 'code')
  assert 'analyze.loaded(run)' in code and 'analyze.run(' not in code


def test_the_analysis_of_a_loaded_run_reads_no_weights_again(imported_tiny_release, tmp_path,
                                                               monkeypatch):
  """analyze.loaded (the notebook's) gives what --mode=analyze gives, with every checkpoint read
  refused after the run was opened."""
  from gated_attention.modes import analyze  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import checkpoint, rundir  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.factory import ModelFactory  # pylint: disable=g-import-not-at-top
  _, run = imported_tiny_release
  by_mode = analyze.run(run, out_dir=str(tmp_path / 'by_mode'))
  opened = rundir.load_run(run)

  def refused(*args, **kwargs):
    raise AssertionError('the weights were read again')
  monkeypatch.setattr(ModelFactory, 'restore', refused)
  monkeypatch.setattr(checkpoint.Checkpointer, '__init__', refused)
  loaded = analyze.loaded(opened, out_dir=str(tmp_path / 'loaded'))
  for key in ('f_attn', 'm_act_mean', 'gate_score_mean', 'ppl', 'num_batches'):
    assert loaded[key] == by_mode[key], key
