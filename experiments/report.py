"""An experiment's results: the table (mean ± std over seeds), the figures, the results.md section.
(One file, one concern: everything read back from finished runs into what a reader sees.)

Each run directory holds what main.py writes (config.json, metrics.jsonl, analysis/report.json)
and the runner's runner.json (status, commands, wall times). Nothing here trains or analyses.
"""

import dataclasses
import json
import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments import scaling
from gated_attention import storage
from gated_attention.analysis import metrics as metrics_lib
from gated_attention.analysis import plots
from gated_attention.runs import rundir as runs_lib

RUNNER_FILE = 'runner.json'
FIGURES = ('f_attn_layers.png', 'm_act_layers.png', 'loss_curves.png', 'training_curves.png',
           'seeds.png')
LONG_CONTEXT_FIGURE = 'long_context.png'
EXTENDED_DIR = 'extended'  # a run continued at a longer context (EXTEND), inside the run's dir
SECONDS = ('train_seconds', 'analyze_seconds', 'extend_seconds', 'long_context_seconds')


@dataclasses.dataclass
class Result:
  """What one run left behind; `report` is None until its analysis has run."""
  run: object  # spec.Run
  runner: dict
  report: dict | None
  rows: list[dict]
  long_context: dict = dataclasses.field(default_factory=dict)  # label -> long-context report
  size: dict = dataclasses.field(default_factory=dict)  # scaling.run_size of a finished run

  @property
  def status(self) -> str:
    return self.runner.get('status', 'missing')


