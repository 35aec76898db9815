"""Weighted mixtures of corpora (data.mixture, input_pipeline/mixture.py, docs/mixtures.md).

The corpora are written in disjoint alphabets, so the byte tokenizer's ids say which corpus a
token came from: the realized shares, the per-source token counts and the per-source validation
sets are checked against the tokens themselves, not against the tags the pipeline carries.
"""

import hashlib
import json
import os
import time

import numpy as np
import pytest

from gated_attention import storage
from gated_attention.analysis import compare
from gated_attention.config import schema, scales
from gated_attention.errors import ConfigError, UserError
from gated_attention.input_pipeline import DataError, build_data, make_tokenizer, mixture
from gated_attention.input_pipeline import pipeline, tokenized
from gated_attention.input_pipeline.sources import split_documents
from tests.test_input_pipeline import BOS, assert_batches_equal, data_cfg, take

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_TOKENIZER = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied', 'tokenizer.json')
# corpus -> (its alphabet, documents): disjoint byte sets, different sizes (different epochs)
# and mean lengths (lognormal mu)
CORPORA = {'code': ('abcdefghij', 90, 4.3), 'math': ('0123456789', 40, 2.8),
           'web': ('KLMNOPQRSTUVW', 150, 3.5)}
ALPHABET = {name: np.frombuffer(a.encode(), np.uint8).astype(np.int32)
            for name, (a, _, _) in CORPORA.items()}


def _texts(name: str, seed: int) -> list[str]:
  """Documents of very different lengths (lognormal, 1 to 400 characters)."""
  alphabet, n, mu = CORPORA[name]
  rng = np.random.default_rng(seed)
  lengths = np.clip(rng.lognormal(mu, 1.0, n).astype(int), 1, 400)
  return [''.join(rng.choice(list(alphabet), k)) for k in lengths]


def _write_jsonl(root, name: str, seed: int = 0) -> str:
  os.makedirs(root, exist_ok=True)
  path = os.path.join(root, f'{name}.jsonl')
  with open(path, 'w', encoding='utf-8') as f:
    for t in _texts(name, seed):
      f.write(json.dumps({'text': t}) + '\n')
  return path


def _tokenize(text_path: str, out: str, tokenizer: str = 'byte') -> str:
  tokenized.tokenize(data_cfg(source='jsonl', path=text_path, val_fraction=0.1,
                              shard_documents=32, tokenizer=tokenizer), out, workers=1,
                     progress=False)
  return out


@pytest.fixture(scope='module')
def corpora(tmp_path_factory):
  """{name: (jsonl path, its tokenized folder)} of the three corpora."""
  root = str(tmp_path_factory.mktemp('mix'))
  out = {}
  for i, name in enumerate(CORPORA):
    text = _write_jsonl(os.path.join(root, 'text'), name, seed=i)
    out[name] = (text, _tokenize(text, os.path.join(root, 'tok', name)))
  return out


WEIGHTS = {'code': 0.25, 'math': 0.15, 'web': 0.6}


def mix_cfg(corpora, weights=None, tokenized_sources=True, **overrides):
  weights = weights or WEIGHTS
  entries = {name: {'weight': w, 'source': 'tokenized' if tokenized_sources else 'jsonl',
                    'path': corpora[name][1] if tokenized_sources else corpora[name][0]}
             for name, w in weights.items()}
  settings = dict(seq_len=16, val_fraction=0.1, val_batches=2, shuffle_buffer=8,
                  mixture=entries)
  return data_cfg(**{**settings, **overrides})


def source_of(tokens: np.ndarray) -> np.ndarray:
  """The corpus index (sorted names) of each token by its byte; -1 for BOS."""
  out = np.full(tokens.shape, -1)
  for s, name in enumerate(sorted(CORPORA)):
    out[np.isin(tokens, ALPHABET[name])] = s
  assert ((out >= 0) | (tokens == BOS)).all()
  return out


def stream_of(batches) -> np.ndarray:
  """The packed token stream of batches taken in order without window shuffling."""
  return np.concatenate([np.concatenate([b['inputs'][r], b['targets'][r, -1:]])
                         for b in batches for r in range(len(b['inputs']))])


def sources_by_content(stream: np.ndarray) -> np.ndarray:
  """The corpus of each token of a stream, a BOS taking its document's (the next token's);
  -1 for a BOS at the very end."""
  src = source_of(stream)
  for j in range(len(src) - 1, -1, -1):
    if src[j] < 0:
      src[j] = src[j + 1] if j + 1 < len(src) else -1
  return src


