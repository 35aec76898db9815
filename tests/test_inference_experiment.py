"""experiments/inference.py: one run's streaming and quantization measures from its reports, the
collapse rule, and the tables' paired differences against numpy / scipy on constructed runs."""

import math

import numpy as np
import pytest
from scipy import stats as sp

from experiments import inference


def _run(full, window, sinks, quant, vocab=33, f_attn=(0.9, 0.05)):
  def lc(losses, cache=None):
    rep = {'train_seq_len': 128, 'loss': {
        'buckets': [{'from': a, 'to': b, 'loss': x} for (a, b), x in zip(
            [(0, 64), (64, 128), (128, 256), (256, 512)], losses)],
        'curve': {'position': [0, 1], 'loss': [losses[0], losses[1]]}}}
    if cache:
      rep['cache'] = cache
    return rep
  return {'lc': {'full': lc(full), 'window': lc(window, {'window': 64, 'sinks': 0}),
                 'sinks': lc(sinks, {'window': 60, 'sinks': 4})},
          'quant': {'float': {'loss': full[1]},
                    'settings': [{'key': 'w8a8_tensor', 'name': 'W8A8 (per tensor)',
                                  'increase': quant}],
                    'linear_inputs': {'ffn_down_in': {'absmax': [10.0, 20.0],
                                                      'kurtosis': [3.0, 9.0]}}},
          'analysis': {'f_attn': list(f_attn)},
          'config': {'model': {'vocab_size': vocab}}}


def test_measures_and_the_collapse_rule():
  m = inference.measures(_run([1.0, 1.1, 1.5, 2.0], [1.0, 2.5, 2.6, 2.7], [1.0, 1.1, 1.05, 1.0],
                              0.01))
  assert m['window_penalty'] == pytest.approx(1.4)
  assert m['sinks_penalty'] == pytest.approx(0.0)
  assert m['window_minus_sinks_beyond'] == pytest.approx(np.mean([2.6 - 1.05, 2.7 - 1.0]))
  assert m['collapse_threshold'] == pytest.approx((math.log(33) - 1.1) / 2)
  assert m['collapsed']                                   # 1.4 > 1.198
  assert m['absmax'] == {'ffn_down_in': 20.0} and m['kurtosis'] == {'ffn_down_in': 9.0}
  assert m['f_attn_max'] == 0.9
  calm = inference.measures(_run([1.0, 1.1, 1.5, 2.0], [1.0, 1.3, 1.3, 1.3], [1.0, 1.1, 1.1, 1.1],
                                 0.0))
  assert not calm['collapsed']


def test_tables_pair_by_seed():
  rng = np.random.default_rng(0)
  data = {'baseline': {}, 'g1_elementwise': {}}
  for seed in range(4):
    for v, shift in (('baseline', 1.0), ('g1_elementwise', 0.1)):
      w = 1.1 + shift + 0.1 * rng.standard_normal()
      data[v][seed] = inference.measures(_run([1.0, 1.1, 1.5, 2.0], [1.0, w, w, w],
                                              [1.0, 1.1, 1.1, 1.1], 0.01 * shift))
  text, summary = inference.tables(data)
  d = [data['baseline'][s]['window_penalty'] - data['g1_elementwise'][s]['window_penalty']
       for s in range(4)]
  gap = summary['variants']['g1_elementwise']['gaps']['window_penalty']
  half = sp.t.ppf(0.975, 3) * np.std(d, ddof=1) / 2
  assert gap['mean'] == pytest.approx(np.mean(d))
  assert gap['interval'] == pytest.approx([np.mean(d) - half, np.mean(d) + half])
  assert gap['detectable'] > 0
  collapsed = [s for s, m in data['baseline'].items()
               if m['window_penalty'] > (math.log(33) - 1.1) / 2]
  assert summary['variants']['baseline']['collapsed_seeds'] == collapsed
  assert '| W8A8 (per tensor) |' in text and 'baseline - g1_elementwise' in text


def test_the_experiment_files_declare_their_evaluations():
  from experiments import rundata, spec  # pylint: disable=g-import-not-at-top
  for name in ('inference_sink', 'inference_text'):
    e = spec.load(f'experiments/{name}.py', rundata.METRICS)
    assert set(e.long_context) == set(inference.LABELS)
    args = e.quantization_args('/r')
    assert args[:3] == ['main.py', '--mode=quantization', '--workdir=/r']
    assert '--config.quantization.group_size=32' in args
