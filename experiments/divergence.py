"""Stability in the paper's regime (an experiment with SECOND_CUTOFF): the verdict at two cutoffs,
the failure probability fitted against the log learning rate with the ratio of the rates at which
half the seeds fail, and massive activations through training.

For each cutoff (DIVERGED_ABOVE, SECOND_CUTOFF; stability.failures counts the runs that failed at
it), per variant: a logistic fit of P(fail) against ln(peak rate) over the grid (stats.logistic_fit)
and the rate where it crosses one half (its 95% interval, delta method); per gated variant the
ratio of that rate to the baseline's (stats.half_ratio): an interval above 1 says the gate trains at
higher rates. Where a variant's failures are separated by the grid (none below some rate, all
above it) the rate is bracketed, not fitted, and the ratio gets bounds.
Massive activations: each run's M-Act (the largest layer's max |h|) at every evaluation of the
training loop; for the runs that failed, the onset of the divergence: the first evaluation after
warm-up whose validation loss rose RISE nats above the lowest before it (a halted run's halt step;
none for a run that failed without such a rise: it learnt too slowly rather than diverged), and
whether their M-Act peaked by then; at the rates where some seeds failed and some trained, the
chance that a failing run's M-Act at the end of the warm-up is above a training run's (pairs at
the same rate; 0.5: M-Act does not foretell the failure).
"""

import math

from experiments import figures, rundata, stability, stats

FIGURE = 'divergence.png'
RISE = 0.2   # nats above the lowest validation loss so far: a divergence's onset


def _series(res, key) -> dict:
  """step -> the largest layer's value of `key` (m_act) or the loss, at each evaluation."""
  out = {}
  for r in res.rows:
    if r.get('split') != 'val':
      continue
    v = r.get(key)
    if isinstance(v, list):
      v = max((x for x in v if x is not None), default=None)
    if v is not None:
      out[r['step']] = float(v)
  return out


def fits(experiment, results, above: float) -> dict:
  """Per variant (and point): the failure counts over the grid at `above`, the logistic fit, the
  half-failure rate `lr50` with its 95% interval (or the `bracket` of a separated fit), and for
  the gated variants `ratio` (stats.half_ratio against the baseline at the same point)."""
  counts = stability.failures(experiment, results, above)
  series = {}
  for c in counts.values():
    if c['learning_rate'] is not None and c['runs']:
      series.setdefault(c['variant_point'], []).append(c)
  out = {}
  for key, cs in series.items():
    cs = sorted(cs, key=lambda c: c['learning_rate'])
    xs = [math.log(c['learning_rate']) for c in cs]
    fit = stats.logistic_fit(xs, [c['diverged'] for c in cs], [c['runs'] for c in cs])
    if fit['x50'] is None and fit['bracket'] is None:   # none failed, or all: beyond the grid
      if not any(c['diverged'] for c in cs):
        fit = {**fit, 'bracket': [max(xs), None]}
      elif all(c['diverged'] == c['runs'] for c in cs):
        fit = {**fit, 'bracket': [None, min(xs)]}
    entry = {'variant': cs[0]['variant'], 'point': key[len(cs[0]['variant']):], 'fit': fit,
             'grid': [(c['learning_rate'], c['diverged'], c['runs']) for c in cs],
             'lr50': None, 'lr50_interval': None, 'bracket': None}
    if fit['x50'] is not None:
      half = stats.Z95 * fit['x50_se']
      entry.update(lr50=math.exp(fit['x50']),
                   lr50_interval=[math.exp(fit['x50'] - half), math.exp(fit['x50'] + half)])
    elif fit['bracket'] is not None:
      entry['bracket'] = [None if x is None else math.exp(x) for x in fit['bracket']]
    out[key] = entry
  for entry in out.values():
    base = next((b for b in out.values() if b['variant'] == 'baseline'
                 and b['point'] == entry['point']), None)
    entry['ratio'] = (stats.half_ratio(entry['fit'], base['fit'])
                      if base is not None and entry['variant'] != 'baseline' else None)
  return out


