"""What a sink-free model buys at inference (issue 53): the streaming and quantization tables of
an experiment's runs, with intervals paired by seed.

  python -m experiments.run experiments/inference_sink.py --out OUT         # trains, streams
  python -m experiments.inference experiments/inference_sink.py --out OUT   # quantizes, tables
  python -m experiments.inference experiments/inference_sink.py --out OUT --results docs/results.md

The experiment file's runs are trained and evaluated by the runner (its LONG_CONTEXT labels:
`full`, `window` and `sinks`, each a --mode=long_context of the run); this script runs those
evaluations on a finished run that lacks them (one trained by another experiment file with the
same commands, e.g. sink_gates.py's), and `main.py --mode=quantization` on every finished run
that lacks it (the file's QUANTIZATION overrides), reads the reports and writes OUT/inference.md, OUT/inference.json and
OUT/streaming.png (with --results, the section `<name>_inference` of that file, the figure in
docs/figures/<name>/).

Defined before the runs (the streaming measurements):
  * the comparison bucket: positions [W + S, T) of the held-out documents, where W + S is the
    windowed caches' size and T the training length: the beginning is evicted from the window,
    and the full cache is still within the trained positions (so it is the reference);
  * the streaming penalty of a cache: its loss there minus the full cache's (nats a token);
  * collapse: a window-only penalty larger than half of what separates the full cache from
    guessing, penalty > (ln V - loss of the full cache) / 2 (V the vocabulary): StreamingLLM's
    "perplexity explodes", made a threshold that does not depend on the task's loss level;
  * beyond the training length (positions >= T) the full cache runs on positions it never
    trained on, so there the window is compared with the window with sinks.
Quantization: the increase of each setting over the float model on the same held-out batches.
Every difference between variants is the baseline's minus the variant's, paired by seed (a seed
fixes both runs' initialisation and data), with its 95% t interval (experiments/stats.py paired)
and the smallest true difference the t-test over those pairs finds with 80% power (stats.
t_detectable, from the differences' observed spread): what the seeds could have detected.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np

from experiments import rundata, running, sections, spec, stats
from gated_attention import storage
from gated_attention.runs import rundir as runs_lib

LABELS = ('full', 'window', 'sinks')
COLORS = {'full': 'black', 'window': 'tab:red', 'sinks': 'tab:blue'}


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m experiments.inference', description=__doc__.split(
      '\n')[0])
  p.add_argument('experiment', help='an experiment file with LONG_CONTEXT full / window / sinks')
  p.add_argument('--out', required=True, help='the runner\'s output directory of its runs')
  p.add_argument('--results', help='also write the section into this markdown file')
  p.add_argument('--only', default='', help='comma-separated run names: evaluate only these '
                 '(several processes side by side, each on its own runs)')
  p.add_argument('--tables-only', action='store_true',
                 help='run no evaluation; tabulate what the runs have')
  return p.parse_args(argv)


def _main_py(args: list[str], log: str) -> int:
  with open(log, 'a') as f:
    return subprocess.call([sys.executable] + args, cwd=spec.REPO, stdout=f,
                           stderr=subprocess.STDOUT)


def _finished_runs(experiment, out: str, only=()):
  """(run, its directory) of each run whose training is done (`only`: of these runs)."""
  for run in experiment.runs:
    if only and run.name not in only:
      continue
    workdir = running.run_dir(out, run)
    if rundata.read_runner(workdir).get('status') == 'done':
      yield run, workdir


def stream(experiment, out: str, only=()):
  """The LONG_CONTEXT evaluations (--mode=long_context) a finished run lacks (`only`: of these
  runs)."""
  cache = storage.join(out, 'xla_cache')
  for run, workdir in _finished_runs(experiment, out, only):
    for label in experiment.long_context:
      if rundata.read_long_context(workdir, label) is None:
        print(f'{run.name}: --mode=long_context ({label})', flush=True)
        rc = _main_py(running.cached(experiment.long_context_args(workdir, label), cache),
                      os.path.join(workdir, 'long_context.log'))
        if rc:
          print(f'{run.name}: --mode=long_context failed (exit {rc}); see '
                f'{workdir}/long_context.log', flush=True)


def quantize(experiment, out: str, only=()):
  """--mode=quantization of every finished run without RUN/quantization/report.json (`only`:
  of these runs)."""
  cache = storage.join(out, 'xla_cache')
  for run, workdir in _finished_runs(experiment, out, only):
    if storage.isfile(storage.join(runs_lib.quantization_dir(workdir), runs_lib.REPORT_FILE)):
      continue
    args = running.cached(experiment.quantization_args(workdir), cache)
    print(f'{run.name}: --mode=quantization', flush=True)
    rc = _main_py(args, os.path.join(workdir, 'quantization.log'))
    if rc:
      print(f'{run.name}: --mode=quantization failed (exit {rc}); see '
            f'{workdir}/quantization.log', flush=True)


def read_run(workdir: str) -> dict | None:
  """One run's reports: analysis, the long-context labels, quantization; None if unfinished."""
  if rundata.read_runner(workdir).get('status') != 'done':
    return None
  lc = {label: rundata.read_long_context(workdir, label) for label in LABELS}
  if any(v is None for v in lc.values()):
    return None
  qpath = storage.join(runs_lib.quantization_dir(workdir), runs_lib.REPORT_FILE)
  quant = json.loads(storage.read_bytes(qpath)) if storage.isfile(qpath) else None
  analysis = json.loads(storage.read_bytes(storage.join(workdir, 'analysis', 'report.json')))
  config = json.loads(storage.read_bytes(storage.join(workdir, 'config.json')))
  return {'lc': lc, 'quant': quant, 'analysis': analysis, 'config': config}


