"""The stability analysis (STABILITY = True): per variant and learning rate, the runs that failed
to train, their spikes and the losses of those that trained; its table and its figure.
"""

import numpy as np
from matplotlib.figure import Figure

from experiments import figures, rundata, stats, tables
from experiments.rundata import Result
from gated_attention.analysis import metrics as metrics_lib


def learning_rate(run) -> float | None:
  lr = dict(run.overrides).get('train.learning_rate')
  return None if lr is None else float(lr)


def without_learning_rate(run, point: str) -> str:
  """`point` (a group name less its variant) without the learning rate's label
  (spec._label's form)."""
  lr = dict(run.overrides).get('train.learning_rate')
  return point if lr is None else point.replace(f'_learning_rate={_flag(lr)}', '')


def diverged(res: Result, above: float | None = None) -> bool | None:
  """Whether a run failed to train: the guard halted it (status 'diverged': a sustained loss
  spike or non-finite steps in a row, training/stability.py), or it finished with a final
  validation loss above `above` (None: only halts count), e.g. the corpus's unigram entropy, the
  loss of a model that learnt nothing but the token frequencies. None: not finished."""
  if res.status == 'diverged':
    return True
  if res.status != 'done':
    return None
  loss = rundata.from_report('loss')(res)
  return bool(above is not None and loss is not None and loss > above)


def warmup_steps(res: Result) -> int:
  """The run's train.warmup_steps: its override, else its saved config's (0 if unreadable)."""
  steps = dict(res.run.overrides).get('train.warmup_steps')
  if steps is None:
    config = res.report and res.report.get('config')
    steps = ((config or {}).get('train') or {}).get('warmup_steps', 0)
  return int(steps)


def _spikes(res: Result, after: int | None = None) -> int:
  """The guard's spike steps of a run, from its rows (a halted run's too: no analysis needed);
  with `after`, only those at a later step."""
  if after is None:
    return metrics_lib.stability(res.rows)['spikes']
  return sum(s > after for s in metrics_lib.stability(res.rows)['spike_steps'])


def failures(experiment, results: list[Result], above: float | None = None) -> dict:
  """Per group (one variant at one learning rate): the finished runs that failed to train
  (`diverged` of `runs`: `halted` by the guard, `collapsed` above DIVERGED_ABOVE), the rate's 95%
  Wilson `interval`, Fisher's exact test (two-sided) against the baseline's count at the same
  point and learning rate (`fisher_p`; None for the baseline, or where there is none), each
  finished run's spike steps (`spikes`, by seed) and the final validation loss of the runs that
  trained (`trained_loss`, by seed). `above`: another cutoff than DIVERGED_ABOVE; with
  SPIKES_AFTER_WARMUP only the spike steps after each run's warm-up count."""
  above = experiment.diverged_above if above is None else above
  groups, out = rundata.by_group(experiment, results), {}
  after = warmup_steps if experiment.spikes_after_warmup else lambda r: None
  for group, rs in groups.items():
    finished = [r for r in rs if diverged(r, above) is not None]
    failed = [r for r in finished if diverged(r, above)]
    variant = rs[0].run.variant
    out[group] = {
        'variant': variant, 'point': group[len(variant):],
        'variant_point': variant + without_learning_rate(rs[0].run, group[len(variant):]),
        'learning_rate': learning_rate(rs[0].run), 'diverged': len(failed), 'runs': len(finished),
        'halted': sum(r.status == 'diverged' for r in failed),
        'collapsed': sum(r.status == 'done' for r in failed),
        'seeds': [r.run.seed for r in failed],
        'interval': list(stats.wilson_interval(len(failed), len(finished))),
        'spikes': {str(r.run.seed): _spikes(r, after(r)) for r in finished},
        'trained_loss': {str(r.run.seed): rundata.from_report('loss')(r) for r in finished
                         if not diverged(r, above)}}
  for c in out.values():
    base = next((b for b in out.values() if b['variant'] == 'baseline'
                 and b['point'] == c['point']), None)
    c['fisher_p'], c['gap'] = None, None
    if base is not None and c['variant'] != 'baseline':
      c['gap'] = paired_gap(base['trained_loss'], c['trained_loss'])
    if base is not None and c['variant'] != 'baseline' and base['runs'] and c['runs']:
      c['fisher_p'] = stats.fisher_exact(base['diverged'], base['runs'], c['diverged'], c['runs'])
  return out


def paired_gap(base: dict, other: dict) -> dict | None:
  """The baseline's final loss minus the variant's, paired by seed over the seeds at which both
  trained (dicts seed -> loss): `mean`, its 95% t `interval` (None with one pair), `n`, and
  `lower` (the pairs in which the variant's loss is the lower). None without a pair."""
  d = stats.paired(base, other)
  return None if d is None else {k: d[k] for k in ('mean', 'interval', 'n', 'lower')}


def largest_stable(counts: dict) -> dict:
  """Per variant and point (the group name without its learning rate): the largest learning rate
  at which every finished seed trained (`largest`; None: none did), the smallest at which some
  seed failed (`first_failure`), and whether every rate below `largest` trained on every seed
  too (`monotone`)."""
  out = {}
  for c in counts.values():
    if c['learning_rate'] is None or not c['runs']:
      continue
    out.setdefault(c['variant_point'], []).append((c['learning_rate'], c['diverged']))
  result = {}
  for key, rates in out.items():
    rates.sort()
    ok = [lr for lr, k in rates if k == 0]
    bad = [lr for lr, k in rates if k > 0]
    largest = max(ok) if ok else None
    result[key] = {'largest': largest, 'first_failure': min(bad) if bad else None,
                   'monotone': largest is None or all(k == 0 for lr, k in rates if lr <= largest)}
  return result


