"""Tests of input_pipeline: packing, splits, shuffling, sharding, resume, sources, tokenizers."""

import gc
import json
import sys
import time
import types

import grain
import numpy as np
import pytest

from gated_attention.config import scales
from gated_attention.input_pipeline import DataError, Tokenizer, build_data, make_tokenizer
from gated_attention.input_pipeline.packing import PackIterDataset
from gated_attention.input_pipeline.shuffle import WindowShuffleIterDataset

BOS = 256  # the byte tokenizer's


def data_cfg(**overrides):
  cfg = scales.get_config().data
  cfg.update(overrides)
  return cfg


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """40 small text files with unique contents (one of them empty): (glob, texts)."""
  root = tmp_path_factory.mktemp('corpus')
  rng = np.random.default_rng(0)
  words = ['alpha', 'beta', 'gamma', 'délta', 'ε', '日本', 'x', 'for i in range(3):', '\n']
  texts = [''] + [f'doc{i:02d} ' + ' '.join(rng.choice(words, rng.integers(0, 20)))
                  for i in range(1, 40)]
  assert len(set(texts)) == len(texts)  # the tests identify documents by their text
  for i, text in enumerate(texts):
    (root / f'{i:02d}.txt').write_text(text, encoding='utf-8')
  return str(root / '*.txt'), texts


def corpus_cfg(corpus, **overrides):
  settings = dict(source='text', path=corpus[0], seq_len=16, val_fraction=0.1, val_batches=8,
                  shuffle_buffer=0)
  return data_cfg(**{**settings, **overrides})


def take(it, n):
  return [next(it) for _ in range(n)]


def windows(batches):
  """The packed windows [seq_len + 1] of batches, in row order."""
  return [np.concatenate([b['inputs'][r], b['targets'][r, -1:]])
          for b in batches for r in range(len(b['inputs']))]


def documents(stream, tokenizer, bos=BOS):
  """Texts of the complete documents in a token stream that starts with BOS."""
  assert stream[0] == bos
  starts = np.flatnonzero(stream == bos)
  return [tokenizer.decode(stream[a + 1:b]) for a, b in zip(starts[:-1], starts[1:])]


def reference_pack(docs_tokens, length):
  """Plain-python concat-and-chunk: [BOS] + doc, concatenated, cut into `length` windows."""
  stream = []
  for tokens in docs_tokens:
    stream += [BOS] + list(tokens)
  return [stream[i:i + length] for i in range(0, len(stream) - length + 1, length)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


# --- tokenizers -------------------------------------------------------------------------------

def test_byte_tokenizer_round_trip():
  tok = make_tokenizer('byte')
  assert isinstance(tok, Tokenizer) and (tok.vocab_size, tok.bos_id, tok.name) == (257, 256, 'byte')
  text = 'héllo wörld — 日本語 🙂 \x00\n'
  ids = tok.encode(text)
  assert ids == list(text.encode('utf-8')) and max(ids) < 256
  assert tok.decode(ids) == text and tok.decode([BOS] + ids) == text
  np.testing.assert_array_equal(tok.encode_doc(text), [BOS] + ids)


TRAIN_TEXTS = ['the quick brown fox jumps over the lazy dog', 'def f(x):\n    return x + 1',
               'héllo wörld, 日本語 text', 'lorem ipsum dolor sit amet'] * 5


def train_hf(path, special_tokens):
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special_tokens,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(TRAIN_TEXTS, trainer)
  tok.save(str(path))
  return tok


def test_hf_tokenizer(tmp_path):
  raw = train_hf(tmp_path / 'tokenizer.json', ['<pad>', '<|endoftext|>'])
  tok = make_tokenizer(str(tmp_path / 'tokenizer.json'))
  assert tok.bos_id == raw.token_to_id('<|endoftext|>') == 1
  assert tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)
  text = 'the lazy fox: héllo 日本語 🙂'
  ids = tok.encode(text)
  assert tok.decode(ids) == text and tok.decode([tok.bos_id] + ids) == text
  assert tok.bos_id not in ids and max(ids) < tok.vocab_size
  # A bos_token named in tokenizer_config.json wins; with no BOS candidate at all, an error.
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'bos_token': '<pad>'}))
  assert make_tokenizer(str(tmp_path / 'tokenizer.json')).bos_id == 0
  (tmp_path / 'nobos').mkdir()
  train_hf(tmp_path / 'nobos' / 'tokenizer.json', ['<pad>'])
  with pytest.raises(DataError, match='has no BOS token'):
    make_tokenizer(str(tmp_path / 'nobos' / 'tokenizer.json'))