def m_act_course(experiment, results, above: float) -> dict:
  """Per variant (and point): each finished run's `m_act` course (step -> value), whether it
  `failed` at `above`, its `onset` (None for a failed run without a rise), `peak_step`, the M-Act
  at the end of the warm-up (`at_warmup`: the last evaluation at or before it), then `auc` (the
  chance, over the pairs of a failing and a training run at one rate, that the failing one's
  at_warmup is the larger; ties count half; None without such a pair, with `pairs`) and
  `peaked_by_onset` (failed runs whose M-Act peaked at or before their onset, of those with an
  onset)."""
  out = {}
  for group, rs in rundata.by_group(experiment, results).items():
    for r in rs:
      failed = stability.diverged(r, above)
      if failed is None:
        continue
      m_act, loss = _series(r, 'm_act'), _series(r, 'loss')
      warm = stability.warmup_steps(r)
      onset = None
      if failed:
        halt = [x['step'] for x in r.rows if x.get('split') == 'failure']
        onset = halt[0] if halt else next(
            (s for s in sorted(loss) if s > warm and any(t < s for t in loss)
             and loss[s] > min(v for t, v in loss.items() if t < s) + RISE), None)
      early = [s for s in m_act if s <= warm]
      key = r.run.variant + stability.without_learning_rate(r.run, group[len(r.run.variant):])
      out.setdefault(key, {'runs': []})['runs'].append({
          'seed': r.run.seed, 'learning_rate': stability.learning_rate(r.run),
          'failed': failed, 'onset': onset, 'm_act': m_act,
          'peak_step': max(m_act, key=m_act.get) if m_act else None,
          'at_warmup': m_act[max(early)] if early else None})
  for entry in out.values():
    wins = pairs = 0.0
    by_rate = {}
    for run in entry['runs']:
      by_rate.setdefault(run['learning_rate'], []).append(run)
    for runs in by_rate.values():
      bad = [x['at_warmup'] for x in runs if x['failed'] and x['at_warmup'] is not None]
      good = [x['at_warmup'] for x in runs if not x['failed'] and x['at_warmup'] is not None]
      for b in bad:
        for g in good:
          pairs += 1
          wins += 1.0 if b > g else 0.5 if b == g else 0.0
    entry['auc'] = wins / pairs if pairs else None
    entry['pairs'] = int(pairs)
    onsets = [x for x in entry['runs'] if x['failed'] and x['onset'] is not None and x['m_act']]
    entry['peaked_by_onset'] = (sum(x['peak_step'] <= x['onset'] for x in onsets), len(onsets))
    entry['onsets'] = sorted(x['onset'] for x in onsets)
  return out


def _rate(x):
  return '-' if x is None else format(x, '.3g')


