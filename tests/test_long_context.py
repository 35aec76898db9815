"""Context extension (configs/extend_context.py) and --mode=long_context (long_context.py): the
config, bucketed losses against numpy, and a tiny run extended and evaluated with and without YaRN."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import extend_context
from gated_attention.inference import long_context
from gated_attention.modes import long_context as long_context_mode
from gated_attention.input_pipeline import synthetic, tasks
from tests.test_analysis import ROOT, TINY_RUN_OVERRIDES, make_tiny_run
from tests.test_synthetic import synth_cfg


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  return make_tiny_run(str(tmp_path_factory.getbasetemp() / 'ga_tiny_run'), analyse=False)


def test_extend_context_config(tiny_run):
  c = extend_context.get_config(tiny_run)
  assert c.train.init_from == tiny_run and c.variant == 'g1_elementwise'
  assert (c.data.seq_len, c.model.rope_base, c.train.steps) == (4 * 32, 1e6, 1)
  c = extend_context.get_config(f'{tiny_run},seq_len=64,rope_base=5e5,steps=3,lr=1e-4')
  assert (c.data.seq_len, c.model.rope_base, c.train.steps, c.train.learning_rate) == (
      64, 5e5, 3, 1e-4)
  assert c.train.warmup_steps == 1 and c.model.num_layers == 2          # the run's model
  with pytest.raises(ValueError, match='seq_len=...'):
    extend_context.get_config(f'{tiny_run},seqlen=64')
  with pytest.raises(ValueError, match='not a valid int'):
    extend_context.get_config(f'{tiny_run},steps=many')
  with pytest.raises(ValueError, match='does not exist'):
    extend_context.get_config('/nonexistent/run')


class _FixedNll:
  """A stand-in generator whose per-token losses are known."""

  def __init__(self, nll_NxT):
    self.nll, self.calls = nll_NxT, []

  def token_nll(self, tokens):
    self.calls.append(len(tokens))
    return self.nll[tokens[:, 0]]


def test_loss_by_position_buckets_against_numpy():
  rng = np.random.default_rng(0)
  nll = rng.random((5, 99))
  tokens = np.concatenate([np.arange(5)[:, None], np.zeros((5, 99), int)], axis=1)  # row id first
  gen = _FixedNll(nll)
  rep = long_context.loss_by_position(gen, tokens, [10, 40, 99], batch=2)
  assert gen.calls == [2, 2, 1] and rep['documents'] == 5
  want = [nll[:, :10].mean(), nll[:, 10:40].mean(), nll[:, 40:99].mean()]
  np.testing.assert_allclose([b['loss'] for b in rep['buckets']], want)
  assert [(b['from'], b['to']) for b in rep['buckets']] == [(0, 10), (10, 40), (40, 99)]
  assert len(rep['curve']['position']) == 64
  np.testing.assert_allclose(np.mean(rep['curve']['loss'][:1]), nll[:, :2].mean())


def test_lengths_and_tags():
  opts = type('O', (), {'lengths': ''})
  assert long_context.evaluated_lengths(opts, 64) == [64, 128, 256, 512]
  opts.lengths = '512,64,64'
  assert long_context.evaluated_lengths(opts, 64) == [64, 512]
  opts.lengths = '8'
  with pytest.raises(long_context.LongContextError, match='at least 16'):
    long_context.evaluated_lengths(opts, 64)


def test_extend_then_evaluate_with_and_without_yarn(tiny_run, tmp_path):
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  ext = str(tmp_path / 'ext')
  loop.run(extend_context.get_config(f'{tiny_run},seq_len=64,steps=2'), ext)
  with open(os.path.join(ext, 'config.json')) as f:
    saved = json.load(f)
  assert saved['data']['seq_len'] == 64 and saved['model']['rope_base'] == 1e6
  assert saved['train']['init_from'] == tiny_run
  common = {'long_context.lengths': '32,64,128', 'long_context.docs': 2,
            'long_context.examples': 2, 'long_context.tasks': 'niah_single',
            'long_context.chunk': 32}
  plain = long_context_mode.run(ext, overrides=common)
  assert plain['rope_tag'] == 'rope1e+06' and plain['lengths'] == [32, 64, 128]
  assert [b['to'] for b in plain['loss']['buckets']] == [32, 64, 128]
  assert all(np.isfinite(b['loss']) for b in plain['loss']['buckets'])
  acc = plain['ruler']['niah_single']                 # the task needs 81 byte tokens
  assert set(plain['ruler']) == {'niah_single'} and acc['32'] is None and acc['64'] is None
  assert 0 <= acc['128'] <= 1
  yarn = long_context_mode.run(ext, overrides={**common, 'model.rope_scaling.type': 'yarn',
                                          'model.rope_scaling.factor': 2.0,
                                          'model.rope_scaling.original_max_len': 64})
  assert yarn['rope_tag'] == 'rope1e+06_yarn2x64'
  assert yarn['loss']['buckets'][0]['loss'] != plain['loss']['buckets'][0]['loss']
  for tag in ('rope1e+06', 'rope1e+06_yarn2x64'):
    for name in ('report.json', 'long_context.md', 'loss_by_position.png', 'ruler.png'):
      assert os.path.getsize(os.path.join(ext, 'long_context', tag, name)) > 0, (tag, name)
  # the command line refuses what evaluation may not change, naming it
  res = subprocess.run([sys.executable, 'main.py', '--mode=long_context', f'--workdir={ext}',
                        '--config.model.num_layers=3'], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert res.returncode == 1 and 'model.num_layers' in res.stderr


MQAR = dict(vocab=24, pairs=4, key_tokens=6, value_tokens=8, query_rate=0.3)


def _mqar_task(**overrides):
  return tasks.make_task(synth_cfg('mqar', seq_len=32, **{**MQAR, **overrides}))


def _reference_accuracy(docs, pred, edges):
  """A plain loop over every document and target: the answers (a key in the haystack, after the
  pairs), right or not, and the distance back to the key's pair."""
  right, dist = [], []
  for doc, guess in zip(docs.tolist(), pred.tolist()):
    start = 1 + 2 * MQAR['pairs']
    where = {doc[j]: j for j in range(1, start, 2)}
    for t in range(start, len(doc) - 1):
      if doc[t] < MQAR['key_tokens']:
        right.append(guess[t] == doc[t + 1])
        dist.append(t - where[doc[t]])
  right, dist = np.array(right), np.array(dist)
  buckets = [right[(dist >= a) & (dist < b)] for a, b in zip(edges[:-1], edges[1:])]
  return right.mean(), len(right), [(b.mean() if len(b) else None, len(b)) for b in buckets]


