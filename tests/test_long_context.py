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
from tests.test_analysis import ROOT, make_tiny_run


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