def table(experiment, results) -> str:
  """Markdown: per cutoff, the failures over the grid, the fit and the ratio; then M-Act."""
  cutoffs = [experiment.diverged_above, experiment.second_cutoff]
  lines = []
  for above in cutoffs:
    lines += [f'Failed at cutoff {above:g} (halted, or final validation loss above {above:g}): '
              'per variant, the failures at each peak rate, the logistic fit of P(fail) against '
              'ln(rate) and the rate at which half the seeds fail (95% interval, delta method; a '
              'bracket where the grid separates the failures), and its ratio to the baseline\'s:',
              '', '| variant | failed / runs at each rate | half-failure rate (95%) | '
              'ratio to baseline (95%) |', '|---|---|---|---|']
    for key, e in fits(experiment, results, above).items():
      grid = ', '.join(f'{_rate(lr)}: {k}/{n}' for lr, k, n in e['grid'])
      if e['lr50'] is not None:
        lo, hi = e['lr50_interval']
        lr50 = f'{_rate(e["lr50"])} [{_rate(lo)}, {_rate(hi)}]'
      elif e['bracket'] is not None and e['bracket'][1] is None:
        lr50 = f'above {_rate(e["bracket"][0])} (none failed on the grid)'
      elif e['bracket'] is not None and e['bracket'][0] is None:
        lr50 = f'below {_rate(e["bracket"][1])} (all failed on the grid)'
      elif e['bracket'] is not None:
        lr50 = f'between {_rate(e["bracket"][0])} and {_rate(e["bracket"][1])} (separated)'
      else:
        lr50 = '- (no fit)'
      r = e['ratio']
      if r is None:
        ratio = '-'
      elif r['ratio'] is not None:
        ratio = f'{r["ratio"]:.2f} [{r["interval"][0]:.2f}, {r["interval"][1]:.2f}]'
      else:
        lo, hi = r['bounds']
        ratio = (f'above {lo:.2f}' if math.isinf(hi) else f'below {hi:.2f}' if lo == 0 else
                 f'between {lo:.2f} and {hi:.2f}')
      lines.append(f'| {key} | {grid} | {lr50} | {ratio} |')
    lines.append('')
  above = experiment.diverged_above
  lines += [f'Massive activations through training (cutoff {above:g}): the failing runs\' onsets '
            f'(the first evaluation after warm-up {RISE:g} nats above the lowest before it, or the '
            'halt; a failed run without one learnt too slowly rather than diverged), how many '
            'had their largest M-Act by then, and at the rates where some seeds failed and some '
            'trained, the chance that a failing run\'s M-Act at the end of the warm-up is above a '
            'training run\'s (0.5: no foretelling):', '',
            '| variant | failed runs | onsets (step; of the failed runs) | M-Act peaked by onset | '
            'P(failing run\'s warm-up M-Act higher) (pairs) |', '|---|---|---|---|---|']
  for key, e in m_act_course(experiment, results, above).items():
    failed = sum(x['failed'] for x in e['runs'])
    k, n = e['peaked_by_onset']
    onsets = (', '.join(str(s) for s in e['onsets']) or 'none') + f' ({len(e["onsets"])}/{failed})'
    auc = '-' if e['auc'] is None else f'{e["auc"]:.2f} ({e["pairs"]})'
    lines.append(f'| {key} | {failed}/{len(e["runs"])} | {onsets} | {k}/{n} | {auc} |')
  return '\n'.join(lines)


def summary(experiment, results) -> dict:
  cutoffs = [experiment.diverged_above, experiment.second_cutoff]
  courses = m_act_course(experiment, results, experiment.diverged_above)
  for e in courses.values():
    for x in e['runs']:
      x['m_act'] = {str(k): v for k, v in x['m_act'].items()}
  return {'fits': {str(c): fits(experiment, results, c) for c in cutoffs}, 'm_act': courses}


def figure(experiment, results):
  """M-Act (the largest layer's, log scale) against step, a line per run: red where it failed at
  DIVERGED_ABOVE, blue where it trained; one panel per variant; the warm-up's end dotted."""
  courses = m_act_course(experiment, results, experiment.diverged_above)
  fig, axes = figures.new_figure(5.5 * max(1, len(courses)), 4, ncols=max(1, len(courses)))
  for ax, (key, e) in zip(axes, courses.items()):
    for x in e['runs']:
      steps = sorted(x['m_act'])
      if steps:
        ax.plot(steps, [x['m_act'][s] for s in steps], color='C3' if x['failed'] else 'C0',
                alpha=0.35 + 0.5 * (x['learning_rate'] or 0) / max(
                    r['learning_rate'] or 1e-9 for r in e['runs']), lw=1)
    ax.set(yscale='log', xlabel='step', ylabel='M-Act, largest layer',
           title=f'{key}: failed (red) / trained (blue)')
    if results:
      ax.axvline(stability.warmup_steps(results[0]), color='gray', ls=':', lw=1)
  return fig
