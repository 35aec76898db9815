"""Tables: an experiment's results as markdown (mean ± std over seeds, formation counts, long
context) and as summary.json. The statistics are experiments/stats.py's.
"""

import numpy as np

from experiments import rundata, stats
from experiments.rundata import Result


def cell(values: list, fmt: str, per_seed: bool = False) -> str:
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
      lo, hi = stats.wilson_interval(k, n)
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


def runs_cell(results: list[Result]) -> str:
  done = sum(r.status == 'done' for r in results)
  other = sorted({r.status for r in results} - {'done'})
  counts = [f'{sum(r.status == s for r in results)} {s}' for s in other]
  spiking = [r.runner['ended_spiking'] for r in results
             if r.status == 'done' and r.runner.get('ended_spiking') is not None]
  if spiking:  # trained to the end, ended spiking: analysed at the last calm checkpoint
    counts.append(f'{len(spiking)} ended spiking, analysed at step '
                  f'{", ".join(str(s) for s in spiking)}')
  return f'{done}/{len(results)}' + (f' ({", ".join(counts)})' if counts else '')


def table(experiment, results: list[Result]) -> str:
  """Markdown: one row per group, each column's mean ± std (sample std) over its seeds."""
  heads = ['run', 'seeds done'] + [rundata.METRICS[c][0] for c in experiment.columns]
  lines = ['| ' + ' | '.join(heads) + ' |', '|' + '---|' * len(heads)]
  for group, rs in rundata.by_group(experiment, results).items():
    done = [r for r in rs if r.status == 'done']
    cells = [cell([rundata.METRICS[c][1](r) for r in done], rundata.METRICS[c][2],
                  c in experiment.per_seed)
             for c in experiment.columns]
    lines.append('| ' + ' | '.join([group, runs_cell(rs)] + cells) + ' |')
  return '\n'.join(lines)


def summary(experiment, results: list[Result]) -> dict:
  """JSON: per group, every metric's per-seed values, mean and std."""
  out = {}
  for group, rs in rundata.by_group(experiment, results).items():
    done = [r for r in rs if r.status == 'done']
    entry = {'runs': {r.run.name: r.status for r in rs}}
    for name, (_, get, _) in rundata.METRICS.items():
      values = [get(r) for r in done]
      entry[name] = {'values': values}
      kept = [v for v in values if v is not None]
      if kept and (rundata.METRICS[name][2] in ('count', 'mode', 'layer_count')
                   or rundata.METRICS[name][2].startswith('=')):
        entry[name]['cell'] = cell(kept, rundata.METRICS[name][2])
      elif kept:
        arr = np.asarray(kept, float)
        entry[name].update(mean=np.mean(arr, axis=0).tolist(),
                           std=(np.std(arr, axis=0, ddof=1) if len(kept) > 1
                                else np.zeros_like(arr[0])).tolist())
    out[group] = entry
  return out


def formation_counts(experiment, results: list[Result]) -> dict:
  """Per group: the analysed runs that ended with validation loss below FORMED_BELOW (`formed`
  of `runs`, their `seeds`), the rate's 95% Wilson `interval`, each analysed seed's first
  evaluation below it (`formed_at`, None: none), and Fisher's exact test (two-sided) of the
  count against the first group's (`fisher_p`; None for the first group)."""
  t, out, first = experiment.formed_below, {}, None
  for group, rs in rundata.by_group(experiment, results).items():
    analysed = [r for r in rs if rundata.formed(r, t) is not None]
    formed = [r for r in analysed if rundata.formed(r, t)]
    k, n = len(formed), len(analysed)
    p = None
    if first is None:
      first = (k, n)
    else:
      p = stats.fisher_exact(first[0], first[1], k, n)
    out[group] = {'formed': k, 'runs': n, 'seeds': [r.run.seed for r in formed],
                  'interval': list(stats.wilson_interval(k, n)), 'fisher_p': p,
                  'formed_at': {str(r.run.seed): rundata.formed_at(r.rows, t) for r in analysed}}
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
    for group, rs in rundata.by_group(experiment, results).items():
      lines.append(_long_context_row(group, rs, label, len(buckets), lengths))
      if experiment.formed_below is not None:  # the comparison the paper makes: formed runs only
        formed = [r for r in rs if rundata.formed(r, experiment.formed_below)]
        seeds = ', '.join(f's{r.run.seed}' for r in formed) or 'none'
        lines.append(_long_context_row(f'{group}, formed ({seeds})', formed, label, len(buckets),
                                       lengths))
    out.append('\n'.join(lines))
  return '\n\n'.join(out)


def _long_context_row(name: str, rs: list[Result], label: str, n_buckets: int, lengths) -> str:
  done = [r.long_context.get(label) for r in rs if r.long_context.get(label)]
  loss = [cell([d['loss']['buckets'][i]['loss'] for d in done], '.3f') for i in range(n_buckets)]
  ruler = [cell([None if rundata.ruler_mean(d, n) is None else 100 * rundata.ruler_mean(d, n)
                  for d in done], '.0f' if len(done) > 1 else '.1f', per_seed=True)
           for n in lengths]  # each seed's, too: retrieval is often all or nothing
  return '| ' + ' | '.join([name, f'{len(done)}/{len(rs)}'] + loss + ruler) + ' |'