def step_arithmetic(rows: list[dict]) -> float:
  """A run's training arithmetic in seconds: its last step times the median step time of its
  train rows (the first row's window, which holds the compile, left out); 0 without rows."""
  train = [r for r in rows if r.get('split') == 'train' and r.get('step_time')]
  if not train:
    return 0.0
  times = sorted(r['step_time'] for r in (train[1:] or train))
  return train[-1]['step'] * times[len(times) // 2]


def _last_train_loss(res: Result):
  losses = [r['loss'] for r in res.rows if r.get('split') == 'train' and r.get('loss') is not None]
  return losses[-1] if losses else None


def _from_report(key, reduce=None):
  def get(res: Result):
    if res.report is None or res.report.get(key) is None:
      return None
    value = res.report[key]
    return reduce(value) if reduce else value
  return get


def _seconds(key):
  return lambda res: res.runner[key] / 60 if res.runner.get(key) is not None else None


SINK_F_ATTN = 0.3  # a run "has a sink" when some layer's F-Attn reaches this (Gu et al. 2025's
                   # threshold for a sink head; uniform causal attention at 128 tokens: 0.035)
_SITE_ORDER = metrics_lib.M_ACT_SITES  # the order in which a layer writes them


def m_act_origin(report: dict, share: float = 0.5) -> dict | None:
  """Where a run's largest activation is born: the first (layer, site) in forward order whose
  max |h| reaches `share` of the run's largest over all layers and sites, with the token there
  (position, and its text when the analysis recorded it). The residual stream then carries it,
  so the paper's M-Act (the layer outputs) shows it at every later layer."""
  m_act, where = report.get('m_act') or {}, report.get('m_act_where') or {}
  sites = [s for s in _SITE_ORDER if s in m_act]
  if not sites:
    return None
  values = [(layer, site, m_act[site][layer]) for layer in range(len(m_act[sites[0]]))
            for site in sites if m_act[site][layer] is not None]
  if not values:
    return None
  peak = max(v for _, _, v in values)
  layer, site, value = next(x for x in values if x[2] >= share * peak)
  w = where.get(site, {})
  token = w['token'][layer] if 'token' in w else None
  text = w['token_text'][layer] if 'token_text' in w else None
  return {'layer': layer, 'site': site, 'value': value, 'peak': peak, 'token': token,
          'token_text': text, 'first_token': token == 0}


def _origin(key):
  def get(res: Result):
    o = m_act_origin(res.report) if res.report else None
    return None if o is None else o[key]
  return get


def _origin_label(res: Result):
  o = m_act_origin(res.report) if res.report else None
  return None if o is None else f'L{o["layer"]} {o["site"]}'


def _m_act_ratio(res: Result):
  """The largest over layers of max |h| / median |h| at the layer output (the paper's M-Act
  site): how far the peak stands out of the layer's typical activation."""
  rep = res.report or {}
  site = metrics_lib.M_ACT_PAPER_SITE
  maxes, medians = (rep.get('m_act') or {}).get(site), (rep.get('m_act_median') or {}).get(site)
  if not maxes or not medians:
    return None
  return max(m / d for m, d in zip(maxes, medians) if m is not None and d)


def _f_attn_max_during(res: Result):
  """The largest F-Attn of any layer at any of the training loop's evaluations: a sink that
  formed and went away shows here and not in the final analysis."""
  values = [max(r['f_attn']) for r in res.rows
            if r.get('split') == 'val' and isinstance(r.get('f_attn'), list) and r['f_attn']]
  return max(values) if values else None


def _has_sink(res: Result):
  f = _from_report('f_attn', max)(res)
  return None if f is None else float(f >= SINK_F_ATTN)


def _sink_layers(res: Result):
  """Per layer, 1.0 where that layer's final F-Attn reaches SINK_F_ATTN: a gate can move the sink
  to a later layer instead of removing it, which the largest-layer count does not show."""
  f = _from_report('f_attn')(res)
  return None if f is None else [float(x is not None and x >= SINK_F_ATTN) for x in f]


def _sink_layer(res: Result):
  """Where the seed's sink is: the layer of its largest F-Attn if that reaches SINK_F_ATTN
  ('none' otherwise)."""
  f = _from_report('f_attn')(res)
  if not f:
    return None
  layer = int(np.argmax([-1.0 if x is None else x for x in f]))
  return f'L{layer}' if f[layer] is not None and f[layer] >= SINK_F_ATTN else 'none'


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """The Wilson score interval (95% for z = 1.96) of a rate k / n: where a formation rate
  measured on n seeds can lie (exact enough at small n, unlike k/n ± z·se)."""
  if n == 0:
    return 0.0, 1.0
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def formed_at(rows: list[dict], threshold: float) -> int | None:
  """The step of a run's first evaluation whose validation loss is below `threshold` (None:
  none is)."""
  return next((r['step'] for r in rows if r.get('split') == 'val'
               and r.get('loss') is not None and r['loss'] < threshold), None)


def _formed(res: Result, threshold: float) -> bool | None:
  """Whether the run formed the capability: its final validation loss (the analysis's) is below
  `threshold` (None: not analysed)."""
  loss = _from_report('loss')(res)
  return None if loss is None else loss < threshold


def formation_counts(experiment, results: list[Result]) -> dict:
  """Per group: the analysed runs that ended with validation loss below FORMED_BELOW (`formed`
  of `runs`, their `seeds`), the rate's 95% Wilson `interval`, each analysed seed's first
  evaluation below it (`formed_at`, None: none), and Fisher's exact test (two-sided) of the
  count against the first group's (`fisher_p`; None for the first group)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  t, out, first = experiment.formed_below, {}, None
  for group, rs in by_group(experiment, results).items():
    analysed = [r for r in rs if _formed(r, t) is not None]
    formed = [r for r in analysed if _formed(r, t)]
    k, n = len(formed), len(analysed)
    p = None
    if first is None:
      first = (k, n)
    else:
      p = float(stats.fisher_exact([[first[0], first[1] - first[0]], [k, n - k]])[1])
    out[group] = {'formed': k, 'runs': n, 'seeds': [r.run.seed for r in formed],
                  'interval': list(wilson_interval(k, n)), 'fisher_p': p,
                  'formed_at': {str(r.run.seed): formed_at(r.rows, t) for r in analysed}}
  return out


def formation(experiment, results: list[Result]) -> str:
  """Markdown of formation_counts: a row per group."""
  lines = [f'Formed: final validation loss below {experiment.formed_below:g}; the first '
           'evaluation below it, by seed (-: none); Fisher\'s exact test (two-sided) of the '
           'count against the first group\'s:', '',
           '| run | formed | 95% interval | first evaluation below | Fisher p |',
           '|---|---|---|---|---|']
  for group, c in formation_counts(experiment, results).items():
    steps = ', '.join(f's{seed} {step or "-"}' for seed, step in c['formed_at'].items())
    p = '-' if c['fisher_p'] is None else format(c['fisher_p'], '.3f')
    lo, hi = c['interval']
    lines.append(f'| {group} | {c["formed"]}/{c["runs"]} | [{lo:.2f}, {hi:.2f}] | '
                 f'{steps or "-"} | {p} |')
  return '\n'.join(lines)


def _learning_rate(run) -> float | None:
  lr = dict(run.overrides).get('train.learning_rate')
  return None if lr is None else float(lr)


def _without_learning_rate(run, point: str) -> str:
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
  loss = _from_report('loss')(res)
  return bool(above is not None and loss is not None and loss > above)


def _spikes(res: Result) -> int:
  """The guard's spike steps of a run, from its rows (a halted run's too: no analysis needed)."""
  return metrics_lib.stability(res.rows)['spikes']


def stability_counts(experiment, results: list[Result]) -> dict:
  """Per group (one variant at one learning rate): the finished runs that failed to train
  (`diverged` of `runs`: `halted` by the guard, `collapsed` above DIVERGED_ABOVE), the rate's 95%
  Wilson `interval`, Fisher's exact test (two-sided) against the baseline's count at the same
  point and learning rate (`fisher_p`; None for the baseline, or where there is none), each
  finished run's spike steps (`spikes`, by seed) and the final validation loss of the runs that
  trained (`trained_loss`, by seed)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  above, groups, out = experiment.diverged_above, by_group(experiment, results), {}
  for group, rs in groups.items():
    finished = [r for r in rs if diverged(r, above) is not None]
    failed = [r for r in finished if diverged(r, above)]
    variant = rs[0].run.variant
    out[group] = {
        'variant': variant, 'point': group[len(variant):],
        'variant_point': variant + _without_learning_rate(rs[0].run, group[len(variant):]),
        'learning_rate': _learning_rate(rs[0].run), 'diverged': len(failed), 'runs': len(finished),
        'halted': sum(r.status == 'diverged' for r in failed),
        'collapsed': sum(r.status == 'done' for r in failed),
        'seeds': [r.run.seed for r in failed],
        'interval': list(wilson_interval(len(failed), len(finished))),
        'spikes': {str(r.run.seed): _spikes(r) for r in finished},
        'trained_loss': {str(r.run.seed): _from_report('loss')(r) for r in finished
                         if not diverged(r, above)}}
  for c in out.values():
    base = next((b for b in out.values() if b['variant'] == 'baseline'
                 and b['point'] == c['point']), None)
    c['fisher_p'], c['gap'] = None, None
    if base is not None and c['variant'] != 'baseline':
      c['gap'] = paired_gap(base['trained_loss'], c['trained_loss'])
    if base is not None and c['variant'] != 'baseline' and base['runs'] and c['runs']:
      c['fisher_p'] = float(stats.fisher_exact(
          [[base['diverged'], base['runs'] - base['diverged']],
           [c['diverged'], c['runs'] - c['diverged']]])[1])
  return out


