"""experiments/stats.py against scipy and published values, on random inputs."""

import math

import numpy as np
import pytest
from scipy import optimize, stats as sps

from experiments import stats


@pytest.mark.parametrize('k,n', [(0, 5), (2, 12), (11, 16), (14, 16), (12, 12), (81, 263)])
def test_wilson_matches_scipy(k, n):
  ci = sps.binomtest(k, n).proportion_ci(0.95, method='wilson')
  lo, hi = stats.wilson_interval(k, n, z=stats.Z95)
  assert lo == pytest.approx(ci.low, abs=1e-9) and hi == pytest.approx(ci.high, abs=1e-9)


def test_wilson_published_value():
  # Newcombe (1998), Stat. Med. 17:857, Table I: 81/263 -> 0.2553 to 0.3662
  lo, hi = stats.wilson_interval(81, 263)
  assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)


def test_fisher_matches_scipy_on_random_tables():
  rng = np.random.default_rng(0)
  for _ in range(200):
    n1, n2 = rng.integers(1, 20, 2)
    k1, k2 = rng.integers(0, n1 + 1), rng.integers(0, n2 + 1)
    want = sps.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]])[1]
    assert stats.fisher_exact(int(k1), int(n1), int(k2), int(n2)) == pytest.approx(want, rel=1e-9)


def test_fisher_power_against_enumeration_and_simulation():
  # the case: 14/16 against 11/16 at those rates has power ~0.14
  power = stats.fisher_power(14 / 16, 16, 11 / 16, 16)
  brute = sum(sps.binom.pmf(a, 16, 14 / 16) * sps.binom.pmf(b, 16, 11 / 16)
              for a in range(17) for b in range(17)
              if sps.fisher_exact([[a, 16 - a], [b, 16 - b]])[1] <= 0.05)
  assert power == pytest.approx(brute, rel=1e-9)
  assert 0.10 < power < 0.18
  rng = np.random.default_rng(1)
  a, b = rng.binomial(12, 0.9, 4000), rng.binomial(12, 0.2, 4000)
  simulated = np.mean([stats.fisher_exact(int(x), 12, int(y), 12) <= 0.05 for x, y in zip(a, b)])
  assert stats.fisher_power(0.9, 12, 0.2, 12) == pytest.approx(simulated, abs=0.025)


def test_fisher_detectable_brackets_the_power():
  lo, hi = stats.fisher_detectable(1.0, 12, 12)
  assert hi is None and 0 < lo < 1
  assert stats.fisher_power(1.0, 12, lo, 12) >= 0.8 > stats.fisher_power(1.0, 12, lo + 0.01, 12)


def test_t_interval_and_paired_match_scipy():
  rng = np.random.default_rng(2)
  a, b = rng.normal(1.0, 0.3, 7), rng.normal(0.8, 0.3, 7)
  got = stats.paired(dict(enumerate(a)), dict(enumerate(b)))
  res = sps.ttest_rel(a, b)
  ci = res.confidence_interval(0.95)
  assert got['mean'] == pytest.approx(np.mean(a - b))
  assert got['interval'] == pytest.approx([ci.low, ci.high], rel=1e-9)
  assert got['t'] == pytest.approx(res.statistic) and got['p'] == pytest.approx(res.pvalue)
  assert got['lower'] == int((a > b).sum()) and got['n'] == 7
  assert stats.paired({0: 1.0}, {1: 2.0}) is None
  assert stats.t_interval([0.3])['interval'] is None


def test_t_power_published_values_and_detectable():
  # G*Power / Cohen (1988): one-sample t, d = 1, n = 10, two-sided 0.05 -> power 0.803
  assert stats.t_power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=5e-4)
  # simulated: the t-test's rejection rate at the detectable effect is the asked power
  sd, n = 0.05, 4
  delta = stats.t_detectable(sd, n)
  assert stats.t_power(delta, sd, n) == pytest.approx(0.8, abs=1e-4)
  rng = np.random.default_rng(3)
  d = rng.normal(delta, sd, (20000, n))
  rate = np.mean(sps.ttest_1samp(d, 0, axis=1).pvalue <= 0.05)
  assert rate == pytest.approx(0.8, abs=0.015)


def test_sign_test_matches_scipy():
  for k, n in [(9, 9), (7, 9), (0, 4), (3, 6), (12, 20)]:
    assert stats.sign_test(k, n) == pytest.approx(sps.binomtest(k, n).pvalue, rel=1e-9)


def test_kendall_tau_b_matches_scipy_with_ties():
  rng = np.random.default_rng(4)
  for _ in range(50):
    x, y = rng.integers(0, 5, 9), rng.normal(size=9)
    y[:3] = y[0]   # ties in y too
    want = sps.kendalltau(x, y).statistic
    got = stats.kendall_tau(x, y)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


def test_bootstrap_tau_covers_and_narrows():
  rng = np.random.default_rng(5)
  reference = np.arange(8.0)
  samples = reference[:, None] * 0.1 + rng.normal(0, 0.02, (8, 16))
  res = stats.bootstrap_tau(samples, reference, n_boot=500)
  assert res['tau'] > 0.8 and res['interval'][0] > 0.5 and res['interval'][1] <= 1.0
  noisy = rng.normal(0, 1, (8, 4))
  wide = stats.bootstrap_tau(noisy, reference, n_boot=500)
  assert wide['interval'][1] - wide['interval'][0] > res['interval'][1] - res['interval'][0]


BEETLES = dict(  # Bliss (1935); Dobson & Barnett, An Introduction to GLMs, Table 7.2
    x=[1.6907, 1.7242, 1.7552, 1.7842, 1.8113, 1.8369, 1.8610, 1.8839],
    n=[59, 60, 62, 56, 63, 59, 62, 60], k=[6, 13, 18, 28, 52, 53, 61, 60])