def measures(r: dict) -> dict:
  """The numbers of one run that the tables pool: bucket losses per label, penalties, collapse,
  quantization increases, linear-input outliers."""
  lc = r['lc']
  window = lc['window']['cache']
  size = window['window'] + window['sinks']
  train_len = int(lc['full']['train_seq_len'])
  buckets = {label: {(b['from'], b['to']): b['loss'] for b in lc[label]['loss']['buckets']}
             for label in LABELS}
  inside = (size, train_len)
  if inside not in buckets['full']:
    raise ValueError(f'The long-context lengths must have a bucket {inside} (the windowed '
                     f'caches\' size to the training length); they have {list(buckets["full"])}.')
  beyond = [k for k in buckets['full'] if k[0] >= train_len]
  vocab = int(r['config']['model']['vocab_size'])
  full = buckets['full'][inside]
  out = {'buckets': {label: [v for _, v in sorted(b.items())] for label, b in buckets.items()},
         'edges': sorted(buckets['full']),
         'window_penalty': buckets['window'][inside] - full,
         'sinks_penalty': buckets['sinks'][inside] - full,
         'window_minus_sinks_beyond': float(np.mean([buckets['window'][k] - buckets['sinks'][k]
                                                     for k in beyond])) if beyond else None,
         'collapse_threshold': (math.log(vocab) - full) / 2, 'f_attn_max': None,
         'curves': {label: lc[label]['loss']['curve'] for label in LABELS}}
  out['collapsed'] = out['window_penalty'] > out['collapse_threshold']
  f = r['analysis'].get('f_attn_per_layer') or r['analysis'].get('f_attn')
  if isinstance(f, list) and f:
    out['f_attn_max'] = float(np.max(f))
  q = r['quant']
  if q:
    out['float_loss'] = q['float']['loss']
    out['quant'] = {s['key']: s['increase'] for s in q['settings']}
    out['quant_names'] = {s['key']: s['name'] for s in q['settings']}
    out['absmax'] = {site: float(max(v['absmax'])) for site, v in q['linear_inputs'].items()}
    out['kurtosis'] = {site: float(max(v['kurtosis'])) for site, v in q['linear_inputs'].items()}
  return out


def collect(experiment, out: str) -> dict:
  """{variant: {seed: measures}} of the finished runs."""
  data = {}
  for run in experiment.runs:
    r = read_run(running.run_dir(out, run))
    if r is not None:
      data.setdefault(run.variant, {})[run.seed] = measures(r)
  return data


def _ms(values, fmt='.3f') -> str:
  """mean ± std over seeds (the std unsigned), or the one value."""
  values = [v for v in values if v is not None]
  if not values:
    return '-'
  if len(values) == 1:
    return format(values[0], fmt)
  return f'{np.mean(values):{fmt}} ± {np.std(values, ddof=1):{fmt.lstrip("+")}}'


def _paired(base: dict, other: dict) -> dict | None:
  """stats.paired (baseline minus variant by seed) with `detectable`: the smallest true mean
  difference the t-test over these pairs finds with 80% power (None without spread)."""
  g = stats.paired(base, other)
  if g is not None:
    g['detectable'] = (stats.t_detectable(g['sd'], g['n']) if g['sd'] and g['n'] > 1
                       else None)
  return g


def _gap(base: dict, other: dict, fmt='+.3f') -> str:
  """baseline - variant paired by seed: mean [95% t interval] (pairs in which the variant is
  lower; the smallest difference 80% power detects)."""
  g = _paired(base, other)
  if g is None:
    return '-'
  ci = ('' if g['interval'] is None else
        f' [{g["interval"][0]:{fmt}}, {g["interval"][1]:{fmt}}]')
  det = '' if g['detectable'] is None else f'; detects {g["detectable"]:.2g}'
  return f'{g["mean"]:{fmt}}{ci} ({g["lower"]}/{g["n"]} lower{det})'


