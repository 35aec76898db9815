"""Pre-tokenized shards (input_pipeline/tokenized.py, --mode=tokenize): deterministic, resumable,
and training from them gives the batches, and the losses, of training from the source; on a local
disk and on gs:// (a real GCS API server)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import input_pipeline
from gated_attention import storage
from input_pipeline import tokenized
from input_pipeline.errors import DataError
from tests.test_input_pipeline import data_cfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """A jsonl corpus of 60 documents: its glob."""
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


def test_deterministic_and_resumable(corpus, shards, tmp_path):
  again = str(tmp_path / 'again')
  manifest = tokenized.tokenize(_cfg(corpus), again, workers=1, progress=False)
  assert _files(again) == _files(shards)                         # byte for byte, 1 or 2 workers
  assert manifest['num_documents'] == 60 and len(manifest['shards']['train']) >= 6
  # A killed run: two shards and the manifest missing, a half-written temporary left behind.
  names = sorted(n for n in os.listdir(again) if n.startswith('train-'))
  for n in (names[1], names[-1], 'manifest.json'):
    os.remove(os.path.join(again, n))
  with open(os.path.join(again, names[1] + '.tmp999'), 'wb') as f:
    f.write(b'partial')
  tokenized.tokenize(_cfg(corpus), again, workers=2, progress=False)
  assert _files(again) == _files(shards)


def _batches(cfg, n=4, process_index=0, process_count=1):
  data = input_pipeline.build_data(cfg, global_batch_size=4, seed=3,
                                   process_index=process_index, process_count=process_count)
  return [next(data.train_iter) for _ in range(n)], data.val_batches(), data


def _equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize('process_index,process_count', [(0, 1), (0, 2), (1, 2)])
def test_the_same_batches_as_from_the_source(corpus, shards, process_index, process_count):
  src_train, src_val, _ = _batches(_cfg(corpus), 4, process_index, process_count)
  tok_train, tok_val, data = _batches(_cfg(corpus, source='tokenized', path=shards), 4,
                                      process_index, process_count)
  _equal(src_train, tok_train)
  _equal(src_val, tok_val)
  assert data.describe()['source'] == 'tokenized'


def test_the_iterator_resumes_exactly(corpus, shards):
  cfg = _cfg(corpus, source='tokenized', path=shards)
  _, _, data = _batches(cfg, 2)
  state = data.train_iter.get_state()
  want = [next(data.train_iter) for _ in range(3)]
  fresh = input_pipeline.build_data(cfg, global_batch_size=4, seed=3)
  fresh.train_iter.set_state(state)
  _equal(want, [next(fresh.train_iter) for _ in range(3)])


def test_another_tokenizer_or_split_is_refused(corpus, shards, tmp_path):
  bpe = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied', 'tokenizer.json')
  with pytest.raises(DataError, match='was tokenized with byte'):
    input_pipeline.build_data(_cfg(corpus, source='tokenized', path=shards, tokenizer=str(bpe)),
                              global_batch_size=4, seed=0)
  with pytest.raises(DataError, match='val_fraction=0.1'):
    input_pipeline.build_data(_cfg(corpus, source='tokenized', path=shards, val_fraction=0.2),
                              global_batch_size=4, seed=0)
  with pytest.raises(DataError, match='has no manifest.json'):
    input_pipeline.build_data(_cfg(corpus, source='tokenized', path=str(tmp_path)),
                              global_batch_size=4, seed=0)


def test_on_gcs_the_command_line_and_training_losses(corpus, shards, gcs, tmp_path):
  """main.py --mode=tokenize writes the same shards to gs://; a run trained from them has the
  per-step losses of the same run trained from the jsonl source, bitwise."""
  out = gcs.url('tokens')
  args = [f'--config.data.{k}={v}' for k, v in (('source', 'jsonl'), ('path', corpus),
                                                 ('val_fraction', 0.1), ('shard_documents', 8))]
  done = subprocess.run([sys.executable, 'main.py', '--mode=tokenize', f'--out={out}'] + args,
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'data.source=tokenized' in done.stdout
  assert _files(out) == _files(shards)
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
