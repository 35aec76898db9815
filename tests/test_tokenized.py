"""Pre-tokenized shards (input_pipeline/tokenized.py, --mode=tokenize): deterministic, resumable
after a kill, and training from them gives the batches (and, slow test, the losses) of training
from the source, each process its own share; on a local disk and on gs:// (a real GCS API
server)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gated_attention import input_pipeline
from gated_attention import storage
from gated_attention.input_pipeline import tokenized
from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.sources import load_documents, split_documents
from tests.test_input_pipeline import BOS, assert_batches_equal, data_cfg, windows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_TOKENIZER = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied', 'tokenizer.json')


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """A jsonl corpus of 60 documents in two files, each starting with its name: its glob."""
  root = tmp_path_factory.mktemp('tok_corpus')
  rng = np.random.default_rng(5)
  words = ['alpha', 'beta', 'délta', 'ε', '日本', 'def f(x):', 'return']
  for part in range(2):
    with open(root / f'{part}.jsonl', 'w', encoding='utf-8') as f:
      for i in range(30):
        f.write(json.dumps({'text': f'doc{part}-{i} ' + ' '.join(
            rng.choice(words, rng.integers(1, 60)))}) + '\n')
  return str(root / '*.jsonl')


def _cfg(corpus, **kw):
  return data_cfg(**{'source': 'jsonl', 'path': corpus, 'seq_len': 16, 'val_batches': 2,
                     'val_fraction': 0.1, 'shard_documents': 8, **kw})


def _files(root) -> dict:
  return {n: storage.read_bytes(storage.join(root, n)) for n in storage.listdir(root)}


@pytest.fixture(scope='module')
def shards(corpus, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('tok') / 'shards')
  tokenized.tokenize(_cfg(corpus), out, workers=2, progress=False)
  return out


def test_the_folder(corpus, shards):
  """The shards, their counts files and the manifest; a record is encode_doc's int32 bytes."""
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  m = json.loads(storage.read_bytes(os.path.join(shards, 'manifest.json')))
  train_ids, val_ids = split_documents(60, 0.1)
  assert (m['num_documents'], m['tokenizer'], m['vocab_size'], m['bos_id']) == (60, 'byte', 257,
                                                                                BOS)
  assert m['num_shards'] == {'train': 7, 'val': 1} and m['val_fraction'] == 0.1
  assert [s['documents'] for s in m['shards']['train']] == [8] * 6 + [len(train_ids) - 48]
  assert [s['name'] for s in m['shards']['val']] == ['val-00000-of-00001.arrayrecord']
  names = {s['name'] for split in m['shards'].values() for s in split}
  assert set(os.listdir(shards)) == ({'manifest.json'} | names |
                                     {n.replace('.arrayrecord', '.json') for n in names})
  docs, tok = load_documents(_cfg(corpus)), input_pipeline.make_tokenizer('byte')
  reader = ar.ArrayRecordReader(os.path.join(shards, m['shards']['train'][1]['name']))
  records = reader.read(list(range(8)))
  reader.close()
  for i, record in zip(train_ids[8:16], records):
    assert record == tok.encode_doc(docs[int(i)]).astype('<i4').tobytes()
  assert m['num_tokens']['val'] == sum(len(tok.encode_doc(docs[int(i)])) for i in val_ids)
  described = input_pipeline.build_data(_cfg(corpus, source='tokenized', path=shards),
                                        global_batch_size=4, seed=0).describe()
  assert described['num_tokens'] == m['num_tokens'] and described['num_tokens_train_exact']


def test_deterministic_and_resumable(corpus, shards, tmp_path):
  again = str(tmp_path / 'again')
  manifest = tokenized.tokenize(_cfg(corpus), again, workers=1, progress=False)
  assert _files(again) == _files(shards)                         # byte for byte, 1 or 2 workers
  assert manifest['num_documents'] == 60 and len(manifest['shards']['train']) == 7
  # Killed runs: two shards and the manifest missing (one of the two with its counts written,
  # the other without), temporary files left behind, a shard whose counts file is gone.
  names = sorted(n for n in os.listdir(again) if n.endswith('.arrayrecord'))
  for n in (names[1], names[-1], names[-2].replace('.arrayrecord', '.json'), 'manifest.json'):
    os.remove(os.path.join(again, n))
  for n in (names[1] + '.tmp999', names[-1].replace('.arrayrecord', '.json') + '.tmp',
            'manifest.json.tmp'):
    with open(os.path.join(again, n), 'wb') as f:
      f.write(b'partial')
  tokenized.tokenize(_cfg(corpus), again, workers=2, progress=False)
  assert _files(again) == _files(shards)