class _Oracle:
  """A stand-in generator that predicts the next token exactly at even positions and BOS (never
  a target) at odd ones; its loss is the position."""

  def __init__(self):
    self.shapes = []

  def token_scores(self, tokens):
    self.shapes.append(tokens.shape)
    pred = tokens[:, 1:].copy()
    pred[:, 1::2] = MQAR['vocab']
    return np.broadcast_to(np.arange(pred.shape[1], dtype=float), pred.shape), pred


def test_retrieval_accuracy_against_a_loop():
  """retrieval_accuracy on an oracle right on a known subset (even positions): per length, the
  exact match, answer count and accuracy by distance bucket of a plain loop over the retrieval
  probes of L + 1 tokens (made here from the task's config: each key queried once), batched;
  None for a length too short for the pairs and their queries (4 x pairs)."""
  task = _mqar_task()
  gen = _Oracle()
  out = long_context.retrieval_accuracy(gen, task, [8, 32, 96], count=12, batch=5)
  assert out['task'] == 'mqar' and out['documents'] == 12 and out['lengths']['8'] is None
  assert gen.shapes == [(5, 33), (5, 33), (2, 33), (5, 97), (5, 97), (2, 97)]
  for n in (32, 96):
    probes = synthetic.probe_stream(_mqar_task(doc_len=n + 1))
    docs = np.stack([probes(i) for i in range(12)])
    acc, count, buckets = _reference_accuracy(docs, docs[:, 1:] * (np.arange(n) % 2 == 0) +
                                              MQAR['vocab'] * (np.arange(n) % 2 == 1),
                                              [0, 8, 32, 96])
    cell = out['lengths'][str(n)]
    assert 0.2 < acc < 0.8 and cell['answers'] == count == 12 * MQAR['pairs']
    assert cell['accuracy'] == pytest.approx(acc)
    mask = np.stack([task.answer_mask(d) for d in docs])
    assert cell['answer_loss'] == pytest.approx(np.nonzero(mask)[1].mean())
    assert [(b['from'], b['to']) for b in cell['by_distance']] == [(0, 8), (8, 32), (32, 96)]
    for b, (a, c) in zip(cell['by_distance'], buckets):
      assert b['answers'] == c and (b['accuracy'] == pytest.approx(a) if c else
                                    b['accuracy'] is None)
  assert out['lengths']['96']['by_distance'][2]['answers'] > 10  # far queries at the long length