def paired_gap(base: dict, other: dict) -> dict | None:
  """The baseline's final loss minus the variant's, paired by seed over the seeds at which both
  trained (dicts seed -> loss): `mean`, its 95% t `interval` (None with one pair), `n`, and
  `lower` (the pairs in which the variant's loss is the lower). None without a pair."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  seeds = [s for s in base if s in other and base[s] is not None and other[s] is not None]
  if not seeds:
    return None
  d = np.asarray([base[s] - other[s] for s in seeds], float)
  interval = None
  if len(d) > 1:
    half = stats.t.ppf(0.975, len(d) - 1) * np.std(d, ddof=1) / np.sqrt(len(d))
    interval = [float(d.mean() - half), float(d.mean() + half)]
  return {'mean': float(d.mean()), 'interval': interval, 'n': len(d),
          'lower': int((d > 0).sum())}


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


def stability(experiment, results: list[Result]) -> str:
  """Markdown of stability_counts (a row per group) and largest_stable (a row per variant)."""
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
  counts = stability_counts(experiment, results)
  for group, c in counts.items():
    lo, hi = c['interval']
    p = '-' if c['fisher_p'] is None else format(c['fisher_p'], '.3f')
    spikes = list(c['spikes'].values())
    spike_cell = (_cell(spikes, '.1f') + ' (' + ', '.join(f's{s} {v}' for s, v in
                                                           c['spikes'].items()) + ')'
                  if spikes else '-')
    losses = list(c['trained_loss'].values())
    loss_cell = (_cell(losses, '.3f') + ' (' + ', '.join(
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


STABILITY_FIGURE = 'stability.png'


def stability_figure(experiment, results: list[Result]) -> Figure:
  """Per variant (and point), against the peak learning rate (log scale): the share of runs
  that failed to train with its 95% Wilson interval (left), and the final validation loss of
  the runs that trained, each seed a dot and the mean a line (right)."""
  counts = stability_counts(experiment, results)
  series = {}
  for c in counts.values():
    if c['learning_rate'] is not None and c['runs']:
      series.setdefault(c['variant_point'], []).append(c)
  fig, axes = _figure(11, 4, ncols=2)
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


def _copy_share(res: Result):
  d = (res.report or {}).get('data_description') or {}
  return d.get('trigger_fraction')


# name -> (column heading, value of a Result (float, list for per-layer values, or None), format)
METRICS = {
    'val_loss': ('val loss', _from_report('loss'), '.3f'),
    'ppl': ('PPL', _from_report('ppl'), '.3f'),
    'train_loss': ('final train loss', _last_train_loss, '.3f'),
    'f_attn_mean': ('F-Attn', _from_report('f_attn_mean'), '.3f'),
    'f_attn_max': ('F-Attn max layer', _from_report('f_attn', max), '.3f'),
    'f_attn_layers': ('F-Attn per layer', _from_report('f_attn'), '.2f'),
    'm_act_mean': ('M-Act', _from_report('m_act_mean'), '.1f'),
    'm_act_layers': ('M-Act per layer', _from_report('m_act', lambda m: m['ffn_residual']), '.0f'),
    'gate_score_mean': ('gate score', _from_report('gate_score_mean'), '.3f'),
    # the gate's sparsity: the share of gate scores below 0.1 (Qiu et al. 2025, Fig. 3)
    'gate_sparse': (f'gate scores {metrics_lib.GATE_FRAC_KEY.replace("frac_below_", "< ")}',
                    _from_report('gate', lambda g: g.get(f'{metrics_lib.GATE_FRAC_KEY}_mean')),
                    '.3f'),
    # the guard's spikes as the analysis counts them (metrics.stability, every attempt's rows)
    'loss_spikes': ('loss spikes', _from_report('stability', lambda s: s['spikes']), '.1f'),
    'train_minutes': ('train min', _seconds('train_seconds'), '.1f'),
    # seeds with a sink: some layer's F-Attn >= SINK_F_ATTN (a count over the seeds)
    'sink_seeds': (f'seeds with F-Attn >= {SINK_F_ATTN}', _has_sink, 'count'),
    # the synthetic task's measured share of targets that follow a trigger
    'f_attn_max_during': ('F-Attn max during training', _f_attn_max_during, '.3f'),
    'copy_share': ('copy share', _copy_share, '.3f'),
    # per layer: the seeds whose F-Attn there reaches SINK_F_ATTN, with the rate's 95% interval
    'sink_layers': (f'seeds with F-Attn >= {SINK_F_ATTN}, by layer (95% interval)', _sink_layers,
                    'layer_count'),
    'sink_layer': ('sink layer (largest F-Attn)', _sink_layer, 'mode'),
    # a run's size (experiments/scaling.py): non-embedding parameters, tokens and FLOPs trained
    'params': ('non-embedding params', lambda r: r.size.get('params'), '=,.0f'),
    'train_tokens': ('tokens trained', lambda r: r.size.get('tokens'), '=.3g'),
    'train_flops': ('training FLOPs', lambda r: r.size.get('flops'), '=.3g'),
    # the largest activation: the seeds whose peak is born on the first token (BOS), and where
    'm_act_bos': ('M-Act peak on token 0', _origin('first_token'), 'count'),
    'm_act_origin': ('M-Act peak born at', _origin_label, 'mode'),
    'm_act_ratio': ('M-Act / median', _m_act_ratio, '.0f'),
}


def read_runner(workdir: str) -> dict:
  """The run's runner.json ({} when there is none)."""
  path = storage.join(workdir, RUNNER_FILE)
  if not storage.isfile(path):
    return {}
  return json.loads(storage.read_bytes(path))