def test_killed_mid_way_resumes_byte_identical(corpus, shards, tmp_path):
  """kill -9 of a real run while its workers write: no worker outlives it (PR_SET_PDEATHSIG), no
  partial shard under a final name, no manifest; the same call again gives the clean run's bytes."""
  out = str(tmp_path / 'killed')
  code = f'''
import time
from gated_attention.input_pipeline import tokenized, tokenizer
class Slow(tokenizer.ByteTokenizer):
  def encode_doc(self, text):
    time.sleep(0.04)
    return super().encode_doc(text)
tokenized.make_tokenizer = lambda name: Slow()
from tests.test_tokenized import _cfg
tokenized.tokenize(_cfg({corpus!r}), {out!r}, workers=2, progress=False)
'''
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO)
  try:
    deadline = time.time() + 60
    while not (os.path.isdir(out) and any(n.endswith('.arrayrecord') for n in os.listdir(out))):
      assert proc.poll() is None and time.time() < deadline, 'no shard was published'
      time.sleep(0.02)
    workers = _children(proc.pid)
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
  deadline = time.time() + 10
  while any(_alive(pid) for pid in workers):
    assert time.time() < deadline, 'a worker outlived the killed command'
    time.sleep(0.05)
  left = os.listdir(out)
  assert 'manifest.json' not in left
  published = [n for n in left if n.endswith('.arrayrecord')]
  assert 0 < len(published) < 8
  for n in published:                                  # whole, with their counts
    assert storage.read_bytes(os.path.join(out, n)) == _files(shards)[n]
    assert n.replace('.arrayrecord', '.json') in left
  tokenized.tokenize(_cfg(corpus), out, workers=2, progress=False)
  assert _files(out) == _files(shards)


def _children(pid: int) -> list[int]:
  out = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          if int(f.read().rsplit(')', 1)[1].split()[1]) == pid:
            out.append(int(entry))
      except (OSError, IndexError, ValueError):
        pass
  return out


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def _batches(cfg, n=4, process_index=0, process_count=1):
  """Per-process streams (runs saved before issue 45) where process_count > 1: the global
  stream ignores the process count (test_input_pipeline.py)."""
  data = input_pipeline.build_data(cfg, global_batch_size=4, seed=3,
                                   process_index=process_index, process_count=process_count,
                                   per_process_stream=process_count > 1)
  return [next(data.train_iter) for _ in range(n)], data.val_batches(), data


@pytest.mark.parametrize('process_index,process_count', [(0, 1), (0, 2), (1, 2)])
def test_the_same_batches_as_from_the_source(corpus, shards, process_index, process_count):
  src_train, src_val, _ = _batches(_cfg(corpus), 4, process_index, process_count)
  tok_train, tok_val, data = _batches(_cfg(corpus, source='tokenized', path=shards), 4,
                                      process_index, process_count)
  assert_batches_equal(src_train, tok_train)
  assert_batches_equal(src_val, tok_val)
  assert data.describe()['source'] == 'tokenized'


@pytest.mark.parametrize('process_count', [2, 3])
def test_each_process_reads_its_share(corpus, shards, process_count):
  """Per-process streams (runs saved before issue 45). Read back from the batches (no window shuffle: the windows are the process's token stream):
  in each of two epochs the processes' documents are disjoint and together the training split."""
  cfg = _cfg(corpus, source='tokenized', path=shards, seq_len=128, shuffle_buffer=0)
  by_name = {text.split(' ', 1)[0]: i for i, text in enumerate(load_documents(_cfg(corpus)))}
  train_ids, _ = split_documents(60, 0.1)
  epochs = [[] for _ in range(2)]
  for p in range(process_count):
    data = input_pipeline.build_data(cfg, global_batch_size=process_count, seed=3,
                                     process_index=p, process_count=process_count,
                                     per_process_stream=True)
    share, stream, ids = len(train_ids[p::process_count]), [], []
    while len(ids) <= 2 * share:        # the complete documents of the stream, in order
      stream += windows([next(data.train_iter)])
      tokens = np.concatenate(stream)
      ids = [by_name[bytes(d[1:].tolist()).decode().split(' ', 1)[0]]
             for d in np.split(tokens, np.flatnonzero(tokens == BOS))[1:-1]]
    epochs[0].append(ids[:share])
    epochs[1].append(ids[share:2 * share])
  for shares in epochs:
    assert sorted(sum(shares, [])) == sorted(train_ids.tolist())     # disjoint and covering


def test_the_iterator_resumes_exactly(corpus, shards):
  cfg = _cfg(corpus, source='tokenized', path=shards)
  _, _, data = _batches(cfg, 2)
  state = data.train_iter.get_state()
  want = [next(data.train_iter) for _ in range(3)]
  fresh = input_pipeline.build_data(cfg, global_batch_size=4, seed=3)
  fresh.train_iter.set_state(state)
  assert_batches_equal(want, [next(fresh.train_iter) for _ in range(3)])