def test_answer_accuracy_on_constructed_cases():
  docs = np.array([[9, 1, 2, 3, 4, 5], [9, 6, 7, 8, 1, 2]])
  mask = np.array([[0, 1, 0, 1, 1], [1, 0, 0, 0, 1]], bool)
  dist = np.array([[0, 2, 0, 5, 9], [1, 0, 0, 0, 7]])
  pred = np.array([[0, 2, 0, 0, 5], [6, 0, 0, 0, 0]])     # right at (0,1), (0,4), (1,0)
  nll = np.arange(10.0).reshape(2, 5)
  out = long_context.answer_accuracy(docs, pred, nll, mask, dist, [0, 4, 8, 16])
  assert out['answers'] == 5 and out['accuracy'] == pytest.approx(3 / 5)
  assert out['answer_loss'] == pytest.approx(np.mean([1, 3, 4, 5, 9]))
  assert [(b['answers'], b['accuracy']) for b in out['by_distance']] == [
      (2, 1.0), (2, 0.0), (1, 1.0)]                        # distances 2, 1 | 5, 7 | 9
  none = long_context.answer_accuracy(docs, pred, nll, mask & False, dist, [0, 4])
  assert none['answers'] == 0 and none['accuracy'] is None
  assert none['by_distance'][0]['accuracy'] is None


def _train_tiny_mqar(workdir):
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  from configs import baseline  # pylint: disable=g-import-not-at-top
  c = baseline.get_config('tiny')
  c.model.update(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                 ffn_size=64)
  c.data.update(source='synthetic', task='mqar', seq_len=32, val_batches=1)
  c.data.synthetic.update(MQAR)
  c.train.update(TINY_RUN_OVERRIDES)
  loop.run(c, workdir)
  return workdir


@pytest.mark.slow  # trains a run and compiles five shapes: ~65 s on the loaded 2-core machine
def test_long_context_mode_on_a_synthetic_retrieval_run(tmp_path):
  """--mode=long_context of a tiny mqar run: the loss on generated held-out documents and the
  retrieval accuracy by length in the RULER shape, both equal to what the full forward pass of
  the same checkpoint gives (an independent path: no cache, no chunks); the files; the table."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  run = _train_tiny_mqar(str(tmp_path / 'mqar'))
  rep = long_context_mode.run(run, overrides={
      'long_context.lengths': '16,32,64', 'long_context.docs': 2, 'long_context.examples': 3,
      'long_context.chunk': 16, 'long_context.batch_size': 2})
  assert set(rep['ruler']) == {'mqar'} and set(rep['ruler']['mqar']) == {'16', '32', '64'}
  model = rundir.load_run(run).model
  task = _mqar_task()
  for n in (16, 32, 64):
    docs = long_context.synthetic_documents(task, n + 1, 3, probes=True)
    logits = np.asarray(model(jnp.asarray(docs[:, :-1]))[0])
    acc, count, _ = _reference_accuracy(docs, logits.argmax(-1), [0, n])
    cell = rep['retrieval']['lengths'][str(n)]
    assert cell['answers'] == count and rep['ruler']['mqar'][str(n)] == pytest.approx(acc)
  docs = long_context.synthetic_documents(task, 65, 2)
  logits = np.asarray(model(jnp.asarray(docs[:, :-1]))[0], np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, docs[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose([b['loss'] for b in rep['loss']['buckets']],
                             [nll[:, :16].mean(), nll[:, 16:32].mean(), nll[:, 32:].mean()],
                             rtol=1e-5)
  out = os.path.join(run, 'long_context', 'rope1e+04')
  for name in ('report.json', 'long_context.md', 'loss_by_position.png', 'ruler.png'):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, 'long_context.md')) as f:
    text = f.read()
  assert '| retrieval, % of answers exact | 16 | 32 | 64 |' in text
  assert '| mqar: % exact by distance (answers) | 0-16 | 16-32 | 32-64 |' in text
  assert 'cache' not in rep and 'streamed' not in text     # the full cache's output as before
  # streamed through a sliding window of 14 + 2 sinks: the first bucket (positions < 16, before
  # any eviction) is the full cache's, the next ones what is left without the beginning
  streamed = long_context_mode.run(run, overrides={
      'long_context.lengths': '16,32,64', 'long_context.docs': 2, 'long_context.examples': 3,
      'long_context.chunk': 16, 'long_context.batch_size': 2, 'long_context.window': 14,
      'long_context.sinks': 2})
  assert streamed['cache'] == {'kind': 'sliding_window', 'window': 14, 'sinks': 2, 'slots': 16,
                               'positions': 'by place in the cache (StreamingLLM)',
                               'evaluation': 'token by token (streaming)'}
  full_b, win_b = rep['loss']['buckets'], streamed['loss']['buckets']
  assert win_b[0]['loss'] == pytest.approx(full_b[0]['loss'], rel=1e-5)
  assert win_b[2]['loss'] != pytest.approx(full_b[2]['loss'], rel=1e-5)
  out = os.path.join(run, 'long_context', 'rope1e+04_window14_sinks2')
  with open(os.path.join(out, 'long_context.md')) as f:
    assert 'streamed through a sliding window of 14 + 2 sinks' in f.read()
  from gated_attention.errors import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match='long_context.sinks=2 without'):
    long_context_mode.run(run, overrides={'long_context.sinks': 2})
