"""experiments/paired.py: each variant against the baseline, paired by seed, and the rank
agreement with the paper, on constructed runs (numbers worked out here with numpy and scipy)."""

import numpy as np
import pytest
from scipy import stats as sps

from experiments import paired, rundata, spec
from tests.test_experiments import EXPERIMENT


def _experiment(tmp_path, paper="{'g1_elementwise': 0.3, 'g1_headwise': 0.2, 'g2_elementwise': 0.1}"):
  path = tmp_path / 'pairs.py'
  path.write_text(EXPERIMENT.replace("VARIANTS = ['baseline', 'g1_elementwise']",
                                     "VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise', "
                                     "'g2_elementwise']").replace('SEEDS = [0]', 'SEEDS = [0, 1, 2, 3]')
                  + f"PAIRED = 'baseline'\nPAPER = {paper}\nPAPER_LABEL = 'PPL'\n")
  return spec.load(str(path), rundata.METRICS)


def _results(exp, losses):
  return [rundata.Result(r, {'status': 'done'}, {'loss': losses[r.variant][r.seed]}, [])
          for r in exp.runs]


def test_paired_differences_intervals_and_agreement(tmp_path):
  exp = _experiment(tmp_path)
  rng = np.random.default_rng(0)
  base = 2.0 + rng.normal(0, 0.1, 4)
  losses = {'baseline': base, 'g1_elementwise': base - 0.05 + rng.normal(0, 0.01, 4),
            'g1_headwise': base - 0.03 + rng.normal(0, 0.01, 4),
            'g2_elementwise': base + rng.normal(0, 0.01, 4)}
  diffs = paired.differences(exp, _results(exp, losses))
  assert list(diffs) == ['g1_elementwise', 'g1_headwise', 'g2_elementwise']
  for v, d in diffs.items():
    res = sps.ttest_rel(losses['baseline'], losses[v])
    ci = res.confidence_interval()
    assert d['diff']['mean'] == pytest.approx(np.mean(losses['baseline'] - losses[v]))
    assert d['diff']['interval'] == pytest.approx([ci.low, ci.high])
    assert d['diff']['p'] == pytest.approx(res.pvalue)
    assert d['detectable'] > 0 and d['paper'] == exp.paper[v]
  a = paired.agreement(diffs, n_boot=300)
  want = sps.kendalltau([diffs[v]['diff']['mean'] for v in diffs], [0.3, 0.2, 0.1]).statistic
  assert a['tau'] == pytest.approx(want) and a['tau'] == pytest.approx(1.0)
  assert a['interval'][0] <= a['tau'] <= a['interval'][1] + 1e-12
  text = paired.table(exp, _results(exp, losses))
  assert '| g1_elementwise | +0.0' in text and 'Kendall\'s tau-b = +1.00' in text
  assert '| +0.300 |' in text


def test_unfinished_seeds_pair_over_what_both_have_and_paper_checks(tmp_path):
  exp = _experiment(tmp_path)
  losses = {v: [2.0, 2.1, 2.2, 2.3] for v in exp.paper}
  losses['baseline'] = [2.1, 2.2, 2.3, 2.4]
  results = _results(exp, losses)
  results[1] = rundata.Result(results[1].run, {'status': 'training'}, None, [])  # baseline s1
  d = paired.differences(exp, results)['g1_elementwise']['diff']
  assert d['n'] == 3 and d['seeds'] == [0, 2, 3] and d['mean'] == pytest.approx(0.1)
  for bad, match in (("{'nope': 1.0}", 'PAPER must be a dict'),):
    with pytest.raises(spec.ExperimentError, match=match):
      _experiment(tmp_path, bad)
  path = tmp_path / 'bad.py'
  path.write_text(EXPERIMENT + "PAIRED = 'g9'\n")
  with pytest.raises(spec.ExperimentError, match='not in VARIANTS'):
    spec.load(str(path), rundata.METRICS)


def test_paired_metrics_compare_another_metric_by_seed(tmp_path):
  """PAIRED_METRICS: F-Attn (the largest layer's) paired by seed beside the loss, the same
  statistic (scipy's paired t-test); a metric that is not one number a run is refused."""
  path = tmp_path / 'pm.py'
  path.write_text(EXPERIMENT.replace('SEEDS = [0]', 'SEEDS = [0, 1, 2, 3]')
                  + "PAIRED = 'baseline'\nPAIRED_METRICS = ['val_loss', 'f_attn_max']\n")
  exp = spec.load(str(path), rundata.METRICS)
  assert exp.paired_metrics == ('val_loss', 'f_attn_max')
  f = {'baseline': [0.9, 0.8, 0.85, 0.7], 'g1_elementwise': [0.1, 0.2, 0.05, 0.3]}
  results = [rundata.Result(r, {'status': 'done'}, {'loss': 1.0, 'f_attn': [f[r.variant][r.seed],
                                                                             0.01]}, [])
             for r in exp.runs]
  d = paired.differences(exp, results, 'f_attn_max')['g1_elementwise']['diff']
  res = sps.ttest_rel(f['baseline'], f['g1_elementwise'])
  assert d['mean'] == pytest.approx(np.mean(np.subtract(f['baseline'], f['g1_elementwise'])))
  assert d['interval'] == pytest.approx(list(res.confidence_interval()))
  text = paired.table(exp, results)
  assert 'F-Attn max layer (`f_attn_max`)' in text and '| g1_elementwise | +0.650' in text
  path.write_text(EXPERIMENT + "PAIRED = 'baseline'\nPAIRED_METRICS = ['sink_layer']\n")
  with pytest.raises(spec.ExperimentError, match='PAIRED_METRICS'):
    spec.load(str(path), rundata.METRICS)