def train_sp(tmp_path, name, **kwargs):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  corpus = tmp_path / 'sp.txt'
  corpus.write_text('\n'.join(TRAIN_TEXTS), encoding='utf-8')
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / name), vocab_size=320, model_type='bpe',
      character_coverage=1.0, normalization_rule_name='identity', remove_extra_whitespaces=False,
      byte_fallback=True, hard_vocab_limit=False, minloglevel=2, **kwargs)
  return str(tmp_path / f'{name}.model')


def test_sentencepiece_tokenizer(tmp_path):
  tok = make_tokenizer(train_sp(tmp_path, 'sp'))
  assert tok.bos_id == 1 and tok.vocab_size >= 300 and tok.name == 'sentencepiece:sp.model'
  text = 'the lazy fox: héllo 日本語'
  ids = tok.encode(text)
  assert tok.decode(ids) == text and tok.decode([tok.bos_id] + ids) == text
  assert make_tokenizer(train_sp(tmp_path, 'eos', bos_id=-1, eos_id=2)).bos_id == 2
  with pytest.raises(DataError, match='neither a BOS nor an EOS'):
    make_tokenizer(train_sp(tmp_path, 'none', bos_id=-1, eos_id=-1))


# --- packing, splits, shuffling, sharding, resume -----------------------------------------------

def test_pack_iter_dataset_matches_reference_and_resumes():
  rng = np.random.default_rng(1)
  docs = [np.concatenate([[BOS], rng.integers(0, 256, rng.integers(0, 40))]).astype(np.int32)
          for _ in range(30)]
  ds = PackIterDataset(grain.MapDataset.source(docs).to_iter_dataset(), 11)
  got = [w.tolist() for w in ds]
  assert got == reference_pack([d[1:] for d in docs], 11) and len(got) > 20
  it = iter(ds)
  for k in range(len(got)):  # resume from every position, through JSON
    state = json.loads(json.dumps(it.get_state()))
    fresh = iter(ds)
    fresh.set_state(state)
    assert [w.tolist() for w in fresh] == got[k:]
    next(it)


def test_window_shuffle_permutes_windows_and_resumes():
  ds = WindowShuffleIterDataset(grain.MapDataset.range(30).to_iter_dataset(), window_size=8, seed=4)
  got = list(ds)
  assert got != list(range(30)) and got == list(ds)
  for start in range(0, 30, 8):
    assert sorted(got[start:start + 8]) == list(range(start, min(start + 8, 30)))
  it = iter(ds)
  for k in range(len(got) + 1):  # resume from every position, through JSON
    fresh = iter(ds)
    fresh.set_state(json.loads(json.dumps(it.get_state())))
    assert list(fresh) == got[k:]
    next(it, None)


def test_train_stream_packs_each_document_once_per_epoch(corpus):
  data = build_data(corpus_cfg(corpus), global_batch_size=4, seed=0)
  batches = take(data.train_iter, 80)
  for b in batches:
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == {
        'inputs': ((4, 16), np.int32), 'targets': ((4, 16), np.int32),
        'loss_mask': ((4, 16), np.float32)}
    np.testing.assert_array_equal(b['inputs'][:, 1:], b['targets'][:, :-1])
    assert (b['loss_mask'] == 1).all()
  windows_w = windows(batches)
  stream = np.concatenate(windows_w)
  docs = documents(stream, data.tokenizer)
  n_train = data.describe()['num_documents']['train']
  epoch1, epoch2 = docs[:n_train], docs[n_train:2 * n_train]
  train_texts = set(epoch1)
  assert len(train_texts) == n_train and set(epoch2) == train_texts and epoch1 != epoch2
  assert set(corpus[1]) >= train_texts
  # The windows are exactly the plain-python packing of the documents in their stream order.
  reference = reference_pack([data.tokenizer.encode(t) for t in docs], 17)
  assert [w.tolist() for w in windows_w[:len(reference)]] == reference


