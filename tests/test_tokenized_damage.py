"""Damaged pre-tokenized shards (issue 50, input_pipeline/shard_checks.py), on a local disk and on
gs:// (fake-gcs-server): a rerun of --mode=tokenize finds and rewrites them (it kept a shard cut
to a third, trusting its counts file); training refuses them in one paragraph naming the shard
(it ended in `RuntimeError: ArrayRecord file should be at least 64KB big` and a traceback).
Issue 57: a shard changed in place, its size the same (64 bytes flipped), is found by its content
checksum (crc32c) by the rerun and at the start of training, and a run that meets one mid-way is
told the command that rewrites it (the rerun kept it, and the advice did nothing)."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from gated_attention import input_pipeline
from gated_attention import storage
from gated_attention.input_pipeline import shard_checks
from gated_attention.input_pipeline import tokenized
from gated_attention.input_pipeline.errors import DataError
from tests.test_tokenized import REPO, _cfg, _files, corpus  # noqa: F401  pylint: disable=W0611

# pylint: disable=redefined-outer-name  (the fixtures)

SHARD = 'train-00002-of-00007.arrayrecord'
COUNTS = 'train-00002-of-00007.json'


@pytest.fixture(params=['local', 'gcs'])
def folder(request, corpus, tmp_path):
  """A tokenized folder of the corpus (8 shards), and its files' bytes as written."""
  out = (request.getfixturevalue('gcs').url('tokens') if request.param == 'gcs'
         else str(tmp_path / 'tokens'))
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  return out, _files(out)


def _put(out, name, data: bytes):
  storage.write(storage.join(out, name), data)


