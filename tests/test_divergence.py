"""experiments/divergence.py: the verdict at two cutoffs, the logistic fit with the ratio of the
half-failure rates, and M-Act through training, on constructed runs."""

import math

import numpy as np
import pytest

from experiments import divergence, rundata, spec, stability, stats
from tests.test_experiments import EXPERIMENT

RATES = [0.1, 0.2, 0.4, 0.8, 1.6]


def _experiment(tmp_path):
  path = tmp_path / 'div.py'
  path.write_text(EXPERIMENT.replace('SEEDS = [0]', 'SEEDS = list(range(8))')
                  + f"GRID = {{'train.learning_rate': {RATES}}}\nSTABILITY = True\n"
                  'DIVERGED_ABOVE = 1.0\nSECOND_CUTOFF = 2.5\nSPIKES_AFTER_WARMUP = True\n')
  return spec.load(str(path), rundata.METRICS)


def _rows(loss_final, m_act_scale, warm=2):
  """Val rows every 2 steps to 10 (M-Act rising to its peak at step 6 for a failing run), a
  spike in the warm-up and one after it."""
  rows = [{'split': 'spike', 'step': 1}, {'split': 'spike', 'step': 7}]
  for step in (2, 4, 6, 8, 10):
    loss = 0.6 if step < 6 or loss_final < 1.0 else loss_final
    rows.append({'split': 'val', 'step': step, 'loss': loss,
                 'm_act': [1.0, m_act_scale * (step if step <= 6 else 12 - step)]})
  return rows


def _results(exp, fails):
  out = []
  for r in exp.runs:
    lr = dict(r.overrides)['train.learning_rate']
    k = fails[(r.variant, lr)]
    final = 1.5 if r.seed < k else 0.6          # the first k seeds fail at cutoff 1.0 (not 2.5)
    out.append(rundata.Result(r, {'status': 'done'}, {'loss': final},
                              _rows(final, 10.0 if r.seed < k else 1.0)))
  return out


def test_fits_ratio_mact_and_the_two_cutoffs(tmp_path):
  exp = _experiment(tmp_path)
  assert exp.second_cutoff == 2.5 and exp.spikes_after_warmup
  fails = {('baseline', 0.1): 0, ('baseline', 0.2): 2, ('baseline', 0.4): 5, ('baseline', 0.8): 8,
           ('baseline', 1.6): 8, ('g1_elementwise', 0.1): 0, ('g1_elementwise', 0.2): 0,
           ('g1_elementwise', 0.4): 1, ('g1_elementwise', 0.8): 6, ('g1_elementwise', 1.6): 8}
  results = _results(exp, fails)
  fit = divergence.fits(exp, results, 1.0)
  x = [math.log(r) for r in RATES]
  base = stats.logistic_fit(x, [0, 2, 5, 8, 8], [8] * 5)
  gated = stats.logistic_fit(x, [0, 0, 1, 6, 8], [8] * 5)
  assert fit['baseline']['lr50'] == pytest.approx(math.exp(base['x50']))
  ratio = fit['g1_elementwise']['ratio']
  assert ratio['ratio'] == pytest.approx(math.exp(gated['x50'] - base['x50']))
  assert ratio['interval'][0] < ratio['ratio'] < ratio['interval'][1]
  assert ratio['ratio'] > 1.5 and fit['baseline']['ratio'] is None
  assert all(e['grid'] and all(k == 0 for _, k, _ in e['grid'])
             for e in divergence.fits(exp, results, 2.5).values())   # none fail at 2.5
  # spikes after the warm-up only (train.warmup_steps is 2 in the experiment file)
  counts = stability.failures(exp, results)
  assert set(counts['baseline_learning_rate=0.2']['spikes'].values()) == {1}
  course = divergence.m_act_course(exp, results, 1.0)['baseline']
  assert course['peaked_by_onset'] == (23, 23)    # every failing run peaks at step 6, its onset
  assert course['auc'] == pytest.approx(1.0) and course['pairs'] == 2 * 6 + 5 * 3
  text = divergence.table(exp, results)
  assert 'Failed at cutoff 1' in text and 'Failed at cutoff 2.5' in text
  assert '| baseline | 0.1: 0/8, 0.2: 2/8, 0.4: 5/8, 0.8: 8/8, 1.6: 8/8 |' in text
  assert '| baseline | 23/40 | 6, 6, ' in text and ' (23/23) | 23/23 | 1.00 (27) |' in text
  slow = _results(exp, fails)           # a failed run whose loss never rose: no onset
  for r in slow:
    for row in r.rows:
      if row.get('split') == 'val' and r.report['loss'] > 1.0:
        row['loss'] = 1.5
  course = divergence.m_act_course(exp, slow, 1.0)['baseline']
  assert course['onsets'] == [] and course['peaked_by_onset'] == (0, 0)
  assert divergence.figure(exp, results).axes


def test_separated_failures_give_a_bracket(tmp_path):
  exp = _experiment(tmp_path)
  fails = {(v, lr): (8 if lr >= 0.4 else 0) for v in ('baseline', 'g1_elementwise')
           for lr in RATES}
  fails[('g1_elementwise', 0.4)] = 0
  fit = divergence.fits(exp, _results(exp, fails), 1.0)
  assert fit['baseline']['bracket'] == pytest.approx([0.2, 0.4])
  assert fit['g1_elementwise']['bracket'] == pytest.approx([0.4, 0.8])
  assert fit['g1_elementwise']['ratio']['bounds'] == pytest.approx([1.0, 4.0])
  assert 'between 0.2 and 0.4 (separated)' in divergence.table(exp, _results(exp, fails))
  assert np.isfinite(fit['g1_elementwise']['ratio']['bounds']).all()