def extended_dir(workdir: str) -> str:
  return storage.join(workdir, EXTENDED_DIR)


def read_long_context(workdir: str, label: str) -> dict | None:
  """The --mode=long_context report of `workdir` for the evaluation `label`, if written."""
  return runs_lib.read_long_context(workdir, label)


def read(run, workdir: str, experiment=None) -> Result:
  runner = read_runner(workdir)
  report, long_context, size = None, {}, {}
  if runner.get('status') == 'done':
    report = runs_lib.read_report(workdir)
  if report is not None:
    if experiment is not None and experiment.long_context:
      evaluated = extended_dir(workdir) if experiment.extend else workdir
      long_context = {label: read_long_context(evaluated, label)
                      for label in experiment.long_context}
    if experiment is not None and experiment.scaling:
      size = scaling.run_size(runs_lib.read_config(workdir))
  return Result(run, runner, report, runs_lib.read_metrics(workdir), long_context, size)


def _cell(values: list, fmt: str, per_seed: bool = False) -> str:
  """mean ± std (sample std) of the values that are not None; `fmt` 'count': how many are
  true out of how many; 'mode': each distinct value with its count. `per_seed`: each value
  in seed order after the mean."""
  values = [v for v in values if v is not None]
  if not values:
    return '-'
  if fmt == 'count':
    return f'{int(sum(bool(v) for v in values))}/{len(values)}'
  if fmt.startswith('='):  # one value for the group (a size): shown once, or each if they differ
    distinct = list(dict.fromkeys(values))
    return ' / '.join(format(v, fmt[1:]) for v in distinct)
  if fmt == 'layer_count':  # per-layer 0/1 values: each layer's count and its Wilson interval
    n = len(values)
    cells = []
    for layer, hits in enumerate(zip(*values)):
      k = int(sum(bool(h) for h in hits))
      lo, hi = wilson_interval(k, n)
      cells.append(f'L{layer} {k}/{n} [{lo:.2f}, {hi:.2f}]')
    return ', '.join(cells)
  if fmt == 'mode':
    counts = {v: values.count(v) for v in values}
    return ', '.join(f'{v} ({n}/{len(values)})' for v, n in
                     sorted(counts.items(), key=lambda kv: -kv[1]))
  if isinstance(values[0], list):  # per-layer: the mean over seeds of each layer
    return ' / '.join(format(x, fmt) for x in np.mean(np.asarray(values, float), axis=0))
  mean = format(float(np.mean(values)), fmt)
  if len(values) == 1:
    return mean
  cell = f'{mean} ± {format(float(np.std(values, ddof=1)), fmt)}'
  return cell + f' ({", ".join(format(v, fmt) for v in values)})' if per_seed else cell


