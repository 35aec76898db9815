"""Tests of the synthetic tasks (input_pipeline/synthetic.py) and their data pipeline."""

import json

import numpy as np
import pytest

from gated_attention.config import scales
from gated_attention.input_pipeline import DataError, build_data, data_tokenizer, synthetic, tasks


def synth_cfg(task='bigram_backcopy', seq_len=32, **synthetic_overrides):
  cfg = scales.get_config().data
  cfg.update(source='synthetic', task=task, seq_len=seq_len, val_batches=2)
  cfg.synthetic.update(synthetic_overrides)
  return cfg


def take(it, n):
  return [next(it) for _ in range(n)]


def rows(batches):
  """The packed windows [seq_len + 1] of batches, in row order."""
  return [np.concatenate([b['inputs'][r], b['targets'][r, -1:]])
          for b in batches for r in range(len(b['inputs']))]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_documents_are_deterministic_and_bos_first():
  cfg = synth_cfg()
  task = tasks.make_task(cfg)
  again = tasks.make_task(cfg)
  np.testing.assert_array_equal(task.transition_VxV, again.transition_VxV)
  np.testing.assert_array_equal(task.triggers, again.triggers)
  other = tasks.make_task(synth_cfg(task_seed=1))
  assert not np.array_equal(task.transition_VxV, other.transition_VxV)
  stream = synthetic.train_stream(task, seed=0)
  doc = stream(7)
  assert doc.dtype == np.int32 and doc.shape == (33,) and doc[0] == 64
  assert (doc[1:] < 64).all() and not task.is_trigger_V[doc[1]]
  np.testing.assert_array_equal(doc, synthetic.train_stream(again, seed=0)(7))
  assert not np.array_equal(doc, synthetic.train_stream(task, seed=1)(7))
  assert not np.array_equal(doc, stream(8))
  a = build_data(cfg, global_batch_size=4, seed=5)
  b = build_data(cfg, global_batch_size=4, seed=5)
  assert_batches_equal(take(a.train_iter, 3), take(b.train_iter, 3))
  for w in rows(take(a.train_iter, 3)):  # doc_len = seq_len + 1: one document per window
    assert w[0] == 64 and (w[1:] != 64).all()


def test_transition_matrix_rows():
  task = tasks.make_task(synth_cfg(vocab=20, triggers=2, branching=5))
  rows_V = task.transition_VxV
  np.testing.assert_allclose(rows_V[task.plain].sum(axis=1), 1.0)
  assert ((rows_V[task.plain] > 0).sum(axis=1) == 5).all()
  assert not rows_V[task.triggers].any()


def test_backcopy_statistics():
  """After a trigger the next token is the one before it; elsewhere transitions follow the
  matrix (each row's counts against its probabilities, a chi-square bound)."""
  task = tasks.make_task(synth_cfg(vocab=16, triggers=2, branching=4, doc_len=257))
  docs = np.stack([synthetic.train_stream(task, seed=3)(i) for i in range(300)])[:, 1:]
  trig = task.is_trigger_V[docs[:, :-1]]
  assert trig.mean() > 0.02
  assert not (trig[:, 1:] & trig[:, :-1]).any()  # never two triggers in a row
  np.testing.assert_array_equal(docs[:, 2:][trig[:, 1:]], docs[:, :-2][trig[:, 1:]])
  assert not trig[:, 0].any()
  prev, nxt = docs[:, :-1][~trig], docs[:, 1:][~trig]
  counts = np.zeros((16, 16))
  np.add.at(counts, (prev, nxt), 1)
  for a in task.plain:
    n, p = counts[a].sum(), task.transition_VxV[a]
    assert n > 200
    assert not counts[a][p == 0].any()
    expected = n * p[p > 0]
    chi2 = ((counts[a][p > 0] - expected) ** 2 / expected).sum()
    assert chi2 < 25  # 3 degrees of freedom: P(chi2 > 25) < 2e-5


def test_default_documents_are_unchanged():
  """copy_share=0 (the default) draws the documents the generator drew before the knob existed
  (this hash was taken from the code before it), so earlier runs' data stay the same."""
  import hashlib
  h = hashlib.sha256()
  for name in synthetic.CHAIN_TASKS:  # the tasks that existed when the hash was taken
    task = tasks.make_task(synth_cfg(name, seq_len=64, vocab=32, triggers=4, branching=3))
    for i in range(20):
      h.update(synthetic.train_stream(task, 3)(i).tobytes())
  assert h.hexdigest() == '5ddca81fe6f83766f99e44d00dd93f1ee56cc15bd4a4976551004620f203074c'