def _by_seed(data, variant, key, sub=None) -> dict:
  out = {}
  for seed, m in data.get(variant, {}).items():
    v = m.get(key)
    if sub is not None:
      v = None if v is None else v.get(sub)
    out[seed] = v
  return out


def _variants(data: dict) -> list[str]:
  first = [v for v in ('baseline', 'g1_elementwise', 'g1_headwise') if v in data]
  return first + sorted(v for v in data if v not in first)


def tables(data: dict) -> tuple[str, dict]:
  """The markdown tables and a JSON summary of `collect`'s data."""
  variants = _variants(data)
  base = variants[0]
  edges = next(iter(data[base].values()))['edges']
  lines = ['Loss by position (nats a token, mean ± std over seeds) with the full cache and '
           'streamed through the windowed caches:', '',
           '| variant | cache | ' + ' | '.join(f'{a}-{b}' for a, b in edges) + ' |',
           '|---|---|' + '---|' * len(edges)]
  for v in variants:
    for label in LABELS:
      cells = [_ms([m['buckets'][label][i] for m in data[v].values()]) for i in range(len(edges))]
      lines.append(f'| {v} | {label} | ' + ' | '.join(cells) + ' |')
  summary = {'variants': {}, 'edges': edges}
  lines += ['', 'Streaming penalty in the comparison bucket (the windowed cache\'s loss minus the '
            'full cache\'s, nats, mean ± std), collapses (a window-only penalty above half the '
            'gap between the full cache and guessing) with their 95% Wilson interval and '
            'Fisher\'s exact test against the first variant, and beyond the training length the '
            'window\'s loss minus the window with sinks\':', '',
            '| variant | seeds | window penalty | sinks penalty | collapsed (window) | Fisher p '
            '| window - sinks beyond | F-Attn max layer |', '|---|---|---|---|---|---|---|---|']
  base_c = None
  for v in variants:
    ms = list(data[v].values())
    k, n = sum(m['collapsed'] for m in ms), len(ms)
    lo, hi = stats.wilson_interval(k, n)
    p = None if base_c is None else stats.fisher_exact(base_c[0], base_c[1], k, n)
    base_c = base_c or (k, n)
    summary['variants'][v] = {'seeds': sorted(data[v]), 'collapsed': k, 'runs': n,
                              'collapse_interval': [lo, hi], 'fisher_p': p,
                              'collapsed_seeds': sorted(s for s, m in data[v].items()
                                                        if m['collapsed'])}
    lines.append(f'| {v} | {n} | {_ms([m["window_penalty"] for m in ms], "+.3f")} | '
                 f'{_ms([m["sinks_penalty"] for m in ms], "+.3f")} | {k}/{n} [{lo:.2f}, {hi:.2f}] '
                 f'| {"-" if p is None else format(p, ".3f")} | '
                 f'{_ms([m["window_minus_sinks_beyond"] for m in ms], "+.3f")} | '
                 f'{_ms([m["f_attn_max"] for m in ms], ".2f")} |')
  gap_keys = ('window_penalty', 'sinks_penalty', 'window_minus_sinks_beyond')
  if len(variants) > 1:
    lines += ['', f'Paired by seed, {base} minus each variant (mean [95% t interval], the pairs '
              'in which the variant is lower, and the smallest true difference these pairs '
              'detect with 80% power): a positive number is a penalty the variant avoids:', '',
              '| variant | window penalty | sinks penalty | window - sinks beyond |',
              '|---|---|---|---|']
    for v in variants[1:]:
      gaps = {key: _paired(_by_seed(data, base, key), _by_seed(data, v, key)) for key in gap_keys}
      summary['variants'][v]['gaps'] = gaps
      lines.append(f'| {v} | ' + ' | '.join(
          _gap(_by_seed(data, base, key), _by_seed(data, v, key)) for key in gap_keys) + ' |')
  quant_runs = [m for v in variants for m in data[v].values() if 'quant' in m]
  if quant_runs:
    keys, names = list(quant_runs[0]['quant']), quant_runs[0]['quant_names']
    cols = variants + [f'{base} - {v}' for v in variants[1:]]
    lines += ['', 'Quantization: each setting\'s loss increase over the float model on the same '
              'held-out batches (nats, mean ± std over seeds; model/quantization.py has the '
              f'grids), then {base}\'s increase minus each variant\'s, paired by seed:', '',
              '| setting | ' + ' | '.join(cols) + ' |', '|---|' + '---|' * len(cols)]
    lines.append('| float loss | ' + ' | '.join(
        [_ms([m.get('float_loss') for m in data[v].values()]) for v in variants] +
        [''] * (len(variants) - 1)) + ' |')
    for key in keys:
      cells = [_ms([m['quant'].get(key) for m in data[v].values() if 'quant' in m], '+.4f')
               for v in variants]
      gaps = [_gap(_by_seed(data, base, 'quant', key), _by_seed(data, v, 'quant', key), '+.4f')
              for v in variants[1:]]
      lines.append(f'| {names[key]} | ' + ' | '.join(cells + gaps) + ' |')
      for v in variants[1:]:
        summary['variants'][v].setdefault('quant_gaps', {})[key] = _paired(
            _by_seed(data, base, 'quant', key), _by_seed(data, v, 'quant', key))
      for v in variants:
        summary['variants'][v].setdefault('quant', {})[key] = [
            m['quant'].get(key) for m in data[v].values() if 'quant' in m]
    sites = list(quant_runs[0]['absmax'])
    lines += ['', 'The float model\'s linear inputs: the largest max |x| over layers, and the '
              'largest kurtosis over layers (mean ± std over seeds):', '',
              '| variant | ' + ' | '.join(f'{s} max' for s in sites) + ' | ' +
              ' | '.join(f'{s} kurtosis' for s in sites) + ' |',
              '|---|' + '---|' * (2 * len(sites))]
    for v in variants:
      ms = [m for m in data[v].values() if 'quant' in m]
      lines.append(f'| {v} | ' + ' | '.join(
          [_ms([m['absmax'][s] for m in ms], '.1f') for s in sites] +
          [_ms([m['kurtosis'][s] for m in ms], '.1f') for s in sites]) + ' |')
      summary['variants'][v]['absmax'] = {s: [m['absmax'][s] for m in ms] for s in sites}
      summary['variants'][v]['kurtosis'] = {s: [m['kurtosis'][s] for m in ms] for s in sites}
  return '\n'.join(lines) + '\n', summary