def _runs_cell(results: list[Result]) -> str:
  done = sum(r.status == 'done' for r in results)
  other = sorted({r.status for r in results} - {'done'})
  counts = [f'{sum(r.status == s for r in results)} {s}' for s in other]
  spiking = [r.runner['ended_spiking'] for r in results
             if r.status == 'done' and r.runner.get('ended_spiking') is not None]
  if spiking:  # trained to the end, ended spiking: analysed at the last calm checkpoint
    counts.append(f'{len(spiking)} ended spiking, analysed at step '
                  f'{", ".join(str(s) for s in spiking)}')
  return f'{done}/{len(results)}' + (f' ({", ".join(counts)})' if counts else '')


def by_group(experiment, results: list[Result]) -> dict[str, list[Result]]:
  return {g: [r for r in results if r.run.group == g] for g in experiment.groups()}


def table(experiment, results: list[Result]) -> str:
  """Markdown: one row per group, each column's mean ± std (sample std) over its seeds."""
  heads = ['run', 'seeds done'] + [METRICS[c][0] for c in experiment.columns]
  lines = ['| ' + ' | '.join(heads) + ' |', '|' + '---|' * len(heads)]
  for group, rs in by_group(experiment, results).items():
    done = [r for r in rs if r.status == 'done']
    cells = [_cell([METRICS[c][1](r) for r in done], METRICS[c][2], c in experiment.per_seed)
             for c in experiment.columns]
    lines.append('| ' + ' | '.join([group, _runs_cell(rs)] + cells) + ' |')
  return '\n'.join(lines)


def summary(experiment, results: list[Result]) -> dict:
  """JSON: per group, every metric's per-seed values, mean and std."""
  out = {}
  for group, rs in by_group(experiment, results).items():
    done = [r for r in rs if r.status == 'done']
    entry = {'runs': {r.run.name: r.status for r in rs}}
    for name, (_, get, _) in METRICS.items():
      values = [get(r) for r in done]
      entry[name] = {'values': values}
      kept = [v for v in values if v is not None]
      if kept and (METRICS[name][2] in ('count', 'mode', 'layer_count')
                   or METRICS[name][2].startswith('=')):
        entry[name]['cell'] = _cell(kept, METRICS[name][2])
      elif kept:
        arr = np.asarray(kept, float)
        entry[name].update(mean=np.mean(arr, axis=0).tolist(),
                           std=(np.std(arr, axis=0, ddof=1) if len(kept) > 1
                                else np.zeros_like(arr[0])).tolist())
    out[group] = entry
  return out


def _figure(width: float, height: float, ncols: int = 1):
  fig = Figure(figsize=(width, height), layout='constrained')
  FigureCanvasAgg(fig)
  return fig, np.atleast_1d(fig.subplots(1, ncols))


def _band(ax, x, values, color, label, marker=None):
  """The mean of `values` [seeds, len(x)] with a ±1 std band (none for a single seed)."""
  v = np.asarray(values, float)
  mean = np.nanmean(v, axis=0)
  ax.plot(x, mean, color=color, marker=marker, label=f'{label} (n={len(v)})')
  if len(v) > 1:
    std = np.nanstd(v, axis=0, ddof=1)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, lw=0)