def test_another_tokenizer_split_or_folder_is_refused(corpus, shards, tmp_path):
  build = lambda **kw: input_pipeline.build_data(  # noqa: E731
      _cfg(corpus, source='tokenized', **kw), global_batch_size=4, seed=0)
  with pytest.raises(DataError, match=r"tokenized with byte .*data.tokenizer='byte'.*this run's "
                                      r"data.tokenizer='.*tokenizer.json' is hf:tokenizer.json"):
    build(path=shards, tokenizer=HF_TOKENIZER)
  with pytest.raises(DataError, match='val_fraction=0.1'):
    build(path=shards, val_fraction=0.2)
  with pytest.raises(DataError, match='has no manifest.json'):
    build(path=str(tmp_path))
  partial = str(tmp_path / 'partial')
  shutil.copytree(shards, partial)
  os.remove(os.path.join(partial, 'train-00002-of-00007.arrayrecord'))
  with pytest.raises(DataError, match='lacks 1 of the shards.*train-00002-of-00007'):
    build(path=partial)
  # --mode=tokenize into a folder of another tokenizer's shards
  with pytest.raises(DataError, match='other settings .*tokenizer_fingerprint'):
    tokenized.tokenize(_cfg(corpus, tokenizer=HF_TOKENIZER), partial, workers=1, progress=False)


def test_the_tokenizer_is_its_token_ids_not_its_name(corpus, tmp_path):
  """Another tokenizer.json (the same name and vocabulary size, two ids swapped) is refused; the
  same one in another folder is accepted."""
  out = str(tmp_path / 'hf_shards')
  tokenized.tokenize(_cfg(corpus, tokenizer=HF_TOKENIZER), out, workers=1, progress=False)
  same = tmp_path / 'copy'
  shutil.copytree(os.path.dirname(HF_TOKENIZER), same)
  other = tmp_path / 'lowercase'
  shutil.copytree(os.path.dirname(HF_TOKENIZER), other)
  spec = json.loads((other / 'tokenizer.json').read_text())    # two words' ids swapped
  vocab = spec['model']['vocab']
  vocab['w0'], vocab['w1'] = vocab['w1'], vocab['w0']
  (other / 'tokenizer.json').write_text(json.dumps(spec))
  cfg = lambda tok: _cfg(corpus, source='tokenized', path=out, tokenizer=tok)  # noqa: E731
  input_pipeline.build_data(cfg(str(same / 'tokenizer.json')), global_batch_size=4, seed=0)
  with pytest.raises(DataError, match='another tokenizer'):
    input_pipeline.build_data(cfg(str(other / 'tokenizer.json')), global_batch_size=4, seed=0)


def _main_tokenize(corpus, out, shard_documents):
  args = [f'--config.data.{k}={v}' for k, v in (
      ('source', 'jsonl'), ('path', corpus), ('val_fraction', 0.1),
      ('shard_documents', shard_documents))]
  done = subprocess.run([sys.executable, 'main.py', '--mode=tokenize', f'--out={out}'] + args,
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'data.source=tokenized' in done.stdout
  return done


def test_main_py_to_gcs_and_read_back(corpus, gcs, tmp_path):
  """main.py --mode=tokenize --out=gs://... writes the bytes of the same call on a local disk;
  training batches read from gs:// are the source's; a rerun writes only the manifest."""
  out, local = gcs.url('shards'), str(tmp_path / 'local')
  _main_tokenize(corpus, out, 32)                   # 3 shards (the emulator is slow per object)
  tokenized.tokenize(_cfg(corpus, shard_documents=32), local, workers=1, progress=False)
  assert _files(out) == _files(local) and len(_files(local)) == 7
  src_train, src_val, _ = _batches(_cfg(corpus), 3)
  tok_train, tok_val, _ = _batches(_cfg(corpus, source='tokenized', path=out), 3)
  assert_batches_equal(src_train, tok_train)
  assert_batches_equal(src_val, tok_val)
  fs, prefix = storage.filesystem(out)
  generations = lambda: {storage.basename(i['name']): i['generation']  # noqa: E731
                         for i in fs.ls(prefix, detail=True, refresh=True)}
  before = generations()
  tokenized.tokenize(_cfg(corpus, shard_documents=32), out, workers=1, progress=False)
  after = generations()
  assert [n for n in before if after[n] != before[n]] == ['manifest.json']
  assert _files(out) == _files(local)


@pytest.mark.slow
def test_training_from_gcs_shards_has_the_sources_losses(corpus, gcs, tmp_path):
  """A run trained from shards on gs:// has the per-step losses of the same run trained from the
  jsonl source, bitwise (two tiny trainings: ~35 s)."""
  out = gcs.url('tokens')
  _main_tokenize(corpus, out, 8)
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from tests.test_faults import config  # pylint: disable=g-import-not-at-top
  losses = {}
  for name, extra, workdir in (
      ('source', {'data.source': 'jsonl', 'data.path': corpus}, str(tmp_path / 'src')),
      ('tokens', {'data.source': 'tokenized', 'data.path': out}, gcs.url('run'))):
    loop.run(config(**{**extra, 'data.val_fraction': 0.1, 'train.steps': 4,
                       'train.checkpoint_every': 4, 'train.eval_every': 4}), workdir)
    losses[name] = {(r['step'], r['split']): r['loss'] for r in rundir.read_metrics(workdir)}
  assert losses['source'] == losses['tokens'] and len(losses['source']) == 5