def test_logistic_fit_published_beetle_mortality():
  fit = stats.logistic_fit(BEETLES['x'], BEETLES['k'], BEETLES['n'])
  # Dobson & Barnett, Table 7.3 (logistic): b1 = -60.72 (s.e. 5.18), b2 = 34.27 (2.91)
  assert fit['converged'] and not fit['separated']
  assert fit['a'] == pytest.approx(-60.72, abs=0.01) and fit['b'] == pytest.approx(34.27, abs=0.01)
  se = np.sqrt(np.diag(fit['cov']))
  assert se[0] == pytest.approx(5.18, abs=0.01) and se[1] == pytest.approx(2.91, abs=0.01)
  assert fit['x50'] == pytest.approx(60.72 / 34.27, abs=1e-3)


def test_logistic_fit_matches_direct_likelihood_maximum():
  rng = np.random.default_rng(6)
  x = np.log(np.array([0.1, 0.125, 0.156, 0.195, 0.244, 0.305]))
  n = np.full(6, 16)
  k = rng.binomial(16, 1 / (1 + np.exp(-(x - x.mean()) * 4)))
  def nll(beta):
    z = beta[0] + beta[1] * x
    return -np.sum(k * z - n * np.logaddexp(0, z))
  best = optimize.minimize(nll, [0.0, 1.0], method='Nelder-Mead',
                           options={'xatol': 1e-10, 'fatol': 1e-12, 'maxiter': 20000}).x
  fit = stats.logistic_fit(x, k, n)
  assert [fit['a'], fit['b']] == pytest.approx(best, rel=1e-4, abs=1e-4)
  # delta method: x50's se against the spread of x50 over a parametric bootstrap
  p = 1 / (1 + np.exp(-(fit['a'] + fit['b'] * x)))
  boots = [stats.logistic_fit(x, rng.binomial(16, p), n) for _ in range(300)]
  x50s = [b['x50'] for b in boots if b['x50'] is not None and abs(b['x50']) < 10]
  assert fit['x50_se'] == pytest.approx(np.std(x50s), rel=0.35)


def test_logistic_separated_gives_a_bracket_and_ratio_bounds():
  x = np.log([0.1, 0.2, 0.4, 0.8])
  fit = stats.logistic_fit(x, [0, 0, 4, 4], [4, 4, 4, 4])
  assert fit['separated'] and fit['bracket'] == pytest.approx([np.log(0.2), np.log(0.4)])
  other = stats.logistic_fit(x, [0, 0, 0, 4], [4, 4, 4, 4])
  r = stats.half_ratio(other, fit)
  assert r['ratio'] is None and r['bounds'] == pytest.approx([1.0, 4.0])


def test_logistic_fit_of_one_rate_is_none():
  """Seeds at one rate, some failing (the boundary runs: 5/8 at 0.125) say nothing about a
  slope: no fit and no bracket (it was reported as 'above - (none failed on the grid)')."""
  fit = stats.logistic_fit(np.log([0.125]), [5], [8])
  assert fit['x50'] is None and fit['bracket'] is None and not fit['separated']
  assert stats.logistic_fit(np.log([0.125, 0.125]), [2, 3], [4, 4])['bracket'] is None
  assert stats.half_ratio(fit, fit) is None


def test_half_ratio_of_shifted_curves():
  x = np.log(np.geomspace(0.05, 1.0, 10))
  n = np.full(10, 400)
  curve = lambda shift: np.round(n / (1 + np.exp(-(x - np.log(0.2) - shift) * 3)))  # noqa: E731
  base = stats.logistic_fit(x, curve(0.0), n)
  moved = stats.logistic_fit(x, curve(np.log(1.5)), n)
  r = stats.half_ratio(moved, base)
  assert r['ratio'] == pytest.approx(1.5, rel=0.02)
  assert r['interval'][0] < 1.5 < r['interval'][1] and r['interval'][0] > 1.2


def test_logistic_fit_steep_curve_on_a_narrow_grid():
  """One mixed point between none and all (0/4, 3/4, 4/4 at rates x1.25 apart) is quasi-complete
  separation: no finite maximum (the likelihood rises as the slope grows through that point), so
  a bracket, not a fit; two mixed points fit, at the likelihood's maximum."""
  x = np.log([0.1, 0.125, 0.195])
  fit = stats.logistic_fit(x, [0, 3, 4], [4, 4, 4])
  assert fit['separated'] and fit['bracket'] == pytest.approx([np.log(0.1), np.log(0.195)])
  def nll(beta, k, n):
    z = beta[0] + beta[1] * x
    return -np.sum(k * z - n * np.logaddexp(0, z))
  k, n = np.array([0, 3, 4]), np.array([4, 4, 4])
  through = lambda b: [np.log(3) - b * x[1], b]   # P = 0.75 at the mixed point  # noqa: E731
  assert nll(through(40), k, n) < nll(through(20), k, n) < nll(through(10), k, n)
  k = np.array([1, 3, 4])
  fit = stats.logistic_fit(x, k, n)
  assert fit['converged'] and not fit['separated']
  best = optimize.minimize(nll, [fit['a'] * 0.9, fit['b'] * 0.9], args=(k, n),
                           method='Nelder-Mead',
                           options={'xatol': 1e-12, 'fatol': 1e-14, 'maxiter': 40000})
  assert -nll([fit['a'], fit['b']], k, n) >= -best.fun - 1e-9
  assert stats.half_ratio({'bracket': [np.log(0.6), None]}, fit)['bounds'][1] == math.inf
  assert stats.half_ratio({'bracket': [np.log(0.6), None]}, {'bracket': [np.log(0.3), None]}) is None