def per_layer_figure(experiment, results, metric: str, ylabel: str, log: bool = False) -> Figure:
  """One line per group: the per-layer `metric` (f_attn_layers, m_act_layers) over seeds."""
  fig, (ax,) = _figure(7, 4)
  seq_lens = set()
  for i, (group, rs) in enumerate(by_group(experiment, results).items()):
    values = [METRICS[metric][1](r) for r in rs if r.status == 'done']
    values = [[np.nan if x is None else x for x in v] for v in values if v is not None]
    seq_lens |= {r.report['seq_len'] for r in rs if r.report}
    if values and len({len(v) for v in values}) == 1:
      _band(ax, np.arange(len(values[0])), values, f'C{i % 10}', group, marker='o')
  if metric == 'f_attn_layers' and len(seq_lens) == 1:
    ax.axhline(metrics_lib.uniform_causal_f_attn(seq_lens.pop()), color='gray', ls=':',
               label='uniform causal attention')
  ax.set(xlabel='layer', ylabel=ylabel, title=f'{experiment.name}: {ylabel} (mean ± std)')
  if log:
    ax.set_yscale('log')
  if metric == 'f_attn_layers':
    ax.set_ylim(0, 1)
  ax.xaxis.get_major_locator().set_params(integer=True)
  if ax.lines:
    ax.legend(fontsize=7)
  return fig


def _curve(rows, split):
  return {r['step']: r['loss'] for r in rows
          if r.get('split') == split and r.get('loss') is not None}


def loss_figure(experiment, results) -> Figure:
  """Train and validation loss against step, mean ± std over each group's seeds."""
  fig, axes = _figure(11, 4, ncols=2)
  for ax, split in zip(axes, ('train', 'val')):
    for i, (group, rs) in enumerate(by_group(experiment, results).items()):
      curves = [_curve(r.rows, split) for r in rs if r.rows]
      steps = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
      if steps:
        _band(ax, steps, [[c[s] for s in steps] for c in curves], f'C{i % 10}', group,
              marker='o' if split == 'val' else None)
    ax.set(xlabel='step', ylabel='loss (nats/token)', title=f'{split} loss (mean ± std)')
    if ax.lines:
      ax.legend(fontsize=7)
  return fig


def _val_curve(rows, get):
  return {r['step']: get(r) for r in rows if r.get('split') == 'val' and get(r) is not None}


def _train_curve(rows, key):
  return {r['step']: r[key] for r in rows if r.get('split') == 'train' and r.get(key) is not None}


def training_curves_figure(experiment, results) -> Figure:
  """Over the training steps, mean ± std over each group's seeds: the largest layer's F-Attn
  and M-Act (the training loop's evaluations) and the parameter norm (its train rows): when a
  sink forms or fades, and whether the largest activation grows with the weights."""
  f_attn = lambda r: max(r['f_attn']) if isinstance(r.get('f_attn'), list) and r['f_attn'] else None  # noqa: E731
  m_act = lambda r: max(r['m_act']) if isinstance(r.get('m_act'), list) and r['m_act'] else None  # noqa: E731
  panels = [('F-Attn, largest layer', lambda rows: _val_curve(rows, f_attn), False),
            ('M-Act, largest layer', lambda rows: _val_curve(rows, m_act), True),
            ('parameter norm', lambda rows: _train_curve(rows, 'param_norm'), False)]
  fig, axes = _figure(15, 4, ncols=3)
  for ax, (title, curve, log) in zip(axes, panels):
    for i, (group, rs) in enumerate(by_group(experiment, results).items()):
      curves = [c for c in (curve(r.rows) for r in rs if r.rows) if c]
      steps = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
      if steps:
        _band(ax, steps, [[c[s] for s in steps] for c in curves], f'C{i % 10}', group,
              marker='o' if len(steps) < 30 else None)
    ax.set(xlabel='step', title=f'{title} (mean ± std)')
    if log and ax.lines:
      ax.set_yscale('log')
    if ax.lines and len(ax.lines) <= 12:
      ax.legend(fontsize=6)
  return fig


def seeds_figure(experiment, results) -> Figure:
  """Every seed of every group as a dot: the largest layer's F-Attn (with the sink threshold)
  and M-Act of its analysis, so a group's spread, and a group split between seeds with and
  without a sink, show at a glance."""
  groups = by_group(experiment, results)
  fig, axes = _figure(max(7.0, 0.32 * len(groups) + 2), 6.5, ncols=1)
  fig.clear()
  axes = fig.subplots(2, 1, sharex=True)
  x = np.arange(len(groups))
  for ax, (metric, label, log) in zip(axes, (('f_attn_max', 'F-Attn, largest layer', False),
                                            ('m_act_mean', 'M-Act', True))):
    for i, rs in enumerate(groups.values()):
      values = [METRICS[metric][1](r) for r in rs if r.status == 'done']
      values = [v for v in values if v is not None]
      if values:
        jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
        ax.scatter(i + np.asarray(jitter), values, s=14, color=f'C{i % 10}', zorder=3)
    if metric == 'f_attn_max':
      ax.axhline(SINK_F_ATTN, color='gray', ls=':', lw=1, label=f'sink threshold {SINK_F_ATTN}')
      ax.set_ylim(-0.02, 1.0)
      ax.legend(fontsize=7, loc='upper right')
    if log:
      ax.set_yscale('log')
    ax.set(ylabel=label)
    ax.grid(axis='x', color='0.9')
  axes[-1].set_xticks(x, list(groups), rotation=75, ha='right', fontsize=7)
  axes[0].set_title(f'{experiment.name}: each seed\'s analysis')
  return fig


