"""Scaling in miniature: validation loss against model size and training compute, per variant.

What the runner's tables add for an experiment file with SCALING = True (experiments/
scaling_ladder.py): each run's size read off its saved config (non-embedding parameters, the
paper's and Kaplan et al.'s N, and the training FLOPs C = FLOPs per token x tokens trained,
model/transformer.py `train_flops_per_token`), a power law L = a * N^-alpha fitted per variant by
least squares in log-log over every seed's run, its 95% interval from a bootstrap over seeds
(resampled within each size), the same against C, and each size's gap between the baseline and a
gated variant, paired by seed (a seed fixes both variants' data order), with its standard error
and its trend per decade of N. A pure power law has no irreducible term: with four sizes
a third parameter is not identified, so alpha here describes this range, not an asymptote.
"""

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGURE = 'scaling.png'
BOOTSTRAP = 2000


def run_size(config) -> dict:
  """{'params': non-embedding parameters, 'tokens': tokens trained, 'flops': training FLOPs} of
  a run's saved config (an ml_collections ConfigDict)."""
  from gated_attention.model import transformer  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  model = ModelConfig.from_config(config.model)
  seq_len = int(config.data.seq_len)
  tokens = int(config.train.steps) * int(config.train.batch_size) * seq_len
  return {'params': int(transformer.param_report(model)['non_embedding']), 'tokens': tokens,
          'flops': float(transformer.train_flops_per_token(model, seq_len)) * tokens}


def fit_power_law(x, y) -> tuple[float, float]:
  """(a, alpha) of y = a * x^-alpha, least squares on log y against log x."""
  slope, intercept = np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)
  return float(np.exp(intercept)), float(-slope)