DAMAGE = {
    'truncated to a third': (SHARD, lambda b: b[:len(b) // 3], 'bytes, its counts file says'),
    'emptied': (SHARD, lambda b: b'', 'bytes, its counts file says'),
    'counts file cut short': (COUNTS, lambda b: b[:len(b) // 2], 'it holds'),
    'truncated, counts file gone': (SHARD, lambda b: b[:len(b) // 3], 'cannot be read'),
}


@pytest.mark.parametrize('case', list(DAMAGE))
def test_a_rerun_of_tokenize_rewrites_a_damaged_shard(case, folder, corpus, capsys):
  out, written = folder
  name, damage, why = DAMAGE[case]
  _put(out, name, damage(written[name]))
  if case == 'truncated, counts file gone':
    storage.remove(storage.join(out, COUNTS))
  if case == 'counts file cut short':   # an unreadable counts file: the shard is read back
    why = None
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  err = capsys.readouterr().err
  if why is not None:
    assert f'Warning: {storage.join(out, SHARD)} is damaged (' in err and why in err, err
    assert 'writing it again' in err
  assert _files(out) == written          # byte for byte what the first run wrote


def test_a_shard_of_another_size_than_its_counts_file_says_is_rewritten(folder, corpus, capsys):
  """Bytes appended (a copy gone wrong): the listing's size differs from the counts file's."""
  out, written = folder
  _put(out, SHARD, written[SHARD] + b'\0' * 10)
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  assert (f'is damaged (it holds {len(written[SHARD]) + 10} bytes, its counts file says '
          f'{len(written[SHARD])})') in capsys.readouterr().err
  assert _files(out) == written


def test_training_refuses_a_truncated_shard_before_any_batch(folder, corpus):
  out, written = folder
  _put(out, SHARD, written[SHARD][:len(written[SHARD]) // 3])
  with pytest.raises(DataError, match=f'holds 1 damaged shard.*{SHARD} '
                     rf'\({len(written[SHARD]) // 3} bytes, written with {len(written[SHARD])}\)'
                     r'.*Nothing was trained.*run `python main.py --mode=tokenize .*--out=.*` \(the '
                     'command that wrote the folder\\): it checks every shard'
                     ) as e:
    input_pipeline.build_data(_cfg(corpus, source='tokenized', path=out), global_batch_size=4,
                              seed=0)
  assert '\n' not in str(e.value)
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)   # the fix it names
  data = input_pipeline.build_data(_cfg(corpus, source='tokenized', path=out),
                                   global_batch_size=4, seed=0)
  for _ in range(30):
    next(data.train_iter)


def test_main_py_trains_from_a_damaged_gcs_folder_in_one_paragraph(corpus, gcs):
  """The issue's case through main.py: exit 1, one paragraph naming the shard, no traceback."""
  out = gcs.url('tokens')
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  raw = storage.read_bytes(storage.join(out, SHARD))
  _put(out, SHARD, raw[:len(raw) // 3])
  done = subprocess.run(
      [sys.executable, 'main.py', '--config=configs/g1_elementwise.py',
       f'--workdir={gcs.url("run")}', '--config.data.source=tokenized',
       f'--config.data.path={out}', '--config.data.val_fraction=0.1',
       '--config.model.num_layers=1', '--config.model.hidden_size=32',
       '--config.model.head_dim=16', '--config.model.ffn_size=64', '--config.data.seq_len=16',
       '--config.train.batch_size=4', '--config.train.steps=2'],
      cwd=REPO, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, capture_output=True, text=True,
      timeout=300)
  assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
  assert 'Traceback' not in done.stderr
  message = ' '.join(done.stderr.split())
  assert f'{storage.join(out, SHARD)}' in message or SHARD in message, message
  assert 'damaged shard' in message and 'step 1/' not in done.stdout


# Changed in place, the same size (issue 57) --------------------------------------------------------

def _flipped(raw: bytes) -> bytes:
  """64 bytes XORed inside the records' chunk (the start of the file), the size unchanged."""
  out = bytearray(raw)
  for i in range(200, 264):
    out[i] ^= 0x5A
  return bytes(out)


def test_a_rerun_of_tokenize_rewrites_a_shard_changed_in_place(folder, corpus, capsys):
  """Before: the rerun exited 0 with no warning and left it (size and record count agree)."""
  out, written = folder
  _put(out, SHARD, _flipped(written[SHARD]))
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  err = capsys.readouterr().err
  assert (f'Warning: {storage.join(out, SHARD)} is damaged (its content checksum (crc32c) is '
          in err and 'bytes changed in place); writing it again' in err), err
  assert _files(out) == written          # byte for byte what the first run wrote


def test_training_refuses_a_shard_changed_in_place_before_any_batch(folder, corpus):
  """gs://: the listing's crc32c (GCS's own) against the manifest's; a small local folder: read
  once. Before: training started, and stopped wherever the record was read."""
  out, written = folder
  _put(out, SHARD, _flipped(written[SHARD]))
  manifest = json.loads(written[tokenized.MANIFEST])
  want = next(s['crc32c'] for s in manifest['shards']['train'] if s['name'] == SHARD)
  with pytest.raises(DataError, match=f'holds 1 damaged shard.*{SHARD} \\(content checksum '
                     f'crc32c .* written with {want}: bytes changed in place\\).*Nothing was '
                     'trained.*--mode=tokenize'):
    input_pipeline.build_data(_cfg(corpus, source='tokenized', path=out), global_batch_size=4,
                              seed=0)


def test_a_folder_of_older_code_without_checksums_is_read_back(corpus, tmp_path, capsys):
  """Counts files and a manifest without crc32c (written before issue 57): the rerun reads each
  shard back whole (array_record checks its chunks' hashes), rewrites the flipped one and adds
  the checksums; the folder is then the one this code writes, byte for byte."""
  out = str(tmp_path / 'tokens')
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  written = _files(out)
  for name, raw in written.items():
    if name.endswith('.json'):
      data = json.loads(raw)
      for entry in ([data] if name != tokenized.MANIFEST
                    else data['shards']['train'] + data['shards']['val']):
        entry.pop('crc32c')
      _put(out, name, json.dumps(data, indent=1, sort_keys=name != tokenized.MANIFEST))
  _put(out, SHARD, _flipped(written[SHARD]))
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  err = capsys.readouterr().err
  assert f'{SHARD} is damaged (it cannot be read' in err, err
  assert _files(out) == written


def test_a_shard_damaged_mid_run_names_the_command_that_repairs_it(corpus, tmp_path,
                                                                     monkeypatch):
  """A local folder above LOCAL_CHECK_BYTES is checked by size at the start: the flipped record
  is met mid-run. The error names the shard and a command; that command, run as written, finds
  the shard, rewrites it, and training reads every record. Before: "run the --mode=tokenize
  command again: it rewrites a damaged one", which kept it."""
  out = str(tmp_path / 'tokens')
  tokenized.tokenize(_cfg(corpus), out, workers=1, progress=False)
  written = _files(out)
  _put(out, SHARD, _flipped(written[SHARD]))
  monkeypatch.setattr(shard_checks, 'LOCAL_CHECK_BYTES', 0)
  data = input_pipeline.build_data(_cfg(corpus, source='tokenized', path=out),
                                   global_batch_size=4, seed=0)
  with pytest.raises(DataError, match=f'{SHARD} cannot be read .*the shard is damaged; run `'
                     ) as e:
    for _ in range(200):
      next(data.train_iter)
  command = shlex.split(str(e.value).split('`')[1])
  assert command[:3] == ['python', 'main.py', '--mode=tokenize'], command
  done = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'{SHARD} is damaged (its content checksum' in done.stderr, done.stderr
  assert _files(out) == written
  data = input_pipeline.build_data(_cfg(corpus, source='tokenized', path=out),
                                   global_batch_size=4, seed=0)
  for _ in range(200):
    next(data.train_iter)
