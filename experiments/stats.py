"""The statistics of the experiment tables, in one module (tests/test_stats.py checks each against
scipy or a published value).

  wilson_interval(k, n)                    95% interval of a rate k / n (Wilson score)
  fisher_exact(k1, n1, k2, n2)             two-sided p of Fisher's exact test of two rates
  fisher_power(p1, n1, p2, n2)             the chance that Fisher's test finds p1 != p2 (exact)
  fisher_detectable(p1, n1, n2)            the rates p2 that n1 and n2 seeds would tell from p1
  t_interval(values) / paired(a, b)        mean, 95% t interval, t, p (a paired difference)
  t_power(effect, sd, n) / t_detectable    power of the one-sample (paired) t-test; the smallest
                                           mean difference it finds with 80% power
  sign_test(k, n)                          two-sided binomial sign test
  kendall_tau(x, y), bootstrap_tau(...)    rank agreement (tau-b) and its bootstrap interval
  logistic_fit(x, k, n), half_ratio(a, b)  failure probability against log learning rate, the
                                           rate at which half the seeds fail, two variants' ratio

Everything is float64 numpy or plain Python; scipy is used only for the t and noncentral t
distributions (jax requires scipy, requirements-test.txt pins it).
"""

import math

import numpy as np

Z95 = 1.959963984540054   # the standard normal's 97.5% quantile


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """The Wilson score interval (95% for z = 1.96) of a rate k / n: where a rate measured on n
  seeds can lie (exact enough at small n, unlike k/n ± z·se). (0, 1) without runs."""
  if n == 0:
    return 0.0, 1.0
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def _hypergeom(k1: int, n1: int, n2: int, total: int) -> float:
  """P(first group has k1 of the `total` events | margins n1, n2)."""
  return math.comb(n1, k1) * math.comb(n2, total - k1) / math.comb(n1 + n2, total)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
  """Two-sided p of Fisher's exact test of k1/n1 against k2/n2: the probability, given both
  margins, of the tables no more likely than the one observed (scipy's and R's convention,
  with the same relative tolerance 1e-7 for ties)."""
  total = k1 + k2
  lo, hi = max(0, total - n2), min(n1, total)
  probs = [_hypergeom(i, n1, n2, total) for i in range(lo, hi + 1)]
  observed = probs[k1 - lo]
  return min(1.0, sum(p for p in probs if p <= observed * (1 + 1e-7)))


def _binom_pmf(n: int, p: float) -> np.ndarray:
  k = np.arange(n + 1)
  return np.array([math.comb(n, int(i)) for i in k], float) * p ** k * (1 - p) ** (n - k)


def fisher_power(p1: float, n1: int, p2: float, n2: int, alpha: float = 0.05) -> float:
  """The power of Fisher's exact test (two-sided, level alpha) to tell a rate p1 measured on n1
  seeds from p2 on n2: the sum over every outcome (k1, k2) of its binomial probability where
  the test's p is at most alpha. Exact, no simulation."""
  rejects = np.array([[fisher_exact(a, n1, b, n2) <= alpha for b in range(n2 + 1)]
                      for a in range(n1 + 1)], float)
  return float(_binom_pmf(n1, p1) @ rejects @ _binom_pmf(n2, p2))


def fisher_detectable(p1: float, n1: int, n2: int, power: float = 0.8,
                      alpha: float = 0.05) -> tuple[float | None, float | None]:
  """The rates p2 closest to p1, below and above it, that Fisher's test on n1 and n2 seeds finds
  with `power` (bisection to 1e-4; None where no rate on that side reaches it)."""
  def side(edge):
    if fisher_power(p1, n1, edge, n2, alpha) < power:
      return None
    near, far = p1, edge
    while abs(far - near) > 1e-4:
      mid = (near + far) / 2
      if fisher_power(p1, n1, mid, n2, alpha) >= power:
        far = mid
      else:
        near = mid
    return far
  return side(0.0), side(1.0)