def bootstrap_alpha(points: dict, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
  """The 95% percentile interval of alpha, `points` {x: [y of each seed]}: each resample draws
  the seeds of every x with replacement."""
  rng = np.random.default_rng(seed)
  xs = sorted(points)
  alphas = []
  for _ in range(n):
    x, y = [], []
    for v in xs:
      ys = np.asarray(points[v], float)
      pick = ys[rng.integers(0, len(ys), len(ys))]
      x += [v] * len(pick)
      y += list(pick)
    alphas.append(fit_power_law(x, y)[1])
  lo, hi = np.percentile(alphas, [2.5, 97.5])
  return float(lo), float(hi)


def _by_seed(results, key: str, variant: str) -> dict:
  """{size: {seed: val loss}} of one variant's finished runs (size: 'params' or 'flops'; FLOPs
  differ by a gate's few parameters, so a variant's own are used)."""
  out = {}
  for r in results:
    loss = (r.report or {}).get('loss')
    if r.run.variant == variant and r.status == 'done' and loss is not None and r.size:
      out.setdefault(r.size[key], {})[r.run.seed] = float(loss)
  return out


def _points(results, key: str, variant: str) -> dict:
  """{size: [val loss of each seed]} of one variant's finished runs."""
  return {k: list(v.values()) for k, v in _by_seed(results, key, variant).items()}


def variants(results) -> list[str]:
  return list(dict.fromkeys(r.run.variant for r in results))


def fits(results) -> dict:
  """Per variant and axis ('params', 'flops'): a, alpha, its 95% interval and the points."""
  out = {}
  for variant in variants(results):
    for key in ('params', 'flops'):
      pts = _points(results, key, variant)
      if len(pts) < 2:
        continue
      x = [v for v, ys in pts.items() for _ in ys]
      y = [y for ys in pts.values() for y in ys]
      a, alpha = fit_power_law(x, y)
      out.setdefault(variant, {})[key] = {
          'a': a, 'alpha': alpha, 'interval': bootstrap_alpha(pts) if len(y) > len(pts) else None,
          'points': {str(k): v for k, v in sorted(pts.items())}}
  return out


def gaps(results, reference: str = 'baseline') -> list[dict]:
  """Per size and gated variant: reference loss - variant loss (positive: the gate helps), the
  mean over the seeds both have and its standard error over those seeds' differences: a seed
  fixes both variants' data order (the held-out batches are the same for every run), so the
  pairs share much of what varies between seeds (seeds one variant lacks are left out)."""
  base = _by_seed(results, 'params', reference)
  rows = []
  for variant in variants(results):
    if variant == reference:
      continue
    mine = _by_seed(results, 'params', variant)
    for (nb, yb), (nv, yv) in zip(sorted(base.items()), sorted(mine.items())):
      seeds = sorted(set(yb) & set(yv))
      if not seeds:
        continue
      d = np.asarray([yb[s] - yv[s] for s in seeds], float)
      se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float('nan')
      rows.append({'variant': variant, 'params': nb, 'params_variant': nv, 'seeds': seeds,
                   'gap': float(d.mean()), 'se': se, 'per_seed': d.tolist()})
  return rows


def gap_trend(rows: list[dict], variant: str) -> tuple[float, float] | None:
  """(slope, standard error) of the per-seed gaps against log10 N, ordinary least squares over
  every seed of every size (the error from the residuals, n - 2 degrees of freedom): > 0 means
  the advantage grows with scale. None with fewer than 3 gaps or 2 sizes."""
  rs = [r for r in rows if r['variant'] == variant]
  x = np.asarray([np.log10(r['params']) for r in rs for _ in r['per_seed']], float)
  y = np.asarray([d for r in rs for d in r['per_seed']], float)
  if len(y) < 3 or len(set(x.tolist())) < 2:
    return None
  sxx = np.sum((x - x.mean()) ** 2)
  slope = np.sum((x - x.mean()) * (y - y.mean())) / sxx
  resid = y - (y.mean() + slope * (x - x.mean()))
  return float(slope), float(np.sqrt(np.sum(resid ** 2) / (len(y) - 2) / sxx))


def tables(results) -> str:
  """Markdown: the fitted exponents, then each size's losses and gaps."""
  f, g = fits(results), gaps(results)
  lines = ['| variant | alpha (L ∝ N^-alpha) | 95% interval | a | alpha vs FLOPs | 95% interval'
           ' |',
           '|---|---|---|---|---|---|']
  for variant, by in f.items():
    p, c = by.get('params'), by.get('flops')
    if not (p and c):
      lines.append(f'| {variant} | - | - | - | - | - |')
      continue
    interval = lambda d: ('-' if not d['interval'] else  # noqa: E731
                          '[{:.4f}, {:.4f}]'.format(*d['interval']))
    lines.append(f'| {variant} | {p["alpha"]:.4f} | {interval(p)} | {p["a"]:.3f} | '
                 f'{c["alpha"]:.4f} | {interval(c)} |')
  if g:
    lines += ['', '| non-embedding params (baseline) | variant | baseline loss - variant loss, '
              'paired by seed | ± s.e. | per seed |', '|---|---|---|---|---|']
    lines += [f'| {int(r["params"]):,} | {r["variant"]} | {r["gap"]:+.4f} | {r["se"]:.4f} | '
              f'{", ".join(f"{x:+.3f}" for x in r["per_seed"])} |' for r in g]
    for variant in dict.fromkeys(r['variant'] for r in g):
      trend = gap_trend(g, variant)
      if trend:
        lines.append(f'\nGap of {variant} against log10 N (least squares over every seed): '
                     f'{trend[0]:+.4f} ± {trend[1]:.4f} per decade.')
  return '\n'.join(lines)


def figure(results) -> Figure:
  """Validation loss against non-embedding parameters and against training FLOPs (log-log),
  each seed's run a point, the mean per size joined, the fitted power law dashed."""
  fig = Figure(figsize=(10, 4), layout='constrained')
  FigureCanvasAgg(fig)
  axes = fig.subplots(1, 2)
  f = fits(results)
  for i, variant in enumerate(variants(results)):
    for ax, key, label in ((axes[0], 'params', 'non-embedding parameters'),
                           (axes[1], 'flops', 'training FLOPs')):
      pts = _points(results, key, variant)
      if not pts:
        continue
      xs = sorted(pts)
      for x in xs:
        ax.scatter([x] * len(pts[x]), pts[x], color=f'C{i}', s=10, alpha=0.6)
      ax.plot(xs, [np.mean(pts[x]) for x in xs], color=f'C{i}', marker='o',
              label=variant if key not in f.get(variant, {}) else
              f'{variant} (alpha {f[variant][key]["alpha"]:.3f})')
      if key in f.get(variant, {}):
        grid = np.geomspace(xs[0], xs[-1], 50)
        ax.plot(grid, f[variant][key]['a'] * grid ** -f[variant][key]['alpha'], color=f'C{i}',
                ls='--', lw=1)
      ax.set(xscale='log', yscale='log', xlabel=label, ylabel='validation loss (nats/token)')
  for ax in axes:
    if ax.lines:
      ax.legend(fontsize=7)
  return fig