# --- the sampler against a plain numpy reference ----------------------------------------------

def reference_counts(shares, block):
  """Largest remainder, written out: floor, then +1 in order of remainder (ties: lower index)."""
  exact = [p * block for p in shares]
  counts = [int(np.floor(x)) for x in exact]
  order = sorted(range(len(shares)), key=lambda s: (counts[s] - exact[s], s))
  for s in order[:block - sum(counts)]:
    counts[s] += 1
  return counts


def reference_order(counts, seed, num_docs, block):
  """docs/mixtures.md's rule, one document at a time: (source, index in its stream) of mixed
  documents 0..num_docs-1, counting each source's documents as they come."""
  out, seen = [], [0] * len(counts)
  base = []
  for s, n in enumerate(counts):
    base += [s] * n
  base = np.array(base)
  for b in range(-(-num_docs // block)):
    order = base[np.random.default_rng([seed, b]).permutation(block)]
    for s in order:
      out.append((int(s), seen[s]))
      seen[s] += 1
  return out[:num_docs]


@pytest.mark.parametrize('seed', [0, 1, 12345])
def test_block_counts_are_the_largest_remainders(seed):
  rng = np.random.default_rng(seed)
  for block in (7, 64, mixture.BLOCK):
    shares = rng.dirichlet(np.full(rng.integers(1, 6), 0.7))
    counts = mixture.block_counts(shares, block)
    assert counts.sum() == block
    assert (np.abs(counts - shares * block) < 1).all()
    assert list(counts) == reference_counts(list(shares), block)


@pytest.mark.parametrize('block,seed', [(16, 3), (97, 11), (mixture.BLOCK, 2026)])
def test_the_selection_follows_the_documented_rule(block, seed):
  rng = np.random.default_rng(seed)
  counts = mixture.block_counts(rng.dirichlet(np.ones(3)), block)
  counts[counts == 0] += 1
  counts[np.argmax(counts)] -= int(counts.sum() - block)
  sel = mixture.MixtureSelection(counts, seed, block=block)
  num = 3 * block + block // 2
  expected = reference_order(list(counts), seed, num, block)
  probe = np.concatenate([np.arange(min(num, 2000)), rng.integers(0, num, 500)])
  for k in probe:            # random access, in any order
    assert sel[int(k)] == expected[int(k)]
  for k in rng.integers(0, num, 50):
    before = np.bincount([s for s, _ in expected[:int(k)]], minlength=len(counts))
    np.testing.assert_array_equal(sel.documents_before(int(k)), before)


def reference_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
  """mixture.Permutation over all of range(n) at once, in numpy uint64 arithmetic (which wraps
  modulo 2^64 as the documented rule does)."""
  def mix(x):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
  h = max(1, int(np.ceil(int(n - 1).bit_length() / 2)))
  mask = np.uint64((1 << h) - 1)
  keys = [mix(np.array([((seed << 40) + (epoch << 8) + r + 0x9E3779B97F4A7C15) % 2**64],
                       np.uint64))[0] for r in range(4)]
  out = np.arange(n, dtype=np.uint64)
  todo = np.ones(n, bool)
  while todo.any():
    x = out[todo]
    left, right = x >> np.uint64(h), x & mask
    for key in keys:
      left, right = right, left ^ (mix(right ^ key) & mask)
    out[todo] = (left << np.uint64(h)) | right
    todo = out >= np.uint64(n)
  return out.astype(np.int64)


@pytest.mark.parametrize('n', [1, 2, 3, 17, 64, 1000, 4097])
def test_the_per_source_permutation_follows_the_documented_rule(n):
  rng = np.random.default_rng(n)
  for seed, epoch in ((0, 0), (int(rng.integers(2**31)), 0), (int(rng.integers(2**31)), 7)):
    perm = mixture.Permutation(n, seed, epoch)
    got = np.array([perm(q) for q in range(n)])
    np.testing.assert_array_equal(got, reference_permutation(n, seed, epoch))
    assert sorted(got) == list(range(n))            # a permutation
  if n >= 64:    # another epoch, another order; far from the identity
    a = [mixture.Permutation(n, 5, 0)(q) for q in range(n)]
    b = [mixture.Permutation(n, 5, 1)(q) for q in range(n)]
    assert a != b and np.mean(np.array(a) == np.arange(n)) < 0.1


# --- the contract -----------------------------------------------------------------------------

def test_token_shares_within_one_percent_over_100k_documents(corpora):
  """100,000 mixed documents of three tokenized corpora whose mean lengths differ by 4x: each
  corpus's share of the tokens (counted by their bytes) is within 1% of its weight."""
  cfg = mix_cfg(corpora)
  tok = make_tokenizer('byte')
  sources = mixture.load_sources(cfg, tok)
  means = [s.mean_tokens for s in sources]
  assert max(means) > 3 * min(means)           # document shares differ from token shares
  docs = mixture.mixed_documents(sources, tok, seed=5, derive_seed=pipeline._derive_seed)
  start = time.perf_counter()
  drawn = [docs[k] for k in range(100_000)]
  tokens = np.concatenate([d['tokens'] for d in drawn])
  lut = np.full(BOS + 1, -1)
  for s, name in enumerate(sorted(CORPORA)):
    lut[ALPHABET[name]] = s
  first = lut[np.array([d['tokens'][1] for d in drawn])]      # every document has a token
  np.testing.assert_array_equal(first, [d['source'] for d in drawn])   # the tag is the content's
  assert (lut[tokens] >= 0).sum() + len(drawn) == len(tokens)          # BOS the only other id
  counts = np.bincount(lut[tokens][lut[tokens] >= 0], minlength=3) + np.bincount(first,
                                                                                minlength=3)
  shares = counts / counts.sum()
  errors = {name: shares[s.index] - WEIGHTS[name] for name, s in zip(sorted(WEIGHTS), sources)}
  print(f'\nshares over 100k documents: {dict(zip(sorted(WEIGHTS), shares.round(5)))}, errors '
        f'{ {k: round(v, 5) for k, v in errors.items()} } ({time.perf_counter() - start:.1f} s)')
  assert all(abs(e) < 0.01 for e in errors.values()), errors


def _source_epochs_by_content(stream: np.ndarray, num_train: dict) -> np.ndarray:
  """The epoch of the document each token of a packed stream (starting with BOS) belongs to,
  from the documents' order of appearance per corpus."""
  assert stream[0] == BOS
  doc_n = np.cumsum(stream == BOS) - 1
  starts = np.flatnonzero(stream == BOS)
  names, seen, epoch_of_doc = sorted(CORPORA), {}, []
  for a in starts:
    if a + 1 == len(stream):                      # a BOS at the very end: its corpus unknown
      epoch_of_doc.append(-1)
      continue
    s = source_of(stream[a + 1:a + 2])[0]
    seen[s] = seen.get(s, 0) + 1
    epoch_of_doc.append((seen[s] - 1) // num_train[names[s]])
  return np.array(epoch_of_doc)[doc_n]


def test_the_accounting_counts_each_source(corpora):
  """Tokens per source (the iterator state's) are those of the targets by their bytes; epochs
  begun are those of the documents' order of appearance (every corpus is read past its first
  epoch); with windows shuffled in blocks of 8, the first 4N windows are the same set."""
  N = 720    # batches of 4 windows
  unshuffled = build_data(mix_cfg(corpora, shuffle_buffer=0), global_batch_size=4, seed=1)
  stream = stream_of(take(unshuffled.train_iter, N + 1))   # one batch more: the last BOS's doc
  num_train = {s.name: len(s.train_ids) for s in unshuffled.sources}
  src, epoch = sources_by_content(stream), _source_epochs_by_content(stream, num_train)
  targets = (np.arange(len(stream)) % 17 != 0) & (np.arange(len(stream)) < N * 4 * 17)
  tokens = np.bincount(src[targets], minlength=3)
  epochs = [epoch[targets & (src == s)].max() + 1 for s in range(3)]
  assert min(epochs) >= 2                                   # every corpus is in epoch 2 or later
  assert tokens.sum() == N * 4 * 16
  for shuffle_buffer in (0, 8):
    data = build_data(mix_cfg(corpora, shuffle_buffer=shuffle_buffer), global_batch_size=4, seed=1)
    take(data.train_iter, N)
    got = data.accounting(data.train_iter.get_state())
    assert [got[f'tokens/{n}'] for n in sorted(CORPORA)] == list(tokens)
    assert [got[f'epochs/{n}'] for n in sorted(CORPORA)] == epochs
    assert [got[f'share/{n}'] for n in sorted(CORPORA)] == pytest.approx(tokens / tokens.sum())


def test_a_source_that_runs_out_starts_a_reshuffled_epoch(corpora):
  tok = make_tokenizer('byte')
  sources = mixture.load_sources(mix_cfg(corpora), tok)
  docs = mixture.mixed_documents(sources, tok, seed=0, derive_seed=pipeline._derive_seed)
  math_src = next(s for s in sources if s.name == 'math')
  n = len(math_src.train_ids)
  got = [(d['epoch'], d['tokens'].tobytes()) for d in docs[:6000] if d['source'] == math_src.index]
  epochs = [got[e * n:(e + 1) * n] for e in range(3)]
  train_docs = sorted(math_src.docs[int(i)].tobytes() for i in math_src.train_ids)
  for e, epoch in enumerate(epochs):
    assert [x for x, _ in epoch] == [e] * n
    assert sorted(t for _, t in epoch) == train_docs    # every training document once
  assert epochs[0] != epochs[1] != epochs[2]            # in another order each time


def test_exact_resume(corpora):
  """The batches after a restored position (through JSON, as checkpoints store it) are the
  uninterrupted run's, and the accounting goes on from where it was."""
  cfg = mix_cfg(corpora)
  reference = build_data(cfg, global_batch_size=4, seed=2)
  batches = take(reference.train_iter, 40)
  final = reference.accounting(reference.train_iter.get_state())
  for cut in (1, 13, 27):
    first = build_data(cfg, global_batch_size=4, seed=2)
    take(first.train_iter, cut)
    state = json.loads(json.dumps(first.train_iter.get_state()))
    resumed = build_data(cfg, global_batch_size=4, seed=2)
    resumed.train_iter.set_state(state)
    assert_batches_equal(take(resumed.train_iter, 40 - cut), batches[cut:])
    assert resumed.accounting(resumed.train_iter.get_state()) == final


def test_the_same_batches_for_one_and_two_processes(corpora):
  cfg = mix_cfg(corpora)
  one = build_data(cfg, global_batch_size=4, seed=3)
  expected = take(one.train_iter, 12)
  val = one.val_sets()
  for p in range(2):
    two = build_data(cfg, global_batch_size=4, seed=3, process_index=p, process_count=2)
    assert_batches_equal(take(two.train_iter, 12), expected)
    for name, batches in two.val_sets().items():
      assert_batches_equal(batches, [{k: v[2 * p:2 * p + 2] for k, v in b.items()}
                                     for b in val[name]])


def test_worker_processes_give_the_same_batches(corpora):
  """data.worker_count: the mixture's parts are pickled into a worker process."""
  import gc  # pylint: disable=g-import-not-at-top
  a = take(build_data(mix_cfg(corpora), global_batch_size=4, seed=0).train_iter, 6)
  data = build_data(mix_cfg(corpora, worker_count=1), global_batch_size=4, seed=0)
  assert_batches_equal(a, take(data.train_iter, 6))
  assert data.accounting(data.train_iter.get_state())['tokens/web'] > 0
  data.train_iter.close()
  del data
  gc.collect()


def test_validation_is_per_source(corpora):
  data = build_data(mix_cfg(corpora, val_batches=3), global_batch_size=4, seed=0)
  sets = data.val_sets()
  assert list(sets) == sorted(CORPORA)
  for s, (name, batches) in enumerate(sets.items()):
    assert len(batches) == 3
    for b in batches:
      src = source_of(b['inputs'])
      assert set(np.unique(src)) <= {-1, s}          # only that corpus's held-out documents
    source = next(x for x in data.sources if x.name == name)
    held_out = {source.docs[int(i)][1:].tobytes() for i in source.val_ids}
    first = batches[0]['inputs'][0]
    starts = np.flatnonzero(first == BOS)
    doc = first[starts[0] + 1:starts[1]] if len(starts) > 1 else None
    if doc is not None:
      assert doc.tobytes() in held_out
  assert data.val_batches() == [b for bs in sets.values() for b in bs]


def test_text_sources_mix_like_their_tokenized_folders(corpora):
  """jsonl corpora and the folders tokenized from them: the same documents, so the same
  batches (a text source's mean length is exact below MEAN_SAMPLE_DOCS documents)."""
  a = build_data(mix_cfg(corpora, tokenized_sources=False), global_batch_size=4, seed=4)
  b = build_data(mix_cfg(corpora), global_batch_size=4, seed=4)
  assert_batches_equal(take(a.train_iter, 20), take(b.train_iter, 20))
  assert a.accounting(a.train_iter.get_state()) == b.accounting(b.train_iter.get_state())
  for name in CORPORA:
    assert_batches_equal(a.val_sets()[name], b.val_sets()[name])


def test_a_mixture_on_gcs_equals_the_same_mixture_read_locally(gcs, corpora):
  remote = {}
  for name, (text, folder) in corpora.items():
    remote[name] = (text, gcs.url(f'tok/{name}'))
    for f in os.listdir(folder):
      with open(os.path.join(folder, f), 'rb') as fh:
        storage.write(f'{remote[name][1]}/{f}', fh.read())
  local = build_data(mix_cfg(corpora), global_batch_size=4, seed=6)
  there = build_data(mix_cfg(remote), global_batch_size=4, seed=6)
  assert_batches_equal(take(there.train_iter, 30), take(local.train_iter, 30))
  assert there.accounting(there.train_iter.get_state()) == local.accounting(
      local.train_iter.get_state())
  for name in CORPORA:
    assert_batches_equal(there.val_sets()[name], local.val_sets()[name])


# --- refusals ---------------------------------------------------------------------------------

def _bad(corpora, tmp_path, case):
  entries = {n: {'weight': WEIGHTS[n], 'source': 'tokenized', 'path': corpora[n][1]}
             for n in CORPORA}
  if case == 'missing':
    entries['code'] = {'weight': 0.2, 'source': 'jsonl', 'path': str(tmp_path / 'none/*.jsonl')}
  elif case == 'missing_folder':
    entries['code']['path'] = str(tmp_path / 'no_such_folder')
  elif case == 'zero':
    entries['math']['weight'] = 0
  elif case == 'negative':
    entries['math']['weight'] = -0.5
  elif case == 'unknown_key':
    entries['web']['pathh'] = 'x'
  elif case == 'tokenizers':
    other = _tokenize(corpora['math'][0], str(tmp_path / 'math_hf'), tokenizer=HF_TOKENIZER)
    entries['math']['path'] = other
  elif case == 'mix_ratio':
    return dict(mixture=entries, mix_tasks='all', mix_ratio=0.2)
  elif case == 'tiny':
    entries['math']['weight'] = 1e-7
  elif case == 'name':
    entries['web text'] = entries.pop('web')
  elif case == 'synthetic':
    entries['web']['source'] = 'synthetic'
  return dict(mixture=entries)


BAD = {
    'missing': r"data\.mixture\.code \(source='jsonl'.*matched no files",
    'missing_folder': r'data\.mixture\.code .*no_such_folder.*manifest',
    'zero': r'data\.mixture\.math\.weight=0: every entry of a mixture needs a positive weight',
    'negative': r'data\.mixture\.math\.weight=-0\.5',
    'unknown_key': r'data\.mixture\.web has key\(s\) pathh.*weight, source, path',
    'tokenizers': r'data\.mixture\.code .* and data\.mixture\.math .* different tokenizers',
    'mix_ratio': r'data\.mix_ratio > 0 .* data\.mixture',
    'tiny': r'data\.mixture\.math\.weight=.* less than one document in 65536',
    'name': r"data\.mixture\.web text: a mixture entry's name is letters, digits",
    'synthetic': r"data\.mixture\.web: source='synthetic' cannot be mixed",
}


@pytest.mark.parametrize('case', list(BAD))
def test_bad_mixtures_are_refused_before_anything_is_written(corpora, tmp_path, case):
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  c = scales.get_config('tiny')
  c.data.update(seq_len=16, val_fraction=0.1, **_bad(corpora, tmp_path, case))
  workdir = tmp_path / 'run'
  workdir.mkdir()
  with pytest.raises(DataError, match=BAD[case]) as e:
    loop.start_run(c, str(workdir))
  assert isinstance(e.value, UserError) and '\n' not in str(e.value)
  assert os.listdir(workdir) == []


def test_the_schema_checks_mixture_entries():
  c = scales.get_config('tiny')
  assert c.data.mixture.to_dict() == {}
  c.data.mixture = {'web': {'weight': 0.7, 'source': 'tokenized', 'path': 'gs://b/web'},
                    'code': {'weight': 0.3, 'paht': 'x'}}
  with pytest.raises(ConfigError, match=r'data\.mixture\.code\.paht \(did you mean '
                                        r'data\.mixture\.code\.path\?\)'):
    schema.check(c)
  c.data.mixture = {'web': {'weight': 'heavy'}}
  with pytest.raises(ConfigError, match=r'data\.mixture\.web\.weight is "heavy", not a number'):
    schema.check(c)
  c.data.mixture = {'web': 3}
  with pytest.raises(ConfigError, match=r'data\.mixture\.web is 3, not an object'):
    schema.check(c)
  c.data.mixture = {'web': {'weight': 2, 'source': 'text', 'path': 'a/*.txt'}}
  schema.check(c)
  assert 'data.mixture' in schema.fixed_fields(schema.ITERATOR)   # a resume may not change it
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  saved = json.loads(json.dumps(c.to_dict()))
  now = c.to_dict()
  assert rundir.iterator_differences(saved, now) == []
  now['data']['mixture']['web']['weight'] = 3
  assert [d.split(':')[0] for d in rundir.iterator_differences(saved, now)] == ['data.mixture']


def test_a_saved_mixture_config_reads_back(tmp_path):
  from gated_attention.runs import upgrade  # pylint: disable=g-import-not-at-top
  c = scales.get_config('tiny')
  c.data.mixture = {'web': {'weight': 0.7, 'source': 'tokenized', 'path': 'gs://b/web'}}
  again = upgrade.from_saved(json.loads(json.dumps(c.to_dict())))
  assert again.data.mixture.web.weight == 0.7 and again.data.mixture.web.path == 'gs://b/web'
  old = c.to_dict()
  del old['data']['mixture']                 # a run saved before mixtures: no mixture
  assert upgrade.from_saved(old).data.mixture.to_dict() == {}
  bad = c.to_dict()
  bad['data']['mixture']['web']['wieght'] = 1.0
  with pytest.raises(ConfigError, match=r'data\.mixture\.web\.wieght'):
    upgrade.from_saved(bad)


def test_the_command_line_sets_a_mixture(tmp_path):
  """ml_collections' idiom: a whole mixture as a dict literal, or one field of an entry."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  script = (
      'from absl import app\nfrom ml_collections import config_flags\n'
      'from gated_attention.config import schema\n'
      "C = config_flags.DEFINE_config_file('config')\n"
      'def main(_):\n  schema.check(C.value)\n'
      '  print(json.dumps(C.value.data.mixture.to_dict(), sort_keys=True))\n'
      'import json\napp.run(main)\n')
  (tmp_path / 'show.py').write_text(script)
  variant = tmp_path / 'mix.py'
  variant.write_text('from gated_attention.config import scales\n'
                     'def get_config():\n  c = scales.get_config("tiny")\n'
                     "  c.data.mixture = {'web': dict(weight=0.7, source='tokenized', path='w'),\n"
                     "                    'code': dict(weight=0.3, source='jsonl', path='c')}\n"
                     '  return c\n')
  env = dict(os.environ, PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, str(tmp_path / 'show.py'), f'--config={variant}',
                        '--config.data.mixture.code.weight=0.5'], capture_output=True,
                       text=True, env=env, check=True).stdout
  assert json.loads(out)['code']['weight'] == 0.5
  out = subprocess.run([sys.executable, str(tmp_path / 'show.py'), f'--config={variant}',
                        "--config.data.mixture={'math': {'weight': 1.0, 'path': 'm'}}"],
                       capture_output=True, text=True, env=env, check=True).stdout
  assert json.loads(out) == {'math': {'weight': 1.0, 'path': 'm'}}


# --- single source unchanged; compare columns ------------------------------------------------

def test_a_single_source_keeps_its_batches(tmp_path):
  """The digest of a text corpus's first batches, as main computed it before mixtures existed
  (commit d432e4d): data.mixture empty takes the single-source path, unchanged."""
  rng = np.random.default_rng(0)
  words = ['alpha', 'beta', 'gamma', 'délta', 'ε', '日本', 'x', 'for i in range(3):', '\n']
  texts = [''] + [f'doc{i:02d} ' + ' '.join(rng.choice(words, rng.integers(0, 20)))
                  for i in range(1, 40)]
  for i, t in enumerate(texts):
    (tmp_path / f'{i:02d}.txt').write_text(t, encoding='utf-8')
  d = build_data(data_cfg(source='text', path=str(tmp_path / '*.txt'), seq_len=16,
                          val_fraction=0.1, val_batches=8, shuffle_buffer=4),
                 global_batch_size=4, seed=3)
  h = hashlib.sha256()
  for _ in range(12):
    b = next(d.train_iter)
    h.update(b['inputs'].tobytes())
    h.update(b['targets'].tobytes())
  for b in d.val_batches():
    h.update(b['inputs'].tobytes())
  assert h.hexdigest() == '06d12eee1a3669b26eb01532832f22bc1331a720606066c2a57317aa9c1a2ecb'


def test_compare_has_a_column_per_source():
  rows = [{'step': 10, 'split': 'val', 'loss': 2.0, 'ppl': 7.4, 'loss/code': 1.5,
           'loss/web': 2.25},
          {'step': 20, 'split': 'val', 'loss': 1.9, 'ppl': 6.7, 'loss/code': 1.4375,
           'loss/web': 2.125}]
  one = compare.run_summary('runs/a', 'baseline', rows, None)
  two = compare.run_summary('runs/b', 'g1', [{'step': 5, 'split': 'val', 'loss': 3.0,
                                              'ppl': 20.0}], None)
  assert one['source_loss'] == {'code': 1.4375, 'web': 2.125}
  table = compare.markdown_table([one, two], ['baseline', 'g1'])
  header = table.splitlines()[0]
  assert '| val loss code | val loss web |' in header
  assert '| 1.4375 | 2.1250 |' in table.splitlines()[2]
  assert '| - | - |' in table.splitlines()[3]


# --- a training run on a mixture --------------------------------------------------------------

def _run_config(corpora, steps):
  from tests.test_train import tiny_config  # pylint: disable=g-import-not-at-top
  c = tiny_config(**{'train.steps': steps, 'train.batch_size': 4, 'train.log_every': 1,
                     'train.eval_every': 3, 'train.checkpoint_every': 3, 'data.seq_len': 16,
                     'data.val_fraction': 0.1, 'data.val_batches': 1, 'train.warmup_steps': 1,
                     'train.min_learning_rate': 1e-2})   # constant after warm-up: the schedule
                                                         # does not depend on train.steps
  c.data.mixture = mix_cfg(corpora).mixture.to_dict()
  return c


@pytest.mark.slow
def test_a_training_run_reports_each_source_and_resumes_exactly(corpora, tmp_path, capsys):
  """Metrics rows: tokens/share/epochs per source (their sum: every target token), each
  source's validation loss and their weighted mean; the end-of-run line; a run stopped at step 3
  and resumed to 6 has the uninterrupted run's counts and losses."""
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from tests.test_train import read_metrics  # pylint: disable=g-import-not-at-top
  whole, parts = str(tmp_path / 'whole'), str(tmp_path / 'parts')
  loop.run(_run_config(corpora, 6), whole)
  assert 'Tokens trained on per source up to step 6: code ' in capsys.readouterr().out
  loop.run(_run_config(corpora, 3), parts)
  loop.run(_run_config(corpora, 6), parts)
  train, val = read_metrics(whole), read_metrics(whole, 'val')
  names = sorted(CORPORA)
  for step, row in train.items():
    assert sum(row[f'tokens/{n}'] for n in names) == step * 4 * 16
    assert all(row[f'epochs/{n}'] >= 1 for n in names)
  assert train[6][f'tokens/web'] > train[3][f'tokens/web']
  for step in (3, 6):
    row = val[step]
    assert row['loss'] == pytest.approx(sum(WEIGHTS[n] * row[f'loss/{n}'] for n in names))
    assert len({round(row[f'loss/{n}'], 6) for n in names}) == 3     # three different sets
  resumed = read_metrics(parts)
  for step in (4, 5, 6):
    for n in names:
      assert resumed[step][f'tokens/{n}'] == train[step][f'tokens/{n}']
      assert resumed[step][f'epochs/{n}'] == train[step][f'epochs/{n}']
    assert resumed[step]['loss'] == pytest.approx(train[step]['loss'], rel=1e-5)
  summary = compare.run_summary(whole, 'g1_elementwise',
                                [r | {'step': s, 'split': 'val'} for s, r in val.items()], None)
  assert set(summary['source_loss']) == set(names)