def test_validation_split(corpus):
  data = build_data(corpus_cfg(corpus), global_batch_size=4, seed=0)
  val = data.val_batches()
  assert len(val) == 8 and val[0]['inputs'].shape == (4, 16)
  assert_batches_equal(val, data.val_batches())
  assert_batches_equal(val, build_data(corpus_cfg(corpus), global_batch_size=4, seed=7).val_batches())
  val_texts = set(documents(np.concatenate(windows(val)), data.tokenizer))
  train_texts = set(documents(np.concatenate(windows(take(data.train_iter, 80))), data.tokenizer))
  counts = data.describe()['num_documents']
  assert len(val_texts) == counts['val'] >= 1 and not val_texts & train_texts
  assert val_texts | train_texts == set(corpus[1])
  # Two processes hold the two halves of the same global validation batches.
  halves = [build_data(corpus_cfg(corpus), global_batch_size=4, seed=0, process_index=p,
                       process_count=2).val_batches() for p in range(2)]
  for b, h0, h1 in zip(val, *halves):
    np.testing.assert_array_equal(b['inputs'], np.concatenate([h0['inputs'], h1['inputs']]))


def test_seeds_and_window_shuffle(corpus):
  build = lambda seed, buf: build_data(corpus_cfg(corpus, shuffle_buffer=buf),
                                       global_batch_size=4, seed=seed)
  a, b, c = (take(build(s, 8).train_iter, 10) for s in (0, 0, 1))
  assert_batches_equal(a, b)
  assert not np.array_equal(a[0]['inputs'], c[0]['inputs'])
  # Window shuffling permutes blocks of 8 windows of the unshuffled stream.
  plain = windows(take(build(0, 0).train_iter, 10))
  shuffled = windows(a)
  assert [w.tolist() for w in plain] != [w.tolist() for w in shuffled]
  for i in range(0, 40, 8):
    assert sorted(w.tolist() for w in plain[i:i + 8]) == sorted(w.tolist() for w in shuffled[i:i + 8])


@pytest.mark.parametrize('skip', [0, 1, 2, 5, 13])
def test_resume_from_state(corpus, skip):
  cfg = corpus_cfg(corpus, shuffle_buffer=8)
  data = build_data(cfg, global_batch_size=4, seed=3)
  take(data.train_iter, skip)
  state = json.loads(json.dumps(data.train_iter.get_state()))
  expected = take(data.train_iter, 40)  # crosses epochs and shuffle windows
  restored = build_data(cfg, global_batch_size=4, seed=3)
  restored.train_iter.set_state(state)
  assert_batches_equal(expected, take(restored.train_iter, 40))
  data.train_iter.set_state(state)  # rewinding the same iterator
  assert_batches_equal(expected[:5], take(data.train_iter, 5))


def test_the_global_stream_is_the_same_for_every_process_count(corpus):
  """Issue 45: the batches are a function of the config and the step alone. Every process of
  every process count reads the same whole global batches (the step shards them), and a
  position saved by one process count resumes in another."""
  cfg = corpus_cfg(corpus, shuffle_buffer=8)
  one = take(build_data(cfg, global_batch_size=4, seed=3).train_iter, 12)
  for count in (2, 4):
    for p in range(count):
      data = build_data(cfg, global_batch_size=4, seed=3, process_index=p, process_count=count)
      got = take(data.train_iter, 5)
      assert_batches_equal(one[:5], got)
      if p == count - 1:   # resume 5 steps in, saved by `count` processes, on 1
        resumed = build_data(cfg, global_batch_size=4, seed=3)
        resumed.train_iter.set_state(json.loads(json.dumps(data.train_iter.get_state())))
        assert_batches_equal(one[5:], take(resumed.train_iter, 7))


