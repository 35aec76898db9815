"""Each variant against a reference variant, paired by seed (PAIRED = 'baseline'), and the rank
agreement of those differences with the paper's (PAPER): Table 1 in miniature.

A seed fixes the data order and the initialisation, so the reference's and a variant's runs of
one seed saw the same batches; their validation losses are compared seed by seed: the mean
difference (reference minus variant: positive where the variant is lower) with its 95% t interval
and p, the pairs in which the variant is lower, and the smallest true difference the t-test over
these pairs would find with 80% power (from the differences' observed spread: what this table
could have detected). With PAPER (the paper's differences, same sign), Kendall's tau-b between the
miniature's and the paper's differences over the variants that have both, with a bootstrap
interval over seeds (a draw resamples seed indices once for every variant, keeping the pairing).
"""

import numpy as np

from experiments import rundata, stats

METRIC = 'val_loss'


def _values(rs, metric: str = METRIC) -> dict:
  """seed -> `metric` of each finished run of one group (None where not analysed)."""
  get = rundata.METRICS[metric][1]
  return {r.run.seed: get(r) for r in rs if r.status == 'done'}


def differences(experiment, results, metric: str = METRIC) -> dict:
  """Per group other than the reference's (at the same point): `variant`, `params` (non-embedding
  parameters of a finished run, when read), `diff` (stats.paired of reference minus variant, of
  `metric`: the validation loss, or another of PAIRED_METRICS), `detectable` (stats.t_detectable
  of its sd and n), `paper` (PAPER's value or None; the paper's numbers are losses)."""
  groups = rundata.by_group(experiment, results)
  ref = experiment.paired
  out = {}
  for group, rs in groups.items():
    variant = rs[0].run.variant
    point = group[len(variant):]
    base = groups.get(ref + point)
    if variant == ref or base is None:
      continue
    d = stats.paired(_values(base, metric), _values(rs, metric))
    paper = experiment.paper.get(variant) if metric == METRIC else None
    out[group] = {'variant': variant, 'diff': d, 'paper': paper,
                  'detectable': (stats.t_detectable(d['sd'], d['n'])
                                 if d and d['sd'] else None)}
  return out


def agreement(diffs: dict, n_boot: int = 2000) -> dict | None:
  """Kendall's tau-b of the miniature's mean differences against the paper's, over the groups
  with both, and its bootstrap interval over seeds (stats.bootstrap_tau); None below 3 groups."""
  rows = [d for d in diffs.values() if d['paper'] is not None and d['diff']]
  if len(rows) < 3:
    return None
  seeds = sorted({s for d in rows for s in d['diff']['seeds']})
  samples = []
  for d in rows:   # per seed: the pair's difference (nan where this group lacks the seed)
    by_seed = dict(zip(d['diff']['seeds'], d['diff']['values']))
    samples.append([by_seed.get(s, np.nan) for s in seeds])
  res = stats.bootstrap_tau(samples, [d['paper'] for d in rows], n_boot=n_boot)
  return {**res, 'variants': [d['variant'] for d in rows]}


def _signed(x, fmt):
  return '-' if x is None else format(x, '+' + fmt)


def table(experiment, results) -> str:
  """Markdown of `differences` (a row per group) and `agreement`."""
  ref = experiment.paired
  diffs = differences(experiment, results)
  lines = [f'Each variant against `{ref}`, paired by seed: {ref} minus the variant\'s validation '
           'loss (positive: the variant is lower), its mean with the 95% t interval and p, the '
           'pairs in which the variant is lower, and the smallest true difference the t-test over '
           'these pairs finds with 80% power (from the pairs\' observed spread); the paper\'s '
           f'difference beside it ({experiment.paper_label or "PAPER"}; same sign):', '',
           f'| variant | {ref} - variant (95% interval) | p | pairs lower | detectable (80% power) '
           '| paper |', '|---|---|---|---|---|---|']
  for group, d in diffs.items():
    diff = d['diff']
    if not diff:
      lines.append(f'| {group} | - | - | - | - | {_signed(d["paper"], ".3f")} |')
      continue
    interval = ('' if diff['interval'] is None else
                ' [{:+.3f}, {:+.3f}]'.format(*diff['interval']))
    p = '-' if diff['p'] is None else format(diff['p'], '.3f')
    detectable = '-' if d['detectable'] is None else format(d['detectable'], '.3f')
    lines.append(f'| {group} | {diff["mean"]:+.3f}{interval} | {p} | {diff["lower"]}/{diff["n"]} '
                 f'| {detectable} | {_signed(d["paper"], ".3f")} |')
  for metric in experiment.paired_metrics:
    if metric != METRIC:
      lines += ['', _metric_table(experiment, results, metric)]
  a = agreement(diffs)
  if a is not None:
    lines += ['', f'Rank agreement with the paper over the {len(a["variants"])} variants it '
              f'reports ({", ".join(a["variants"])}): Kendall\'s tau-b = {a["tau"]:+.2f}, 95% '
              f'bootstrap interval [{a["interval"][0]:+.2f}, {a["interval"][1]:+.2f}] (seeds '
              f'resampled, {a["n_seeds"]} a variant).']
  return '\n'.join(lines)


def _metric_table(experiment, results, metric: str) -> str:
  """The table of `differences` of another metric than the loss (PAIRED_METRICS)."""
  ref, heading, fmt = experiment.paired, rundata.METRICS[metric][0], rundata.METRICS[metric][2]
  lines = [f'{heading} (`{metric}`), each variant against `{ref}` paired by seed: {ref} minus the '
           'variant (positive: the variant is lower), the mean with its 95% t interval and p, the '
           'pairs in which the variant is lower, the smallest true difference the t-test finds '
           'with 80% power:', '',
           f'| variant | {ref} - variant (95% interval) | p | pairs lower | detectable (80% power) |',
           '|---|---|---|---|---|']
  for group, d in differences(experiment, results, metric).items():
    diff = d['diff']
    if not diff:
      lines.append(f'| {group} | - | - | - | - |')
      continue
    interval = ('' if diff['interval'] is None else ' [{}, {}]'.format(
        *(format(x, '+' + fmt) for x in diff['interval'])))
    p = '-' if diff['p'] is None else format(diff['p'], '.3f')
    detectable = '-' if d['detectable'] is None else format(d['detectable'], fmt)
    lines.append(f'| {group} | {format(diff["mean"], "+" + fmt)}{interval} | {p} | '
                 f'{diff["lower"]}/{diff["n"]} | {detectable} |')
  return '\n'.join(lines)


def summary(experiment, results) -> dict:
  diffs = differences(experiment, results)
  return {'differences': diffs, 'agreement': agreement(diffs),
          'metrics': {m: differences(experiment, results, m)
                      for m in experiment.paired_metrics if m != METRIC}}
