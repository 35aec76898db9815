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