def test_per_process_streams_are_disjoint(corpus):
  """The streams of runs saved by several processes before issue 45 (per_process_stream)."""
  shards = []
  for p in range(3):
    data = build_data(corpus_cfg(corpus), global_batch_size=6, seed=0, process_index=p,
                      process_count=3, per_process_stream=True)
    batches = take(data.train_iter, 40)
    assert all(b['inputs'].shape == (2, 16) for b in batches)
    n_train = data.describe()['num_documents']['train']
    docs = documents(np.concatenate(windows(batches)), data.tokenizer)
    shards.append(docs[:len(range(p, n_train, 3))])
  assert sum(map(len, shards)) == n_train == len(set().union(*shards))
  with pytest.raises(DataError, match='multiple of the process count 2'):
    build_data(corpus_cfg(corpus), global_batch_size=5, seed=0, process_count=2)


def test_worker_processes_give_the_same_batches(corpus):
  a = take(build_data(corpus_cfg(corpus, shuffle_buffer=8), global_batch_size=4, seed=0).train_iter, 6)
  data = build_data(corpus_cfg(corpus, shuffle_buffer=8, worker_count=1), global_batch_size=4, seed=0)
  assert_batches_equal(a, take(data.train_iter, 6))
  data.train_iter.close()
  del data
  gc.collect()


# --- sources ------------------------------------------------------------------------------------

def test_jsonl_source_with_hf_tokenizer(tmp_path):
  texts = [f'record {i}: the quick brown fox ' * (i % 4 + 1) for i in range(30)]
  lines = [json.dumps({'text': t, 'id': i}) for i, t in enumerate(texts)]
  (tmp_path / 'a.jsonl').write_text('\n'.join(lines[:12]) + '\n\n', encoding='utf-8')
  (tmp_path / 'b.jsonl').write_text('\r\n'.join(lines[12:]), encoding='utf-8')
  train_hf(tmp_path / 'tokenizer.json', ['<|endoftext|>'])
  cfg = data_cfg(source='jsonl', path=str(tmp_path / '*.jsonl'), seq_len=32, val_fraction=0.2,
                 tokenizer=str(tmp_path / 'tokenizer.json'), shuffle_buffer=0)
  data = build_data(cfg, global_batch_size=2, seed=0)
  assert data.tokenizer.bos_id == 0
  d = data.describe()
  assert sum(d['num_documents'].values()) == 30 and d['tokenizer'] == 'hf:tokenizer.json'
  stream = np.concatenate(windows(take(data.train_iter, 40)))
  assert stream.max() < data.tokenizer.vocab_size
  docs = documents(stream, data.tokenizer, bos=data.tokenizer.bos_id)
  assert set(docs) <= set(texts) and len(set(docs)) == d['num_documents']['train']


def test_parquet_source(tmp_path):
  pa = pytest.importorskip('pyarrow')
  pq = pytest.importorskip('pyarrow.parquet')
  texts = [f'row {i} ' + 'abc ' * i for i in range(20)]
  pq.write_table(pa.table({'content': texts[:8], 'n': list(range(8))}), tmp_path / 'a.parquet')
  pq.write_table(pa.table({'content': texts[8:], 'n': list(range(8, 20))}), tmp_path / 'b.parquet',
                 row_group_size=5)
  cfg = data_cfg(source='parquet', path=str(tmp_path / '*.parquet'), text_field='content',
                 seq_len=16, shuffle_buffer=0)
  data = build_data(cfg, global_batch_size=2, seed=0)
  assert data.describe()['num_documents']['train'] == 19
  docs = documents(np.concatenate(windows(take(data.train_iter, 60))), data.tokenizer)
  assert set(docs[:19]) < set(texts)
  with pytest.raises(DataError, match="no column 'text'"):
    build_data(data_cfg(source='parquet', path=cfg.path), global_batch_size=2, seed=0)


@pytest.mark.parametrize('as_json', [False, True])
def test_arrayrecord_source(tmp_path, as_json):
  ar = pytest.importorskip('array_record.python.array_record_module')
  texts = [f'record {i} ' + 'xyz ' * i for i in range(12)]
  writer = ar.ArrayRecordWriter(str(tmp_path / 'data.array_record'), 'group_size:1')
  for t in texts:
    writer.write((json.dumps({'body': t}) if as_json else t).encode('utf-8'))
  writer.close()
  cfg = data_cfg(source='arrayrecord', path=str(tmp_path / '*.array_record'), text_field='body',
                 seq_len=16, shuffle_buffer=0, val_fraction=0.0)
  data = build_data(cfg, global_batch_size=2, seed=0)
  docs = documents(np.concatenate(windows(take(data.train_iter, 30))), data.tokenizer)
  assert set(docs[:11]) < set(texts) and len(set(docs[:11])) == 11