def figure(data: dict, path: str):
  """Loss by position (the long-context curves, mean over seeds) per variant and cache."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  variants = _variants(data)
  fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.4), sharey=True,
                           squeeze=False)
  for ax, v in zip(axes[0], variants):
    for label in LABELS:
      curves = [m['curves'][label] for m in data[v].values()]
      x = np.asarray(curves[0]['position'])
      y = np.asarray([c['loss'] for c in curves])
      ax.plot(x, y.mean(0), color=COLORS[label], label=label)
      if len(y) > 1:
        ax.fill_between(x, y.min(0), y.max(0), color=COLORS[label], alpha=0.15)
    m0 = next(iter(data[v].values()))
    for a, _ in m0['edges'][1:]:
      ax.axvline(a, color='grey', lw=0.5, ls=':')
    ax.set_title(f'{v} ({len(data[v])} seeds)')
    ax.set_xlabel('position')
  axes[0][0].set_ylabel('loss (nats), mean over seeds; band: min-max')
  axes[0][0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  experiment = spec.load(args.experiment, rundata.METRICS)
  if set(experiment.long_context) != set(LABELS):
    raise spec.ExperimentError(f'{args.experiment}: LONG_CONTEXT must have the labels '
                               f'{", ".join(LABELS)} (it has {", ".join(experiment.long_context)}).')
  only = set(filter(None, args.only.split(',')))
  if not args.tables_only:
    stream(experiment, args.out, only)
    quantize(experiment, args.out, only)
    if only:
      return
  data = collect(experiment, args.out)
  if not data:
    print('No finished run has its three long-context evaluations yet.')
    return
  text, summary = tables(data)
  figure(data, os.path.join(args.out, 'streaming.png'))
  with open(os.path.join(args.out, 'inference.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  body = (f'## {experiment.title}\n\n'
          f'{experiment.description}\n\nCommands: `python -m experiments.run {args.experiment}` '
          f'then `python -m experiments.inference {args.experiment}` (runs of '
          f'{", ".join(f"{v}: seeds {sorted(s)}" for v, s in sorted((v, list(d)) for v, d in data.items()))}); '
          f'commit `{report_commit()}`.\n\n{text}\n')
  with open(os.path.join(args.out, 'inference.md'), 'w') as f:
    f.write(body + '![streaming.png](streaming.png)\n')
  print(body)
  if args.results:
    fig_dir = os.path.join(os.path.dirname(os.path.abspath(args.results)), 'figures',
                           experiment.name)
    os.makedirs(fig_dir, exist_ok=True)
    shutil.copy(os.path.join(args.out, 'streaming.png'), os.path.join(fig_dir, 'streaming.png'))
    sections.update_section(args.results, f'{experiment.name}_inference',
                          body + f'![streaming.png](figures/{experiment.name}/streaming.png)\n')


def report_commit() -> str:
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=spec.REPO,
                          capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'


if __name__ == '__main__':
  main()
