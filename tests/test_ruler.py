"""Tests of the RULER-style tasks (input_pipeline/ruler.py) and the training mixture (data.mix_*).

The gold answers are checked against an independent oracle: regular expressions that read the
needles back from the prompt."""

import hashlib
import json
import pickle
import re

import grain
import numpy as np
import pytest

from gated_attention.config import scales
from gated_attention.input_pipeline import DataError, build_data, make_tokenizer, ruler
from gated_attention.input_pipeline.packing import PackIterDataset
from gated_attention.input_pipeline.shuffle import WindowShuffleIterDataset
from gated_attention.input_pipeline.sources import Documents, load_documents, split_documents
from tests.test_input_pipeline import assert_batches_equal

BOS = 256  # the byte tokenizer's
SEED = 1201  # assertion messages name the seed, so another can be tried by editing this line


class ListDocs(Documents):
  def __init__(self, texts):
    self.texts, self.name = list(texts), 'test documents'

  def __len__(self):
    return len(self.texts)

  def __getitem__(self, i):
    return self.texts[i]


@pytest.fixture(scope='module')
def byte_tok():
  return make_tokenizer('byte')


@pytest.fixture(scope='module')
def held_out():
  """The built-in corpus's held-out documents (17 stdlib files on CPython 3.11)."""
  cfg = scales.get_config().data
  docs = load_documents(cfg)
  _, val_ids = split_documents(len(docs), cfg.val_fraction)
  return ruler.DocumentSubset(docs, val_ids, 'held-out')


# --- the oracle: the needles read back by regular expressions ----------------------------------

QUESTION = {
    'niah_single': r'What is the pass key\? The pass key is$',
    'niah_multikey': r'What is the magic number for ([A-Z]+)\? The magic number for \1 is$',
    'niah_multivalue':
        r'What are all the magic numbers for ([A-Z]+)\? The magic numbers for \1 are$',
    'variable_tracking':
        r'Which variables have the value (\d+)\? The variables with the value \1 are$',
}


def oracle(task, prompt):
  """The answers (in text order) that the needles of `prompt` give to its question."""
  asked = re.search(QUESTION[task], prompt)
  assert asked, prompt[-200:]
  if task == 'niah_single':
    (value,) = re.findall(r'^The pass key is (\d{5})\. Remember it\.$', prompt, re.M)
    return [value]
  if task in ('niah_multikey', 'niah_multivalue'):
    needles = re.findall(r'^The magic number for ([A-Z]{4}) is (\d{5})\.$', prompt, re.M)
    keys = [k for k, _ in needles]
    if task == 'niah_multikey':
      assert len(needles) == 4 and len(set(keys)) == 4 and len({v for _, v in needles}) == 4
    else:
      assert set(keys) == {asked.group(1)} and 2 <= len(needles) <= 4
    return [v for k, v in needles if k == asked.group(1)]
  value_of = {}
  for name, rhs in re.findall(r'^VAR ([A-Z]{4}) = ([A-Z]{4}|\d{5})\.$', prompt, re.M):
    assert name not in value_of
    value_of[name] = rhs if rhs.isdigit() else value_of[rhs]  # a chain reads in assignment order
  assert len(value_of) == 5
  return [name for name, v in value_of.items() if v == asked.group(1)]


@pytest.mark.parametrize('num_tokens', [256, 1024, 4096])
@pytest.mark.parametrize('task', ruler.TASKS)
def test_lengths_formats_and_gold_answers(task, num_tokens, byte_tok, held_out):
  for e in ruler.examples(task, num_tokens=num_tokens, count=3, seed=SEED, tokenizer=byte_tok,
                          haystack=held_out):
    n = len(byte_tok.encode_doc(e.prompt + e.target))
    assert num_tokens - 3 <= n <= num_tokens, (SEED, n)  # short only by a cut multi-byte character
    assert e.task == task and oracle(task, e.prompt) == list(e.answers), SEED
    assert e.target == ' ' + ', '.join(e.answers) + ruler.TERMINATOR
    assert len(e.answers) == (1 if task in ('niah_single', 'niah_multikey') else
                              len(set(e.answers)))
    assert not e.prompt.endswith(' ') and 0.0 <= e.depth <= 1.0


