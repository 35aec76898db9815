"""Training data read from object storage (input_pipeline/sources.py over gated_attention/
storage/) against a real GCS API server: text, jsonl, parquet and ArrayRecord files on gs://
give the same documents in the same order as the same files on a local disk, and the same
batches."""

import json
import pickle

import numpy as np
import pytest

from gated_attention import input_pipeline
from gated_attention import storage
from gated_attention.input_pipeline import sources
from gated_attention.input_pipeline.errors import DataError
from tests.test_input_pipeline import data_cfg


def _texts():
  rng = np.random.default_rng(3)
  words = ['alpha', 'beta', 'délta', 'ε', '日本', 'for i in range(3):', 'x' * 50]
  return [f'doc{i:02d} ' + ' '.join(rng.choice(words, rng.integers(1, 30))) for i in range(24)]


def _write_corpus(local, kind: str, texts) -> list[str]:
  """The corpus as files of `kind` under the local folder; their names (relative)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  names = []
  for part, chunk in enumerate((texts[:10], texts[10:])):
    sub = local / ('a' if part == 0 else 'b/c')          # ** must find the nested one
    sub.mkdir(parents=True, exist_ok=True)
    if kind == 'text':
      for i, t in enumerate(chunk):
        (sub / f'{part}_{i:02d}.txt').write_text(t, encoding='utf-8')
        names.append(str((sub / f'{part}_{i:02d}.txt').relative_to(local)))
      continue
    path = sub / f'part{part}.{kind}'
    if kind == 'jsonl':   # a blank line and a CRLF line: the line index must skip and strip them
      lines = [json.dumps({'text': t}) for t in chunk]
      path.write_bytes(('\n'.join(lines[:3]) + '\n\n' + lines[3] + '\r\n' +
                        '\n'.join(lines[4:]) + '\n').encode())
    elif kind == 'parquet':
      pq.write_table(pa.table({'text': chunk}), str(path))
    else:
      w = ar.ArrayRecordWriter(str(path), 'group_size:1')
      for t in chunk:
        w.write(t.encode())
      w.close()
    names.append(str(path.relative_to(local)))
  # What a local glob skips and a gs:// glob must skip too: macOS's AppleDouble twin of each
  # file and a hidden folder (binary junk: reading either would fail the test).
  for name in list(names):
    junk = local / name.rsplit('/', 1)[0] / ('._' + name.rsplit('/', 1)[1])
    junk.write_bytes(b'\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X \xff\xfe')
    names.append(str(junk.relative_to(local)))
  (local / 'a/.cache').mkdir()
  (local / 'a/.cache' / names[0].rsplit('/', 1)[1]).write_bytes(b'\xff\xfe junk')
  return names + [f'a/.cache/{names[0].rsplit("/", 1)[1]}']


PATTERNS = {'text': '**/*.txt', 'jsonl': '**/*.jsonl', 'parquet': '**/*.parquet',
            'arrayrecord': '**/*.arrayrecord'}


@pytest.mark.parametrize('kind', list(PATTERNS))
def test_the_same_documents_from_gcs_as_from_a_local_disk(gcs, tmp_path, kind):
  texts = _texts()
  names = _write_corpus(tmp_path, kind, texts)
  remote = gcs.url('corpus')
  for name in names:
    storage.write(f'{remote}/{name}', (tmp_path / name).read_bytes())
  local_docs = sources.load_documents(data_cfg(source=kind, path=str(tmp_path / PATTERNS[kind])))
  remote_docs = sources.load_documents(data_cfg(source=kind, path=f'{remote}/{PATTERNS[kind]}'))
  assert len(local_docs) == len(remote_docs) == len(texts)
  assert [remote_docs[i] for i in range(len(texts))] == [local_docs[i] for i in range(len(texts))]
  assert sorted(local_docs[i] for i in range(len(texts))) == sorted(texts)
  if local_docs.sizes is not None:
    np.testing.assert_array_equal(local_docs.sizes, remote_docs.sizes)
  assert local_docs.info == remote_docs.info
  # grain's worker processes get the documents pickled
  again = pickle.loads(pickle.dumps(remote_docs))
  assert [again[i] for i in range(len(texts))] == [local_docs[i] for i in range(len(texts))]


def test_jsonl_line_index_across_read_blocks(gcs, tmp_path, monkeypatch):
  """Remote JSON-lines files are indexed in blocks (64 MB; here a few bytes): a blank CRLF line
  split between two blocks is still blank, and blocks of several files go in one batch."""
  texts = _texts()
  names = [n for n in _write_corpus(tmp_path, 'jsonl', texts) if '/.' not in n]
  first = tmp_path / names[0]
  first.write_bytes(first.read_bytes().replace(b'\r\n', b'\r\n\r\n', 1))   # + a blank CRLF line
  for name in names:
    storage.write(gcs.url(f'corpus/{name}'), (tmp_path / name).read_bytes())
  local = sources.load_documents(data_cfg(source='jsonl', path=str(tmp_path / '**/*.jsonl')))
  expected = [local[i] for i in range(len(local))]
  assert sorted(expected) == sorted(texts)
  cr = first.read_bytes().index(b'\r\n\r\n') + 2      # the blank line's \r
  for block in (cr, cr + 1, 97, 1 << 20):      # \r the first byte of a block, the last; any; all
    monkeypatch.setattr(sources, '_BLOCK', block)
    docs = sources.load_documents(data_cfg(source='jsonl', path=gcs.url('corpus/**/*.jsonl')))
    assert [docs[i] for i in range(len(docs))] == expected, block
    np.testing.assert_array_equal(docs.sizes, local.sizes)


def test_comma_separated_globs_and_unreadable_files(gcs, tmp_path):
  texts = _texts()
  names = _write_corpus(tmp_path, 'jsonl', texts)
  remote = gcs.url('corpus')
  for name in names:
    storage.write(f'{remote}/{name}', (tmp_path / name).read_bytes())
  path = f'{remote}/a/*.jsonl, {remote}/b/**/*.jsonl,{remote}/a/part0.jsonl'
  docs = sources.load_documents(data_cfg(source='jsonl', path=path))
  assert [docs[i] for i in range(len(docs))] == texts
  storage.remove(f'{remote}/b/c/part1.jsonl')      # gone after the listing: named, with the fix
  with pytest.raises(DataError, match=r"'gs://.*/b/c/part1\.jsonl'.*removed"):
    docs[len(docs) - 1]  # pylint: disable=pointless-statement
  storage.write(f'{remote}/bad/x.txt', b'ok')
  storage.write(f'{remote}/bad/y.txt', b'\xff\xfe not UTF-8')
  with pytest.raises(DataError, match=r"cannot read 'gs://.*/bad/y\.txt' as UTF-8"):
    sources.load_documents(data_cfg(source='text', path=f'{remote}/bad/*.txt'))
  storage.write(f'{remote}/bad/x.jsonl', b'{"text": "a"}\n{"text": 1}\n')
  with pytest.raises(DataError, match=r"gs://.*/bad/x\.jsonl, line 2: field 'text' holds"):
    sources.load_documents(data_cfg(source='jsonl', path=f'{remote}/bad/*.jsonl'))
  storage.write(f'{remote}/bad/x.parquet', b'PAR1 not parquet')
  with pytest.raises(DataError, match=r"cannot read 'gs://.*/bad/x\.parquet' as parquet"):
    sources.load_documents(data_cfg(source='parquet', path=f'{remote}/bad/*.parquet'))


def test_the_same_batches_from_gcs(gcs, tmp_path):
  texts = _texts()
  names = _write_corpus(tmp_path, 'jsonl', texts)
  for name in names:
    storage.write(gcs.url(f'corpus/{name}'), (tmp_path / name).read_bytes())
  def batches(path):
    cfg = data_cfg(source='jsonl', path=path, seq_len=16, val_batches=1)
    data = input_pipeline.build_data(cfg, global_batch_size=4, seed=1)
    return [next(data.train_iter) for _ in range(3)], data.val_batches()
  (train_a, val_a), (train_b, val_b) = batches(str(tmp_path / '**/*.jsonl')), batches(
      gcs.url('corpus/**/*.jsonl'))
  for a, b in zip(train_a + val_a, train_b + val_b):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_glob_matching_nothing_or_a_missing_bucket_is_one_error(gcs):
  with pytest.raises(DataError, match='matched no files'):
    sources.load_documents(data_cfg(source='jsonl', path=gcs.url('nothing/*.jsonl')))
  with pytest.raises(storage.StorageError, match='gs://no-such-bucket-36 .*does not exist'):
    sources.load_documents(data_cfg(source='jsonl', path='gs://no-such-bucket-36/x/*.jsonl'))