def _ruler_mean(rep: dict, length) -> float | None:
  """The mean exact match over the tasks that fit at `length` (None if none did)."""
  acc = [a[str(length)] for a in rep['ruler'].values() if a.get(str(length)) is not None]
  return float(np.mean(acc)) if acc else None


def long_context_tables(experiment, results: list[Result]) -> str:
  """Markdown, one table per LONG_CONTEXT label: per group, the loss in each position bucket and
  the RULER-style exact match (mean over the tasks that fit) at each length, mean ± std (the
  exact match with each seed's value after it)."""
  out = []
  for label in experiment.long_context:
    reps = [r.long_context.get(label) for r in results]
    some = next((x for x in reps if x), None)
    if some is None:
      out.append(f'Long context, `{label}`: no evaluation has finished.')
      continue
    lengths, buckets = some['lengths'], [(b['from'], b['to']) for b in some['loss']['buckets']]
    retrieval = (some.get('retrieval') or {}).get('task')  # a synthetic task's own (mqar)
    heads = (['run', 'seeds'] + [f'loss {a}-{b}' for a, b in buckets] +
             [f'{retrieval or "RULER"} {n}' for n in lengths])
    what = (f'{retrieval}: % of the answers exact (teacher-forced greedy), '
            f'{some["examples_per_cell"]} held-out documents a length' if retrieval else
            f'RULER: % exact match, mean over the tasks that fit, {some["examples_per_cell"]} '
            'prompts a task and length')
    lines = [f'Long context, `{label}` ({some["rope_tag"]}; evaluated at step {some["step"]} of '
             f'the run trained at {some["train_seq_len"]} tokens; {what}):', '',
             '| ' + ' | '.join(heads) + ' |', '|' + '---|' * len(heads)]
    for group, rs in by_group(experiment, results).items():
      lines.append(_long_context_row(group, rs, label, len(buckets), lengths))
      if experiment.formed_below is not None:  # the comparison the paper makes: formed runs only
        formed = [r for r in rs if _formed(r, experiment.formed_below)]
        seeds = ', '.join(f's{r.run.seed}' for r in formed) or 'none'
        lines.append(_long_context_row(f'{group}, formed ({seeds})', formed, label, len(buckets),
                                       lengths))
    out.append('\n'.join(lines))
  return '\n\n'.join(out)


def _long_context_row(name: str, rs: list[Result], label: str, n_buckets: int, lengths) -> str:
  done = [r.long_context.get(label) for r in rs if r.long_context.get(label)]
  loss = [_cell([d['loss']['buckets'][i]['loss'] for d in done], '.3f') for i in range(n_buckets)]
  ruler = [_cell([None if _ruler_mean(d, n) is None else 100 * _ruler_mean(d, n)
                  for d in done], '.0f' if len(done) > 1 else '.1f', per_seed=True)
           for n in lengths]  # each seed's, too: retrieval is often all or nothing
  return '| ' + ' | '.join([name, f'{len(done)}/{len(rs)}'] + loss + ruler) + ' |'