def t_interval(values, confidence: float = 0.95) -> dict:
  """The mean of `values` with its t interval (None with one value), the t statistic against 0
  and its two-sided p (None where the values do not vary or there is one), sd and n."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  d = np.asarray(values, float)
  n = len(d)
  out = {'mean': float(d.mean()), 'interval': None, 't': None, 'p': None, 'n': n,
         'sd': float(d.std(ddof=1)) if n > 1 else None}
  if n > 1:
    se = d.std(ddof=1) / math.sqrt(n)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * se
    out['interval'] = [float(d.mean() - half), float(d.mean() + half)]
    if se > 0:
      out['t'] = float(d.mean() / se)
      out['p'] = float(2 * stats.t.sf(abs(out['t']), n - 1))
  return out


def paired(base: dict, other: dict) -> dict | None:
  """The baseline's value minus the variant's, paired by seed over the seeds both have (dicts
  seed -> value; None values skipped): t_interval's fields, `lower` (the pairs in which the
  variant's value is the lower), the `seeds` paired and each pair's difference (`values`). None
  without a pair."""
  seeds = [s for s in base if s in other and base[s] is not None and other[s] is not None]
  if not seeds:
    return None
  d = np.asarray([base[s] - other[s] for s in seeds], float)
  return {**t_interval(d), 'lower': int((d > 0).sum()), 'seeds': seeds, 'values': d.tolist()}


def t_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
  """The power of the two-sided one-sample t-test (a paired difference over n pairs) to find a
  true mean difference `effect` when the differences' sd is `sd` (noncentral t)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  if n < 2 or sd <= 0:
    return float('nan')
  df, nc = n - 1, effect / sd * math.sqrt(n)
  crit = stats.t.ppf(1 - alpha / 2, df)
  return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def t_detectable(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
  """The smallest true mean difference that the two-sided t-test over n pairs finds with
  `power`, for differences of sd `sd` (bisection on t_power)."""
  if n < 2 or sd <= 0:
    return float('nan')
  lo, hi = 0.0, sd
  while t_power(hi, sd, n, alpha) < power:
    hi *= 2
  while hi - lo > 1e-6 * sd:
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if t_power(mid, sd, n, alpha) >= power else (mid, hi)
  return hi


def sign_test(k: int, n: int) -> float:
  """Two-sided p of the sign test: k of n pairs in one direction, against a fair coin."""
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2 ** n
  return min(1.0, 2 * tail)


def kendall_tau(x, y) -> float:
  """Kendall's tau-b of two sequences (ties in either counted as neither concordant nor
  discordant, and corrected for); nan where one sequence is constant."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  concordant = discordant = ties_x = ties_y = 0
  for i in range(len(x)):
    for j in range(i + 1, len(x)):
      sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
      if sx == 0 and sy == 0:
        continue
      if sx == 0:
        ties_x += 1
      elif sy == 0:
        ties_y += 1
      elif sx == sy:
        concordant += 1
      else:
        discordant += 1
  denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
  return (concordant - discordant) / denom if denom else float('nan')


def bootstrap_tau(samples: list, reference, n_boot: int = 2000, seed: int = 0,
                  confidence: float = 0.95) -> dict:
  """Rank agreement of items measured over seeds with a reference value per item: Kendall's
  tau-b of each item's mean against `reference`, and its percentile bootstrap interval.
  `samples`: one array per item of shape [seeds], the items' seeds paired (the same seed index
  in every item: a bootstrap draw resamples seed indices once for all items, keeping each seed's
  pairing). Returns tau, interval, n_items, n_seeds."""
  arr = np.asarray(samples, float)          # [items, seeds]
  rng = np.random.default_rng(seed)
  tau = kendall_tau(np.nanmean(arr, axis=1), reference)
  draws = []
  for _ in range(n_boot):
    idx = rng.integers(0, arr.shape[1], arr.shape[1])
    t = kendall_tau(np.nanmean(arr[:, idx], axis=1), reference)
    if not math.isnan(t):
      draws.append(t)
  tail = (1 - confidence) / 2 * 100
  interval = [float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))]
  return {'tau': tau, 'interval': interval, 'n_items': arr.shape[0], 'n_seeds': arr.shape[1]}


def logistic_fit(x, k, n, iterations: int = 100) -> dict:
  """Maximum-likelihood logistic regression of k[i] events in n[i] trials at x[i]:
  P(event) = 1 / (1 + exp(-(a + b x))), by Newton's method in float64. Returns a, b, their
  covariance (`cov`, the inverse Fisher information), x50 = -a / b (where half the trials have
  the event) with its delta-method standard error, and `separated`: True when the events are
  split by x (no event below some point, all events above it, that point itself mixed or not:
  complete or quasi-complete separation), where the maximum-likelihood slope is infinite; then
  a, b, cov are None and `bracket` holds the x interval inside which x50 lies (the last x with no
  event, the first x with all; None where the grid has none). `converged` reports Newton's
  method (steps halved until the likelihood rises; None fields if it did not get there). One
  rate alone (experiments/lr_stability_bf16_boundary.py's sixteen seeds at 0.125) has no slope
  to fit and no bracket: every field None, whatever its count."""
  x, k, n = (np.asarray(v, float) for v in (x, k, n))
  keep = n > 0
  x, k, n = x[keep], k[keep], n[keep]
  order = np.argsort(x)
  x, k, n = x[order], k[order], n[order]
  out = {'a': None, 'b': None, 'cov': None, 'x50': None, 'x50_se': None, 'separated': False,
         'bracket': None, 'converged': False}
  if np.all(k == 0) or np.all(k == n) or len(np.unique(x)) < 2:
    return out   # no event, nothing but events, or one x: no curve to fit
  for i in range(len(x)):   # (quasi-)separation: none below point i, all above it
    if np.all(k[:i] == 0) and np.all(k[i + 1:] == n[i + 1:]):
      none, full = x[k == 0], x[k == n]
      out['separated'] = True
      out['bracket'] = [float(none.max()) if len(none) else None,   # None: open at that end
                        float(full.min()) if len(full) else None]
      return out
  centre = float(np.average(x, weights=n))     # fitted on x - centre: better conditioned
  design = np.stack([np.ones_like(x), x - centre], 1)

  def loglik(beta):
    z = design @ beta
    return float(np.sum(k * z - n * np.logaddexp(0, z)))

  beta = np.zeros(2)
  for _ in range(iterations):   # Newton's method, each step halved until the likelihood rises
    p = 1 / (1 + np.exp(-(design @ beta)))
    info = design.T @ (design * (n * p * (1 - p))[:, None])
    try:
      step = np.linalg.solve(info, design.T @ (k - n * p))
    except np.linalg.LinAlgError:
      break
    before = loglik(beta)
    for _ in range(40):
      if loglik(beta + step) >= before - 1e-12:
        break
      step = step / 2
    beta = beta + step
    if np.max(np.abs(step)) < 1e-10:
      out['converged'] = True
      break
  p = 1 / (1 + np.exp(-(design @ beta)))
  try:
    cov_c = np.linalg.inv(design.T @ (design * (n * p * (1 - p))[:, None]))
  except np.linalg.LinAlgError:
    return out
  jac = np.array([[1.0, -centre], [0.0, 1.0]])     # (a, b) from the centred fit's (a_c, b)
  beta = jac @ beta
  cov = jac @ cov_c @ jac.T
  a, b = float(beta[0]), float(beta[1])
  grad = np.array([-1 / b, a / b ** 2])
  out.update(a=a, b=b, cov=cov.tolist(), x50=-a / b, x50_se=float(math.sqrt(grad @ cov @ grad)))
  return out


def half_ratio(fit: dict, base: dict, z: float = Z95) -> dict | None:
  """The ratio of the learning rates at which half the seeds fail, variant over baseline, from
  two logistic_fit's of failure against the natural log of the learning rate: `ratio` =
  exp(x50 - x50_base) with its 95% interval (delta method, the two fits independent), or, where
  either fit is separated, the `bounds` its bracket allows (no point estimate; a fitted x50
  enters with its 95% interval; an open bracket end gives 0 or inf). None where either has no
  x50 and no bracket, or where the brackets bound nothing (both open the same way)."""
  def span(f):
    if f.get('x50') is not None:
      return f['x50'] - z * f['x50_se'], f['x50'] + z * f['x50_se'], f['x50_se']
    if f.get('bracket') is not None:
      lo, hi = f['bracket']
      return (-math.inf if lo is None else lo), (math.inf if hi is None else hi), None
    return None
  s, b = span(fit), span(base)
  if s is None or b is None:
    return None
  if s[2] is not None and b[2] is not None:
    diff, se = fit['x50'] - base['x50'], math.sqrt(s[2] ** 2 + b[2] ** 2)
    return {'ratio': math.exp(diff), 'interval': [math.exp(diff - z * se),
                                                  math.exp(diff + z * se)], 'bounds': None}
  bounds = [math.exp(s[0] - b[1]), math.exp(s[1] - b[0])]
  if bounds[0] == 0 and math.isinf(bounds[1]):
    return None   # both open the same way: no bound at all
  return {'ratio': None, 'interval': None, 'bounds': bounds}