def test_min_tokens(byte_tok, held_out):
  want = {'niah_single': 81, 'niah_multikey': 215, 'niah_multivalue': 244, 'variable_tracking': 193}
  assert {t: ruler.min_tokens(t, byte_tok) for t in ruler.TASKS} == want
  for task, n in want.items():  # exactly the minimum: needles and question, no haystack
    (e,) = ruler.examples(task, num_tokens=n, count=1, seed=SEED, tokenizer=byte_tok,
                          haystack=held_out)
    assert len(byte_tok.encode_doc(e.prompt + e.target)) <= n and oracle(task, e.prompt)


def test_depth_is_the_needles_position_and_spreads(byte_tok, held_out):
  depths = []
  for e in ruler.examples('niah_single', num_tokens=2048, count=40, seed=SEED, tokenizer=byte_tok,
                          haystack=held_out):
    body = e.prompt[:-len('What is the pass key? The pass key is')]
    needle = re.search(r'^The pass key is \d+\. Remember it\.\n', body, re.M)
    before = len(body[:needle.start()].encode())
    hay = before + len(body[needle.end():].encode())
    assert e.depth == pytest.approx(before / hay), SEED
    depths.append(e.depth)
  assert 0.0 <= min(depths) < 0.15 and 0.85 < max(depths) <= 1.0, (SEED, depths)
  assert 0.3 < np.mean(depths) < 0.7, (SEED, depths)


def test_deterministic(byte_tok, held_out):
  make = lambda task='niah_multikey', n=512, count=4, seed=SEED: ruler.examples(
      task, num_tokens=n, count=count, seed=seed, tokenizer=byte_tok, haystack=held_out)
  a = make()
  assert a == make() and make(count=2) == a[:2]
  assert len({e.prompt for e in a}) == 4
  for other in (make(seed=SEED + 1), make(n=513), make(task='niah_single')):
    assert not {e.prompt for e in a} & {e.prompt for e in other}


def test_score(byte_tok, held_out):
  (single,) = ruler.examples('niah_single', num_tokens=300, count=1, seed=SEED,
                             tokenizer=byte_tok, haystack=held_out)
  (multi,) = ruler.examples('variable_tracking', num_tokens=300, count=1, seed=SEED,
                            tokenizer=byte_tok, haystack=held_out)
  v, names = single.answers[0], list(multi.answers)
  assert ruler.score(single, single.target) == 1.0 == ruler.score(multi, multi.target)
  for good in (f' {v}', f'{v}\nWhat is', f' {v} \n\n'):
    assert ruler.score(single, good) == 1.0
  for bad in ('', ' 12345\n', f' {v}0\n', f' {v} is the key\n', f'\n {v}\n'):
    assert ruler.score(single, bad) == 0.0
  assert ruler.score(multi, ' ' + ', '.join(names[::-1]) + '\n') == 1.0  # any order
  assert ruler.score(multi, ','.join(names) + '\nVAR') == 1.0
  for bad in (names[:-1], names + ['ABCD'], names[:-1] + ['ABCD'], []):
    assert ruler.score(multi, ' ' + ', '.join(bad) + '\n') == 0.0
  assert ruler.score(multi, ' ' + ' '.join(names) + '\n') == 0.0