def long_context_figure(experiment, results: list[Result]) -> Figure:
  """Per LONG_CONTEXT label: loss by position (top) and RULER exact match by length (bottom),
  one line per group, mean ± std over seeds (with FORMED_BELOW: over the formed runs alone, the
  comparison the tables' 'formed' rows make)."""
  labels = list(experiment.long_context)
  fig = Figure(figsize=(5 * len(labels), 7), layout='constrained')
  FigureCanvasAgg(fig)
  axes = np.asarray(fig.subplots(2, len(labels), squeeze=False))
  groups = by_group(experiment, results)
  if experiment.formed_below is not None:
    groups = {f'{g}, formed': [r for r in rs if _formed(r, experiment.formed_below)]
              for g, rs in groups.items()}
  for j, label in enumerate(labels):
    for i, (group, rs) in enumerate(groups.items()):
      done = [r.long_context[label] for r in rs if r.long_context.get(label)]
      if not done:
        continue
      pos = np.maximum(done[0]['loss']['curve']['position'], 1)
      _band(axes[0, j], pos, [d['loss']['curve']['loss'] for d in done], f'C{i % 10}', group)
      lengths = [n for n in done[0]['lengths'] if any(_ruler_mean(d, n) is not None
                                                      for d in done)]  # where a task fits
      acc = [[np.nan if _ruler_mean(d, n) is None else 100 * _ruler_mean(d, n) for n in lengths]
             for d in done]
      if lengths:
        _band(axes[1, j], lengths, acc, f'C{i % 10}', group, marker='o')
        axes[1, j].set_xscale('log', base=2)
        axes[1, j].set_xticks(lengths, [str(n) for n in lengths])   # the evaluated lengths only
        axes[1, j].minorticks_off()
      axes[0, j].axvline(done[0]['train_seq_len'], color='gray', ls=':', lw=1)
    axes[0, j].set(xscale='log', xlabel='position', ylabel='loss (nats/token)',
                   title=f'{label}: loss by position')
    some = next((r.long_context[label] for r in results if r.long_context.get(label)), {})
    retrieval = (some.get('retrieval') or {}).get('task')
    axes[1, j].set(xlabel='prompt length (tokens)', ylabel='exact match (%)', ylim=(-2, 102),
                   title=f'{label}: ' + (f'{retrieval} retrieval' if retrieval else
                                         'RULER-style tasks'))
    for ax in axes[:, j]:
      if ax.lines:
        ax.legend(fontsize=7)
  return fig


def figure_names(experiment) -> tuple[str, ...]:
  return (FIGURES + ((LONG_CONTEXT_FIGURE,) if experiment.long_context else ())
          + ((scaling.FIGURE,) if experiment.scaling else ())
          + ((STABILITY_FIGURE,) if experiment.stability else ()))


def write(experiment, results: list[Result], out_dir: str, header: str) -> str:
  """Writes results.md, summary.json and the figures into out_dir; returns the markdown."""
  storage.makedirs(out_dir)
  figures = {'f_attn_layers.png': per_layer_figure(experiment, results, 'f_attn_layers',
                                                   'F-Attn (attention to token 0)'),
             'm_act_layers.png': per_layer_figure(experiment, results, 'm_act_layers',
                                                  'M-Act (max |h|, layer output)', log=True),
             'loss_curves.png': loss_figure(experiment, results),
             'training_curves.png': training_curves_figure(experiment, results),
             'seeds.png': seeds_figure(experiment, results)}
  if experiment.long_context:
    figures[LONG_CONTEXT_FIGURE] = long_context_figure(experiment, results)
  if experiment.scaling:
    figures[scaling.FIGURE] = scaling.figure(results)
  if experiment.stability:
    figures[STABILITY_FIGURE] = stability_figure(experiment, results)
  for name, fig in figures.items():
    plots.save(fig, storage.join(out_dir, name))
  summary_json = summary(experiment, results)
  if experiment.formed_below is not None:
    summary_json['_formed'] = formation_counts(experiment, results)
  if experiment.stability:
    counts = stability_counts(experiment, results)
    summary_json['_stability'] = {'groups': counts, 'largest_stable': largest_stable(counts)}
  if experiment.scaling:
    summary_json['_scaling'] = {'fits': scaling.fits(results), 'gaps': scaling.gaps(results)}
  storage.write(storage.join(out_dir, 'summary.json'), json.dumps(summary_json, indent=1))
  text = f'{header}\n\n{table(experiment, results)}\n'
  if experiment.formed_below is not None:
    text += f'\n{formation(experiment, results)}\n'
  if experiment.stability:
    text += f'\n{stability(experiment, results)}\n'
  if experiment.long_context:
    text += f'\n{long_context_tables(experiment, results)}\n'
  if experiment.scaling:
    text += f'\nScaling (experiments/scaling.py):\n\n{scaling.tables(results)}\n'
  storage.write(storage.join(out_dir, 'results.md'),
                f'# {experiment.title}\n\n{text}\n' +
                ''.join(f'![{n}]({n})\n' for n in figure_names(experiment)))
  return text


def update_section(path: str, name: str, body: str):
  """Replaces the section of experiment `name` in the markdown file `path`, or appends it."""
  start, end = f'<!-- experiment:{name} -->', f'<!-- /experiment:{name} -->'
  section = f'{start}\n{body.rstrip()}\n{end}\n'
  text = open(path).read() if os.path.isfile(path) else '# Results\n\n'
  if start in text and end in text:
    head, rest = text.split(start, 1)
    text = head + section + rest.split(end, 1)[1].lstrip('\n')
  else:
    text = text.rstrip('\n') + '\n\n' + section
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)