@pytest.mark.parametrize('name', synthetic.CHAIN_TASKS)
@pytest.mark.parametrize('copy_share', [0.05, 0.3])
def test_copy_share_sets_the_share_of_trigger_targets(name, copy_share):
  """With copy_share > 0, a trigger follows a non-trigger token with probability
  r = s / (1 - s) (so a share s of targets follow a trigger), whatever the task seed; the other
  transitions follow the chain's rows without their trigger successors."""
  for task_seed in (0, 2):
    task = tasks.make_task(synth_cfg(name, vocab=16, triggers=2, branching=4, doc_len=257,
                                         task_seed=task_seed, copy_share=copy_share))
    docs = np.stack([synthetic.train_stream(task, seed=1)(i) for i in range(200)])[:, 1:]
    trig = task.is_trigger_V[docs[:, :-1]]
    n = trig.size
    assert abs(trig.mean() - copy_share) < 5 * np.sqrt(copy_share * (1 - copy_share) / n) + 0.01
    if name == 'bigram_backcopy':
      np.testing.assert_array_equal(docs[:, 2:][trig[:, 1:]], docs[:, :-2][trig[:, 1:]])
    plain_prev = ~trig
    nxt, prev = docs[:, 1:][plain_prev], docs[:, :-1][plain_prev]
    r = copy_share / (1 - copy_share)
    assert abs(task.is_trigger_V[nxt].mean() - r) < 0.03
    counts = np.zeros((16, 16))
    keep = ~task.is_trigger_V[nxt]
    np.add.at(counts, (prev[keep], nxt[keep]), 1)
    for a in task.plain:
      p, c = task.plain_VxV[a], counts[a]
      assert not c[p == 0].any() and np.isclose(p.sum(), 1.0)
      if c.sum() > 300:
        expected = c.sum() * p[p > 0]
        assert ((c[p > 0] - expected) ** 2 / expected).sum() < 30


def test_copy_share_entropy_is_the_next_token_distributions():
  """target_entropy after a non-trigger token: the entropy of the explicit mixture r x uniform
  over the triggers + (1 - r) x the row without triggers, computed here from the distribution."""
  task = tasks.make_task(synth_cfg(vocab=16, triggers=3, branching=5, copy_share=0.2))
  r = 0.2 / 0.8
  for a in task.plain:
    p = (1 - r) * task.plain_VxV[a] + r * task.is_trigger_V / 3
    np.testing.assert_allclose(p.sum(), 1.0)
    h = -sum(x * np.log(x) for x in p if x > 0)
    np.testing.assert_allclose(task.row_entropy_V[a], h, rtol=1e-12)
  doc = synthetic.train_stream(task, 0)(0)
  h = task.target_entropy(doc)
  trig = task.is_trigger_V[doc[1:-1]]
  np.testing.assert_array_equal(h[1:][trig], 0.0)
  np.testing.assert_allclose(h[1:][~trig], task.row_entropy_V[doc[1:-1][~trig]])


def test_icl_bigram_statistics():
  task = tasks.make_task(synth_cfg('icl_bigram', vocab=16, triggers=2, branching=4,
                                       doc_len=257))
  docs = np.stack([synthetic.train_stream(task, seed=0)(i) for i in range(100)])[:, 1:]
  outputs = set()
  for doc in docs:
    for q in task.triggers:
      after = doc[1:][doc[:-1] == q]
      assert len(set(after.tolist())) <= 1  # the same output at every occurrence
      outputs.update(after.tolist())
  assert len(outputs) > 4 and not task.is_trigger_V[list(outputs)].any()
  h = task.target_entropy(np.concatenate([[16], docs[0]]))
  assert h.shape == (256,) and (h >= 0).all()


def mqar_task(doc_len=129, **overrides):
  settings = dict(vocab=40, pairs=6, key_tokens=10, value_tokens=12, query_rate=0.2)
  settings.update(overrides)
  return tasks.make_task(synth_cfg('mqar', doc_len=doc_len, **settings))