def test_bad_requests_fail_clearly(byte_tok, held_out):
  kw = dict(count=1, seed=0, tokenizer=byte_tok, haystack=held_out)
  with pytest.raises(DataError, match="Unknown RULER task 'niah_x'; choose one of niah_single, "):
    ruler.examples('niah_x', num_tokens=512, **kw)
  with pytest.raises(DataError, match=r'num_tokens=200 is too small for niah_multikey.*least 215'):
    ruler.examples('niah_multikey', num_tokens=200, **kw)
  with pytest.raises(DataError, match='seed >= 0'):
    ruler.examples('niah_single', num_tokens=512, **{**kw, 'seed': -1})
  for empty in (ListDocs([]), ListDocs(['', ' \n', '\n\n'])):
    with pytest.raises(DataError, match='test documents.*(no documents|are empty)'):
      ruler.examples('niah_single', num_tokens=512, **{**kw, 'haystack': empty})
  with pytest.raises(DataError, match="Unknown RULER task.*'nope'.*choose \"all\""):
    ruler.parse_tasks('niah_single,nope')


def test_short_and_odd_documents(byte_tok):
  """One-word documents, long lines without newlines, non-ASCII text: still fits and parses."""
  docs = ListDocs(['x', 'é' * 3000, 'ab\ncd\n' * 50, '', '日本語 ' * 400])
  for task in ruler.TASKS:
    for e in ruler.examples(task, num_tokens=700, count=4, seed=SEED, tokenizer=byte_tok,
                            haystack=docs):
      assert 700 - 3 <= len(byte_tok.encode_doc(e.prompt + e.target)) <= 700, SEED
      assert oracle(task, e.prompt) == list(e.answers), SEED


