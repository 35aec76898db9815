"""Odd or hostile objects in a run directory (issue 50), on a local disk and on gs://
(fake-gcs-server): an object under a metrics chunk's name (RUN/metrics/00000050.jsonl/inner made
it a "folder", and --mode=analyze and --mode=compare ended in a FileNotFoundError traceback), a
chunk under a shorter name, a file where the chunks' folder goes. Each is skipped with one
warning; the rows of the real chunks are read; a trainer resuming there numbers its chunks past
them."""

import json
import os
import shutil

import pytest

from gated_attention import storage
from gated_attention.runs import rundir
from tests.test_analysis import tiny_run  # noqa: F401  pylint: disable=unused-import

# pylint: disable=redefined-outer-name  (the fixtures)

ROWS = {1: [{'step': 101, 'split': 'train', 'loss': 1.5}],
        2: [{'step': 102, 'split': 'train', 'loss': 1.25}]}


def _copy(tiny_run, where, tmp_path, request) -> str:
  """A copy of the session's tiny trained run, on a local disk or on gs://."""
  if where == 'local':
    workdir = str(tmp_path / 'run')
    shutil.copytree(tiny_run, workdir)
    return workdir
  workdir = request.getfixturevalue('gcs').url('run')
  storage.upload_tree(tiny_run, workdir)
  return workdir


def _put(path: str, data: str):
  if not storage.is_remote(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  storage.write(path, data)


@pytest.fixture(params=['local', 'gcs'])
def odd_run(request, tiny_run, tmp_path):
  """The copy with two chunks (00000001.jsonl, and 2 under the name 2.jsonl) and a "folder"
  under the name of chunk 50: an object inside it."""
  workdir = _copy(tiny_run, request.param, tmp_path, request)
  chunks = storage.join(workdir, rundir.METRICS_DIR)
  for number, name in ((1, '00000001.jsonl'), (2, '2.jsonl')):
    _put(storage.join(chunks, name), ''.join(json.dumps(r) + '\n' for r in ROWS[number]))
  _put(storage.join(chunks, '00000050.jsonl', 'inner'), 'not a chunk')
  return workdir


def _warned(capsys, workdir) -> str:
  err = capsys.readouterr().err
  folder = storage.join(workdir, rundir.METRICS_DIR, '00000050.jsonl')
  assert f'Warning: {folder} is a folder, not a metrics chunk' in err, err
  return err


def test_readers_skip_a_folder_under_a_chunk_name_with_a_warning(odd_run, capsys):
  rows = rundir.read_metrics(odd_run)
  steps = {r['step'] for r in rows}
  assert {101, 102} <= steps and max(steps - {101, 102}) == 6   # the run's own rows too
  _warned(capsys, odd_run)
  rundir._warned.clear()  # pylint: disable=protected-access
  assert rundir.metrics_chunk_numbers(odd_run) == [1, 2, 50]   # the next chunk is 51


def test_compare_and_analyze_read_such_a_run(odd_run, capsys, tmp_path):
  """The issue's commands (in process): compare's table and analyze's report, one warning."""
  from gated_attention.modes import analyze as analyze_mode  # pylint: disable=g-import-not-at-top
  from gated_attention.modes import compare  # pylint: disable=g-import-not-at-top
  rundir._warned.clear()  # pylint: disable=protected-access
  table = compare.compare([odd_run], str(tmp_path / 'compare'))
  assert 'g1_elementwise' in table
  report = analyze_mode.run(odd_run, overrides={'data.val_batches': 1},
                            options={'attn_map_layers': '0'})
  assert report['step'] == 6
  err = _warned(capsys, odd_run)
  assert err.count('is a folder, not a metrics chunk') == 1     # once per process
  assert 'Traceback' not in err


def test_a_file_where_the_chunks_folder_goes_is_skipped(tiny_run, tmp_path, capsys):
  """Locally (a GCS emulator cannot hold an object and a prefix of one name)."""
  workdir = _copy(tiny_run, 'local', tmp_path, None)
  with open(os.path.join(workdir, rundir.METRICS_DIR), 'w') as f:
    f.write('x')
  rundir._warned.clear()  # pylint: disable=protected-access
  assert max(r['step'] for r in rundir.read_metrics(workdir)) == 6
  assert 'is a file, not the folder of metrics chunks; skipped' in capsys.readouterr().err


def test_a_trainer_resuming_there_numbers_its_chunks_past_them(tiny_run, gcs):
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from tests.test_analysis import tiny_run_config  # pylint: disable=g-import-not-at-top
  workdir = gcs.url('run')
  storage.upload_tree(tiny_run, workdir)
  _put(storage.join(workdir, rundir.METRICS_DIR, '00000050.jsonl', 'inner'), 'not a chunk')
  config = tiny_run_config()
  config.train.steps = 8
  loop.run(config, workdir)
  assert max(rundir.metrics_chunk_numbers(workdir)) > 50
  assert 8 in {r['step'] for r in rundir.read_metrics(workdir) if r['split'] == 'train'}