def test_mqar_documents_pairs_first_and_every_answer_is_its_keys_value():
  """BOS, then `pairs` distinct keys each followed by a value token, then a haystack of filler
  tokens and queries; each query key is one of the document's keys and is followed by the value
  it has in that document's pairs (an explicit dict per document); the map differs between
  documents; documents are deterministic per (stream, index) and the stream pickles."""
  import pickle
  task = mqar_task()
  keys, values, filler = range(10), range(10, 22), range(22, 40)
  stream = synthetic.train_stream(task, seed=4)
  maps = set()
  for i in range(100):
    doc = stream(i)
    assert doc.dtype == np.int32 and doc.shape == (129,) and doc[0] == 40 == task.bos_id
    pairs = doc[1:13].reshape(6, 2)
    assert set(pairs[:, 0]) <= set(keys) and len(set(pairs[:, 0])) == 6
    assert set(pairs[:, 1]) <= set(values)
    value_of = dict(pairs.tolist())
    maps.add(tuple(sorted(value_of.items())))
    hay = doc[13:].tolist()
    t = 0
    while t < len(hay):
      if hay[t] in keys:
        assert hay[t] in value_of
        if t + 1 < len(hay):
          assert hay[t + 1] == value_of[hay[t]]
        t += 2
      else:
        assert hay[t] in filler
        t += 1
  assert len(maps) == 100
  again = pickle.loads(pickle.dumps(stream))
  np.testing.assert_array_equal(again(7), stream(7))
  np.testing.assert_array_equal(synthetic.train_stream(mqar_task(), seed=4)(7), stream(7))
  assert not np.array_equal(stream(7), synthetic.train_stream(task, seed=5)(7))
  assert not np.array_equal(stream(7), synthetic.val_stream(task)(7))