def test_bpe_tokenizer_lengths_and_prefix(tmp_path, held_out):
  tk = pytest.importorskip('tokenizers')
  raw = tk.Tokenizer(tk.models.BPE())
  raw.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
  raw.decoder = tk.decoders.ByteLevel()
  raw.train_from_iterator([held_out[i] for i in range(4)], tk.trainers.BpeTrainer(
      vocab_size=600, special_tokens=['<|endoftext|>'],
      initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
  raw.save(str(tmp_path / 'tokenizer.json'))
  tok = make_tokenizer(str(tmp_path / 'tokenizer.json'))
  for task in ruler.TASKS:
    for e in ruler.examples(task, num_tokens=1024, count=2, seed=SEED, tokenizer=tok,
                            haystack=held_out):
      full, prompt = tok.encode_doc(e.prompt + e.target), tok.encode_doc(e.prompt)
      assert 0.97 * 1024 <= len(full) <= 1024, (SEED, task, len(full))
      np.testing.assert_array_equal(full[:len(prompt)], prompt)  # the model continues the prompt
      assert tok.decode(full[len(prompt):]) == e.target
      assert oracle(task, e.prompt) == list(e.answers)


# --- the training mixture ----------------------------------------------------------------------

@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """40 small text files, each starting with its marker 'docNN:': (glob, texts)."""
  root = tmp_path_factory.mktemp('corpus')
  rng = np.random.default_rng(0)
  words = ['alpha', 'beta', 'gamma', 'délta', 'for i in range(3):', '\n']
  texts = [f'doc{i:02d}: ' + ' '.join(rng.choice(words, rng.integers(5, 30))) for i in range(40)]
  for i, text in enumerate(texts):
    (root / f'{i:02d}.txt').write_text(text, encoding='utf-8')
  return str(root / '*.txt'), texts


def corpus_cfg(corpus, **overrides):
  cfg = scales.get_config().data
  cfg.update(dict(source='text', path=corpus[0], seq_len=32, val_fraction=0.2, val_batches=2,
                  shuffle_buffer=8, mix_tokens=300), **overrides)
  return cfg


def take(it, n):
  return [next(it) for _ in range(n)]


def stream_documents(batches, tokenizer):
  """The complete documents of the batches' token stream (after the first BOS)."""
  stream = np.concatenate([np.concatenate([b['inputs'][r], b['targets'][r, -1:]])
                           for b in batches for r in range(len(b['inputs']))])
  starts = np.flatnonzero(stream == BOS)
  return [tokenizer.decode(stream[a + 1:b]) for a, b in zip(starts[:-1], starts[1:])]


TASK_DOC = re.compile(r'(The pass key is|The magic number for [A-Z]+ is|The magic numbers for '
                      r'[A-Z]+ are|The variables with the value \d+ are) [A-Z0-9, ]+\n$')


def reference_batches(cfg, seed, n):
  """The train batches of the pipeline before the mixture existed, rebuilt from grain's parts."""
  derive = lambda tag: int.from_bytes(hashlib.sha256(f'{seed}/{tag}'.encode()).digest()[:4],
                                      'little') >> 1
  docs, tok = load_documents(cfg), make_tokenizer(cfg.tokenizer)
  train_ids, _ = split_documents(len(docs), cfg.val_fraction)
  ids = grain.MapDataset.source(train_ids).shuffle(seed=derive('documents'))
  token_docs = ids.repeat().map(lambda i: tok.encode_doc(docs[int(i)]))
  ds = PackIterDataset(token_docs.to_iter_dataset(), cfg.seq_len + 1)
  ds = WindowShuffleIterDataset(ds, window_size=cfg.shuffle_buffer, seed=derive('windows/0'))
  it = iter(ds.batch(4, drop_remainder=True))
  return [{'inputs': w[:, :-1], 'targets': w[:, 1:], 'loss_mask': np.ones((4, cfg.seq_len))}
          for w in take(it, n)]


def test_mixing_off_changes_nothing(corpus):
  assert scales.get_config().data.mix_ratio == 0.0
  want = reference_batches(corpus_cfg(corpus), 3, 30)
  for cfg in (corpus_cfg(corpus), corpus_cfg(corpus, mix_tasks='all', mix_tokens=0)):
    data = build_data(cfg, global_batch_size=4, seed=3)
    assert data.mixture is None and 'mixture' not in data.describe()
    assert_batches_equal(want, take(data.train_iter, 30))


def test_mixture_documents(corpus):
  cfg = corpus_cfg(corpus, mix_tasks='all', mix_ratio=0.25, shuffle_buffer=0)
  data = build_data(cfg, global_batch_size=8, seed=SEED)
  docs = stream_documents(take(data.train_iter, 160), data.tokenizer)
  is_task = [bool(TASK_DOC.search(d)) for d in docs]
  task_docs = [d for d, t in zip(docs, is_task) if t]
  share = data.mixture.doc_share  # of the documents, for 0.25 of the tokens
  train_docs = data.train_documents()  # fewer than the pipeline's sample: all of them
  corpus_tokens = np.mean([len(data.tokenizer.encode_doc(train_docs[i]))
                           for i in range(len(train_docs))])
  assert share == pytest.approx(0.25 * corpus_tokens / (0.25 * corpus_tokens + 0.75 * 300))
  assert len(docs) > 200 and abs(np.mean(is_task) - share) < 0.02, (SEED, np.mean(is_task))
  tokens = np.array([len(data.tokenizer.encode_doc(d)) for d in docs])
  token_share = tokens[np.array(is_task)].sum() / tokens.sum()
  assert abs(token_share - 0.25) < 0.03, (SEED, token_share)
  corpus_docs = {d for d, t in zip(docs, is_task) if not t}
  train = {data.train_documents()[i] for i in range(len(data.train_documents()))}
  held_out = {data.held_out_documents()[i] for i in range(len(data.held_out_documents()))}
  assert corpus_docs == train and not train & held_out and train | held_out == set(corpus[1])
  assert len(set(task_docs)) == len(task_docs)  # every task document is a new example
  for task in ruler.TASKS:  # all four tasks, each answerable from its own needles
    questions = [re.search(QUESTION[task][:-1], d) for d in task_docs]
    assert any(questions), (SEED, task)
    for d, q in zip(task_docs, questions):
      if q:
        assert d[q.end():] == ' ' + ', '.join(oracle(task, d[:q.end()])) + '\n', SEED
  markers = set()
  for d in task_docs:  # 300 tokens, BOS included; haystack text of train documents only
    assert 300 - 3 <= len(data.tokenizer.encode_doc(d)) <= 300
    lines = d.split('\n')[:-2]  # the question's line and the target's end
    for line in lines:
      assert re.match(r'(The magic number|The pass key|VAR )', line) or any(
          line in t for t in train), (SEED, line)
    markers |= set(re.findall(r'doc\d\d:', d))
  assert markers and all(any(t.startswith(m) for t in train) for m in markers), SEED
  assert data.mixture.tasks == ruler.TASKS
  haystack = data.train_documents()  # the haystack the pipeline passes is the train split
  assert {haystack[i] for i in range(len(haystack))} == train
  mixture = data.describe()['mixture']
  assert mixture['token_share'] == 0.25 and mixture['tokens_per_document'] == 300
  assert mixture['document_share'] == pytest.approx(share, abs=1e-4)


def test_mixture_processes_and_seeds(corpus):
  cfg = corpus_cfg(corpus, mix_tasks='niah_single,variable_tracking', mix_ratio=0.5,
                   mix_tokens=200, shuffle_buffer=0)
  per_process = []
  for p in range(2):
    data = build_data(cfg, global_batch_size=4, seed=SEED, process_index=p, process_count=2,
                      per_process_stream=True)   # runs saved before issue 45
    docs = stream_documents(take(data.train_iter, 80), data.tokenizer)
    per_process.append({d for d in docs if TASK_DOC.search(d)})
  assert all(len(s) > 10 for s in per_process) and not per_process[0] & per_process[1]
  a, b, c = (take(build_data(cfg, global_batch_size=4, seed=s).train_iter, 5)
             for s in (SEED, SEED, SEED + 1))
  assert_batches_equal(a, b)
  assert any(not np.array_equal(x['inputs'], y['inputs']) for x, y in zip(a, c))


@pytest.mark.parametrize('skip', [0, 3, 10])
def test_mixture_resumes_from_state(corpus, skip):
  cfg = corpus_cfg(corpus, mix_tasks='all', mix_ratio=0.3)
  data = build_data(cfg, global_batch_size=4, seed=SEED)
  take(data.train_iter, skip)
  state = json.loads(json.dumps(data.train_iter.get_state()))
  expected = take(data.train_iter, 25)
  restored = build_data(cfg, global_batch_size=4, seed=SEED)
  restored.train_iter.set_state(state)
  assert_batches_equal(expected, take(restored.train_iter, 25))


def test_task_stream_pickles(corpus, byte_tok):
  haystack = ruler.DocumentSubset(ListDocs(corpus[1]), range(0, 40, 2), 'train')
  stream = ruler.TaskStream(ruler.TASKS, 400, byte_tok, haystack, seed=5)
  again = pickle.loads(pickle.dumps(stream))
  for i in (0, 7, 123456789):
    np.testing.assert_array_equal(stream(i), again(i))
    assert stream(i)[0] == BOS and len(stream(i)) <= 400


@pytest.mark.parametrize('overrides, match', [
    (dict(source='synthetic', mix_tasks='all', mix_ratio=0.1), "data.source='synthetic' has none"),
    (dict(mix_tasks='all', mix_ratio=1.0), r'data.mix_ratio=1.0 must be in \[0, 1\)'),
    (dict(mix_tasks='all', mix_ratio=-0.1), r'must be in \[0, 1\)'),
    (dict(mix_ratio=0.1), 'needs data.mix_tasks'),
    (dict(mix_tasks='niah_single,niah_mk', mix_ratio=0.1), r"Unknown RULER task.*'niah_mk'"),
    (dict(mix_tasks='all', mix_ratio=0.1, mix_tokens=0),
     r'Task documents of 16 tokens .* too short for niah_single, .* at least 81'),
    (dict(mix_tasks='niah_multivalue', mix_ratio=0.1, mix_tokens=243),
     r'mix_tokens >= 244, or leave niah_multivalue out'),
])
def test_bad_mixture_settings_fail_clearly(corpus, overrides, match):
  with pytest.raises(DataError, match=match):
    build_data(corpus_cfg(corpus, **overrides), global_batch_size=4, seed=0)