def _flag(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def table(experiment, results: list[Result]) -> str:
  """Markdown of counts (a row per group) and largest_stable (a row per variant)."""
  above = experiment.diverged_above
  what = ('halted by the guard' + (f', or final validation loss above {above:g}'
                                   if above is not None else ''))
  lines = [f'Failed to train ({what}), per variant and learning rate, with the rate\'s 95% '
           'Wilson interval and Fisher\'s exact test (two-sided) against the baseline at the same '
           'learning rate; spike steps per finished run (the guard\'s, by seed); final validation '
           'loss of the runs that trained (mean ± std, by seed), and the baseline\'s minus the '
           'variant\'s, paired by seed over the seeds at which both trained (mean, 95% t '
           'interval; the pairs in which the variant is lower):', '',
           '| run | failed | halted, collapsed | 95% interval | Fisher p vs baseline | '
           'spike steps per run | final loss of the runs that train | baseline - run, paired |',
           '|---|---|---|---|---|---|---|---|']
  counts = failures(experiment, results)
  for group, c in counts.items():
    lo, hi = c['interval']
    p = '-' if c['fisher_p'] is None else format(c['fisher_p'], '.3f')
    spikes = list(c['spikes'].values())
    spike_cell = (tables.cell(spikes, '.1f') + ' (' + ', '.join(f's{s} {v}' for s, v in
                                                           c['spikes'].items()) + ')'
                  if spikes else '-')
    losses = list(c['trained_loss'].values())
    loss_cell = (tables.cell(losses, '.3f') + ' (' + ', '.join(
        f's{s} {"-" if v is None else format(v, ".3f")}' for s, v in c['trained_loss'].items())
                 + ')' if losses else '-')
    gap = c['gap']
    gap_cell = '-' if gap is None else (
        f'{gap["mean"]:+.3f}' + ('' if gap['interval'] is None else
                                 ' [{:+.3f}, {:+.3f}]'.format(*gap['interval']))
        + f' ({gap["lower"]}/{gap["n"]} lower)')
    lines.append(f'| {group} | {c["diverged"]}/{c["runs"]} | {c["halted"]}, {c["collapsed"]} | '
                 f'[{lo:.2f}, {hi:.2f}] | {p} | {spike_cell} | {loss_cell} | {gap_cell} |')
  lines += ['', 'The largest learning rate at which every seed trained, per variant; the smallest '
            'at which some seed failed:', '',
            '| variant | largest that trains on every seed | smallest with a failure |',
            '|---|---|---|']
  for key, s in largest_stable(counts).items():
    largest = '-' if s['largest'] is None else format(s['largest'], 'g')
    if not s['monotone']:
      largest += ' (a lower rate failed)'
    first = '-' if s['first_failure'] is None else format(s['first_failure'], 'g')
    lines.append(f'| {key} | {largest} | {first} |')
  return '\n'.join(lines)


FIGURE = 'stability.png'


def figure(experiment, results: list[Result]) -> Figure:
  """Per variant (and point), against the peak learning rate (log scale): the share of runs
  that failed to train with its 95% Wilson interval (left), and the final validation loss of
  the runs that trained, each seed a dot and the mean a line (right)."""
  counts = failures(experiment, results)
  series = {}
  for c in counts.values():
    if c['learning_rate'] is not None and c['runs']:
      series.setdefault(c['variant_point'], []).append(c)
  fig, axes = figures.new_figure(11, 4, ncols=2)
  for i, (name, cs) in enumerate(series.items()):
    cs = sorted(cs, key=lambda c: c['learning_rate'])
    lrs = np.asarray([c['learning_rate'] for c in cs])
    shift = lrs * (1 + 0.04 * (i - (len(series) - 1) / 2))   # side by side, not on top
    rate = np.asarray([c['diverged'] / c['runs'] for c in cs])
    lo = np.asarray([c['interval'][0] for c in cs])
    hi = np.asarray([c['interval'][1] for c in cs])
    axes[0].errorbar(shift, rate, yerr=[rate - lo, hi - rate], color=f'C{i % 10}', marker='o',
                     capsize=3, label=name)
    means = [np.mean(list(c['trained_loss'].values())) if c['trained_loss'] else np.nan
             for c in cs]
    axes[1].plot(shift, means, color=f'C{i % 10}', marker='o', label=name)
    for x, c in zip(shift, cs):
      ys = [v for v in c['trained_loss'].values() if v is not None]
      axes[1].scatter([x] * len(ys), ys, s=10, color=f'C{i % 10}', alpha=0.5)
  above = experiment.diverged_above
  if above is not None:
    axes[1].axhline(above, color='gray', ls=':', lw=1, label=f'failure line {above:g}')
  axes[0].set(xscale='log', xlabel='peak learning rate', ylabel='share of runs that failed',
              ylim=(-0.05, 1.05), title='failed to train (95% Wilson interval)')
  axes[1].set(xscale='log', xlabel='peak learning rate', ylabel='final validation loss',
              title='runs that trained: each seed, and the mean')
  for ax in axes:
    if ax.lines:
      ax.legend(fontsize=7)
  return fig