def test_mqar_queries_per_token_do_not_depend_on_the_length():
  """The haystack is a stationary process: query keys are a share query_rate of its tokens at
  every document length (within 5 standard errors), so a longer document has more queries and
  puts them further from the pairs; after any token but a query key, a query starts with
  probability r = q / (1 - q)."""
  q = 0.2
  r = q / (1 - q)
  mean_distance = []
  for doc_len in (65, 257, 1025):
    task = mqar_task(doc_len=doc_len, query_rate=q)
    docs = np.stack([synthetic.val_stream(task)(i) for i in range(24576 // doc_len)])
    hay = docs[:, 13:]
    is_key = hay < 10
    n = is_key.size
    assert abs(is_key.mean() - q) < 5 * np.sqrt(q * (1 - q) / n), doc_len
    starts = is_key[:, 1:][~is_key[:, :-1]]
    assert abs(starts.mean() - r) < 5 * np.sqrt(r * (1 - r) / starts.size), doc_len
    mean_distance.append(np.mean(np.concatenate([task.answer_distance(d)[task.answer_mask(d)]
                                                 for d in docs])))
  assert mean_distance[0] < mean_distance[1] < mean_distance[2]
  assert mean_distance[2] > 400  # about half the document's length


def test_mqar_answer_mask_and_distance_against_a_loop():
  """answer_mask: targets t with doc[t] a key in the haystack; answer_distance: t minus the
  position of that key in the pairs. The plain loop here is the reference."""
  task = mqar_task(doc_len=90, query_rate=0.4)
  for i in range(20):
    doc = synthetic.val_stream(task)(i)
    where = {int(doc[j]): j for j in range(1, 13, 2)}
    mask, dist = np.zeros(89, bool), np.zeros(89, int)
    for t in range(13, 89):
      if doc[t] < 10:
        mask[t], dist[t] = True, t - where[int(doc[t])]
    np.testing.assert_array_equal(task.answer_mask(doc), mask)
    np.testing.assert_array_equal(task.answer_distance(doc), dist)
    assert mask.any() and (dist[mask] >= 2).all()
    np.testing.assert_array_equal(doc[1:][mask], [doc[where[int(doc[t])] + 1]
                                                  for t in np.flatnonzero(mask)])


def test_mqar_target_entropy_is_the_true_next_token_distribution():
  """From explicit distributions: the i-th pair key is uniform over the key tokens not yet used,
  a pair value uniform over the value tokens, an answer certain, and any other haystack token
  r / pairs on each of the document's keys and (1 - r) / filler on each filler token. The
  generated haystack's counts agree with that distribution (a chi-square bound)."""
  task = mqar_task(query_rate=0.25)
  r = 0.25 / 0.75
  p = np.concatenate([np.full(6, r / 6), np.full(18, (1 - r) / 18)])
  haystack_h = -(p * np.log(p)).sum()
  doc = synthetic.train_stream(task, 0)(3)
  h = task.target_entropy(doc)
  assert h.shape == (128,)
  np.testing.assert_allclose(h[0:12:2], np.log(10 - np.arange(6)), rtol=1e-12)
  np.testing.assert_allclose(h[1:12:2], np.log(12), rtol=1e-12)
  mask = task.answer_mask(doc)
  np.testing.assert_array_equal(h[mask], 0.0)
  np.testing.assert_allclose(h[12:][~mask[12:]], haystack_h, rtol=1e-12)
  counts = np.zeros(2)  # after a non-key haystack token: a key of the document, or filler
  fill = np.zeros(18)
  for i in range(200):
    d = synthetic.train_stream(task, 0)(i)[12:]
    nxt = d[1:][d[:-1] >= 10]
    counts += [(nxt < 10).sum(), (nxt >= 22).sum()]
    np.add.at(fill, nxt[nxt >= 22] - 22, 1)
  expected = counts.sum() * np.array([r, 1 - r])
  assert ((counts - expected) ** 2 / expected).sum() < 20
  expected = fill.sum() / 18
  assert ((fill - expected) ** 2 / expected).sum() < 60   # 17 degrees of freedom


def test_mqar_skip_bigram_filler():
  """filler='skip_bigram': a filler token is drawn from the row of the token two back (the one
  before the current input), `branching` successors each; target_entropy of every non-answer
  haystack target is the entropy of the explicit next-token distribution (r / pairs on each key
  of the document, (1 - r) x that row on the filler tokens); the counts follow the rows."""
  task = mqar_task(filler='skip_bigram', branching=3, query_rate=0.25)
  r = 0.25 / 0.75
  rows = task.skip_VxF
  assert rows.shape == (40, 18) and ((rows > 0).sum(axis=1) == 3).all()
  np.testing.assert_allclose(rows.sum(axis=1), 1.0)
  counts = np.zeros((40, 18))
  for i in range(150):
    doc = synthetic.train_stream(task, 2)(i)
    h, mask = task.target_entropy(doc), task.answer_mask(doc)
    for t in range(12, 128):                 # target t: doc[t + 1] after input doc[t]
      if mask[t]:
        assert h[t] == 0.0
        continue
      p = np.concatenate([np.full(6, r / 6), (1 - r) * rows[doc[t - 1]]])
      p = p[p > 0]
      np.testing.assert_allclose(h[t], -(p * np.log(p)).sum(), rtol=1e-12)
      if doc[t + 1] >= 22:
        counts[doc[t - 1], doc[t + 1] - 22] += 1
  assert not counts[rows == 0].any()
  for a in range(40):
    if counts[a].sum() > 200:
      expected = counts[a].sum() * rows[a][rows[a] > 0]
      assert ((counts[a][rows[a] > 0] - expected) ** 2 / expected).sum() < 25  # 2 d.o.f.
  other = mqar_task(filler='skip_bigram', branching=3, task_seed=1)
  assert not np.array_equal(other.skip_VxF, rows)


@pytest.mark.parametrize('filler', synthetic.FILLERS)
def test_mqar_probes_query_each_key_once(filler):
  """probe_document: BOS and the pairs as in document(), then filler in which each of the
  document's keys is queried exactly once, followed by its value, and no other key appears; the
  answers' distances spread over the whole length; a deterministic stream of its own; a length
  that cannot hold the pairs and their queries is refused."""
  task = mqar_task(doc_len=257, filler=filler, branching=3)
  probes = synthetic.probe_stream(task)
  distances = []
  for i in range(60):
    doc = probes(i)
    assert doc.shape == (257,) and doc[0] == 40
    value_of = dict(doc[1:13].reshape(6, 2).tolist())
    hay = doc[13:]
    at = np.flatnonzero(hay < 10)
    assert sorted(hay[at].tolist()) == sorted(value_of)          # each key once
    assert [hay[t + 1] for t in at] == [value_of[hay[t]] for t in at]
    rest = np.ones(len(hay), bool)
    rest[at], rest[at + 1] = False, False
    assert (hay[rest] >= 22).all()                                # filler everywhere else
    mask = task.answer_mask(doc)
    assert mask.sum() == 6
    distances += task.answer_distance(doc)[mask].tolist()
  assert min(distances) < 20 and max(distances) > 230 and 90 < np.mean(distances) < 160
  np.testing.assert_array_equal(probes(3), synthetic.probe_stream(
      mqar_task(doc_len=257, filler=filler, branching=3))(3))
  assert not np.array_equal(probes(3)[13:], synthetic.val_stream(task)(3)[13:])
  with pytest.raises(DataError, match='needs at least 25 tokens'):
    synthetic.probe_stream(mqar_task(doc_len=24))(0)
  with pytest.raises(DataError, match="only data.task='mqar'"):
    synthetic.probe_stream(tasks.make_task(synth_cfg('icl_bigram')))


def test_mqar_describe_and_its_floor():
  """describe(): the answers' share and distances; the floor (optimal_loss) is below the loss of
  a model that knows everything but the retrieval (the answer guessed among the document's
  values)."""
  data = build_data(synth_cfg('mqar', seq_len=128), global_batch_size=4, seed=0)
  d = json.loads(json.dumps(data.describe()))
  task = data.task
  assert d['task'] == 'mqar' and d['pairs'] == 8 and d['key_tokens'] == 16
  assert d['triggers'] == list(range(16)) and d['vocab_size'] == 65
  assert abs(d['answer_fraction'] - 0.25 * (128 - 16) / 128) < 0.02
  assert 20 < d['mean_answer_distance'] < 80
  guess = [task.target_entropy(doc) for doc in (synthetic.val_stream(task)(i) for i in range(64))]
  no_retrieval = np.mean([np.where(task.answer_mask(doc), np.log(8), h) for doc, h in zip(
      (synthetic.val_stream(task)(i) for i in range(64)), guess)])
  assert 0 < d['optimal_loss'] < no_retrieval - 0.3
  tok = data.tokenizer
  assert tok.name == 'synthetic:mqar(vocab=64,pairs=8,keys=16,values=16,seed=0)'
  doc = synthetic.val_stream(task)(0)
  assert tok.decode(doc).split()[0] == f'*{doc[1]}'
  np.testing.assert_array_equal(tok.encode_doc(tok.decode(doc)), doc)


def test_chain_tasks_have_no_answer_positions():
  task = tasks.make_task(synth_cfg('icl_bigram'))
  assert not task.has_answers
  with pytest.raises(DataError, match="only data.task='mqar'"):
    task.answer_mask(synthetic.val_stream(task)(0))


def test_backcopy_reaches_its_floor_only_with_the_copy():
  """The lowest loss (describe's optimal_loss) is below the bigram-only loss."""
  data = build_data(synth_cfg(seq_len=64), global_batch_size=4, seed=0)
  d = json.loads(json.dumps(data.describe()))
  assert d['source'] == 'synthetic' and d['vocab_size'] == 65 and len(d['triggers']) == 3
  assert 0.02 < d['trigger_fraction'] < 0.2
  assert 0 < d['optimal_loss'] < d['unigram_entropy'] < np.log(64)


def test_tokenizer_round_trip_marks_triggers():
  cfg = synth_cfg()
  tok = data_tokenizer(cfg)
  task = tasks.make_task(cfg)
  assert tok.vocab_size == 65 and tok.bos_id == 64 and 'bigram_backcopy' in tok.name
  t = int(task.triggers[0])
  ids = [1, t, 1, 63]
  text = tok.decode([64] + ids)
  assert text.split()[1] == f'*{t}' and text.split()[0] == '1'
  assert tok.encode(text) == ids
  np.testing.assert_array_equal(tok.encode_doc(text), [64] + ids)
  with pytest.raises(DataError, match='cannot encode'):
    tok.encode('1 64')


def test_process_shards_are_disjoint_and_cover():
  cfg = synth_cfg(seq_len=16)
  whole = rows(take(build_data(cfg, global_batch_size=6, seed=2).train_iter, 4))
  per_process = []
  for p in range(3):
    data = build_data(cfg, global_batch_size=6, seed=2, process_index=p, process_count=3,
                      per_process_stream=True)   # runs saved before issue 45
    batches = take(data.train_iter, 4)
    assert all(b['inputs'].shape == (2, 16) for b in batches)
    per_process.append({w.tobytes() for w in rows(batches)})
  assert sum(map(len, per_process)) == 24 == len(set().union(*per_process))
  # Together the processes read documents 0..23, exactly what one process reads.
  assert set().union(*per_process) == {w.tobytes() for w in whole}


@pytest.mark.parametrize('task', synthetic.TASKS)
def test_resume_from_state(task):
  cfg = synth_cfg(task, doc_len=20)  # documents span windows: the packer's offset is restored
  data = build_data(cfg, global_batch_size=4, seed=1)
  take(data.train_iter, 3)
  state = json.loads(json.dumps(data.train_iter.get_state()))
  expected = take(data.train_iter, 5)
  restored = build_data(cfg, global_batch_size=4, seed=1)
  restored.train_iter.set_state(state)
  assert_batches_equal(expected, take(restored.train_iter, 5))


def test_validation_is_fixed_and_disjoint_from_training():
  cfg = synth_cfg()
  a = build_data(cfg, global_batch_size=8, seed=0)
  b = build_data(cfg, global_batch_size=8, seed=1)
  assert_batches_equal(a.val_batches(), b.val_batches())  # the same for every run seed
  val = {w.tobytes() for w in rows(a.val_batches())}
  assert len(val) == 16
  train = {w.tobytes() for d in (a, b) for w in rows(take(d.train_iter, 50))}
  assert not val & train
  halves = [build_data(cfg, global_batch_size=8, seed=0, process_index=p, process_count=2)
            for p in range(2)]
  joined = [np.concatenate([h.val_batches()[i]['inputs'] for h in halves]) for i in range(2)]
  for x, y in zip(joined, a.val_batches()):
    np.testing.assert_array_equal(x, y['inputs'])


def test_worker_processes_give_the_same_batches():
  cfg = synth_cfg()
  expected = take(build_data(cfg, global_batch_size=4, seed=0).train_iter, 3)
  cfg.worker_count = 1
  data = build_data(cfg, global_batch_size=4, seed=0)
  assert_batches_equal(expected, take(data.train_iter, 3))
  data.train_iter.close()


@pytest.mark.parametrize('overrides, match', [
    (dict(task='nope'), r"Unknown data.task='nope'.*bigram_backcopy, icl_bigram"),
    (dict(vocab=2), r'data.synthetic.vocab=2 is too small'),
    (dict(triggers=0), r'data.synthetic.triggers=0 must be in \[1, vocab - 2 = 62\]'),
    (dict(triggers=63), r'data.synthetic.triggers=63'),
    (dict(branching=65), r'data.synthetic.branching=65 must be in \[1, vocab = 64\]'),
    (dict(doc_len=1), r'data.synthetic.doc_len=1 must be 0'),
    (dict(task_seed=-1), r'task_seed=-1 must be >= 0'),
    (dict(copy_share=0.5), r'data.synthetic.copy_share=0.5 must be 0 .* or in \(0, 0.45\]'),
    (dict(copy_share=-0.1), r'copy_share=-0.1 must be'),
    (dict(task='mqar', key_tokens=30, value_tokens=34),
     r"data.task='mqar' splits data.synthetic.vocab=64 into key_tokens=30, value_tokens=34 and "
     r'the filler tokens \(the rest, 0\)'),
    (dict(task='mqar', key_tokens=0), r'key_tokens=0, value_tokens=16'),
    (dict(task='mqar', pairs=17), r'data.synthetic.pairs=17 must be in \[1, key_tokens = 16\]'),
    (dict(task='mqar', pairs=0), r'data.synthetic.pairs=0 must be in'),
    (dict(task='mqar', query_rate=0.0), r'data.synthetic.query_rate=0.0 must be in \(0, 0.5\]'),
    (dict(task='mqar', query_rate=0.6), r'query_rate=0.6 must be in'),
    (dict(task='mqar', pairs=16), r'doc_len=33 .* needs at least 2 x pairs \+ 3 = 35 tokens; '
     r'raise --config.data.seq_len'),
    (dict(task='mqar', filler='chain'), r"data.synthetic.filler='chain' must be one of uniform, "
     r'skip_bigram'),
    (dict(task='mqar', filler='skip_bigram', branching=33),
     r'data.synthetic.branching=33 must be in \[1, filler tokens = 32\]'),
])
def test_bad_settings_fail_clearly(overrides, match):
  task = overrides.pop('task', 'bigram_backcopy')
  with pytest.raises(DataError, match=match):
    build_data(synth_cfg(task, **overrides), global_batch_size=4, seed=0)


def test_negative_seed_fails_clearly():
  with pytest.raises(DataError, match='config.seed=-1 must be >= 0'):
    build_data(synth_cfg(), global_batch_size=4, seed=-1)