def test_hf_source_with_a_stand_in_datasets_module(monkeypatch):
  texts = [f'hf row {i} ' + 'q ' * i for i in range(10)]

  class Split(list):
    column_names = ['text']

  def load_dataset(path, name, split):
    assert (path, name, split) == ('org/corpus', None, 'train')
    return Split({'text': t} for t in texts)

  monkeypatch.setitem(sys.modules, 'datasets', types.SimpleNamespace(load_dataset=load_dataset))
  data = build_data(data_cfg(source='hf', path='org/corpus', seq_len=8, shuffle_buffer=0),
                    global_batch_size=2, seed=0)
  docs = documents(np.concatenate(windows(take(data.train_iter, 30))), data.tokenizer)
  assert set(docs[:9]) < set(texts) and len(set(docs[:9])) == 9
  with pytest.raises(DataError, match="has no column 'body'"):
    build_data(data_cfg(source='hf', path='org/corpus', text_field='body'), global_batch_size=2,
               seed=0)


def test_builtin_source():
  start = time.perf_counter()
  data = build_data(data_cfg(), global_batch_size=16, seed=0)
  batch = next(data.train_iter)
  seconds = time.perf_counter() - start
  d = data.describe()
  assert batch['inputs'].shape == (16, 128) and seconds < 10
  assert d['source'] == 'builtin' and d['files'] > 100 and d['megabytes'] > 1
  assert d['num_documents']['val'] >= 1 and d['num_documents']['train'] > 100
  assert d['num_tokens']['train'] > 1e6 and 1 < d['unigram_entropy'] < 5.6
  assert len(data.val_batches()) == 4


# --- bad settings ------------------------------------------------------------------------------

@pytest.fixture
def bad_files(tmp_path):
  (tmp_path / 'empty1.txt').write_text('')
  (tmp_path / 'empty2.txt').write_text('')
  (tmp_path / 'one.txt').write_text('hello')
  (tmp_path / 'latin1.txt').write_bytes('caf\xe9'.encode('latin-1'))
  (tmp_path / 'bad.jsonl').write_text('{"text": "a"}\n{"text": "b"}\n{"body": "c"}\n')
  (tmp_path / 'broken.jsonl').write_text('{"text": "a"}\n{"text": \n')
  return tmp_path


@pytest.mark.parametrize('overrides, match', [
    (dict(source='nope'), r"Unknown data.source='nope'; set --config.data.source to one of"),
    (dict(source='text', path='{d}/*.missing'), r"matched no files; set --config.data.path"),
    (dict(source='text', path=''), r"data.source='text' needs data.path"),
    (dict(source='text', path='{d}/empty*.txt'), r'empty\*.txt\' is empty'),
    (dict(source='text', path='{d}/one.txt'), r'has only 1 document'),
    (dict(source='text', path='{d}/one.txt,{d}/latin1.txt'), r"cannot read .*latin1.txt' as UTF-8"),
    (dict(source='jsonl', path='{d}/bad.jsonl'), r"bad.jsonl, line 3: no string field 'text'"),
    (dict(source='jsonl', path='{d}/broken.jsonl'), r'broken.jsonl, line 2: not valid JSON'),
    (dict(source='hf', path='nope/nope'), r"data.source='hf'"),
    (dict(tokenizer='gpt2'), r"Unknown data.tokenizer='gpt2'"),
    (dict(tokenizer='{d}/missing.json'), r'missing.json.*does not exist'),
    (dict(tokenizer=''), r'data.tokenizer is empty'),
    (dict(val_fraction=1.0), r'val_fraction'),
])
def test_bad_settings_fail_clearly(bad_files, monkeypatch, overrides, match):
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  overrides = {k: v.format(d=bad_files) if isinstance(v, str) else v for k, v in overrides.items()}
  with pytest.raises(ValueError, match=match) as e:
    build_data(data_cfg(**overrides), global_batch_size=4, seed=0)
  assert isinstance(e.value, DataError)
