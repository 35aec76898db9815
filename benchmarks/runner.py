"""The experiment runner's cost against the training arithmetic of its runs (issue 27 item 3).

The 4-run probe: the sink task's model (experiments/sink_synthetic.py's OVERRIDES: 2 layers,
one head of 128, 16 x 128 tokens a step), 2 variants x 2 seeds, 300 steps each, trained and
analysed by `python -m experiments.run` from an empty output directory (so an empty compilation
cache, as an experiment's first invocation has). This file is also the probe's experiment file.

  python -m benchmarks.runner [--jobs=1,2] [--steps=300] [--out=DIR] [--json=FILE]

Printed, for each --jobs value (one probe after the other, each from an empty directory): the
runner's wall time, the runs' training arithmetic (each run's steps x its median step time,
rundata.step_arithmetic) and their ratio (the goal: <= 1.2x), then where the rest goes, per run:
the training process's wall time beyond its arithmetic (start-up, compile, evaluations,
checkpoints, and the analysis where main.py --analyze did it), a separate analysis process (0
where there was none), and the runner's own time between them. The arithmetic is
the first probe's (list 1 first: runs side by side slow each other's steps, so their own rows
time a shared machine); later probes are measured against it.

Measured 2026-12-03 on the 2-core CPU (the machine's speed drifts ~20% between invocations, so
compare ratios, not seconds); the runner's own line in brackets:
  commit abb8966 (a separate --mode=analyze; jnp.median's sort in every inspection):
      300 steps 129 s against 81 s of arithmetic, 1.59x (1.53x); 1,000 steps 255 s against
      205 s, 1.25x (1.23x).
  with main.py --analyze (8ecadfb): 300 steps 109 s against 66 s, 1.65x (1.58x); 1,000 steps
      295 s against 251 s, 1.18x (1.16x). --jobs 2 at 300 steps: 115 s, 1.74x against the
      --jobs 1 arithmetic (each step slows 2x: one run already uses both cores).
  and M-Act's median by selection (913edd9): 300 steps 114 s against 76 s, 1.50x (1.44x);
      1,000 steps 276 s against 239 s, 1.16x (1.14x).
  and the learning rate logged from one compiled schedule (7b38738: 17 compiles in a run instead
      of 28): 300 steps 126 s against 79 s, 1.59x (1.50x): within this machine's drift of the
      line above. The whole sink suite at 7b38738 (experiments/sink_synthetic.py, 30 runs of
      1,000 steps, empty output directory, alone): 2,427 s against 2,143 s of arithmetic, 1.13x.
Per run, beyond its arithmetic, now: ~4-6 s (start-up, 3 evaluations, a checkpoint, the
analysis: its full evaluation of 4 batches 0.22 s, 5 figures ~1.3 s), ~6-10 s more for the first
run of a variant (its compiles). At 300 steps (~18 s of arithmetic a run) that fixed cost keeps
the ratio near 1.5x; at the experiments' 1,000 steps it is within the 1.2x goal.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from experiments import sink_synthetic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the runner's working dir

SEEDS = [0, 1]
VARIANTS = ['baseline', 'g1_elementwise']
OVERRIDES = {**sink_synthetic.OVERRIDES,
             'train.steps': int(os.environ.get('RUNNER_PROBE_STEPS', 300))}
COLUMNS = ['val_loss', 'f_attn_max', 'm_act_mean', 'train_minutes']


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--jobs', default='1', help='comma-separated: one probe per value')
  p.add_argument('--steps', type=int, default=300)
  p.add_argument('--out', default='', help='output directory (default: a new temporary one)')
  p.add_argument('--json', default='', help='also write the numbers to this file')
  return p.parse_args(argv)


def breakdown(out: str) -> list[dict]:
  """Per run: training wall time and arithmetic, analysis wall time (runner.json, metrics)."""
  from experiments import rundata  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  rows = []
  for name in sorted(os.listdir(os.path.join(out, 'runs'))):
    workdir = os.path.join(out, 'runs', name)
    state = rundata.read_runner(workdir)
    rows.append({'run': name, 'train_seconds': state.get('train_seconds', 0.0),
                 'arithmetic': rundata.step_arithmetic(rundir.read_metrics(workdir)),
                 'analyze_seconds': state.get('analyze_seconds', 0.0)})
  return rows


def probe(jobs: int, steps: int, out: str, arithmetic: float | None) -> dict:
  """One runner invocation from an empty `out`; prints and returns its numbers."""
  env = dict(os.environ, RUNNER_PROBE_STEPS=str(steps))
  t0 = time.time()
  proc = subprocess.run([sys.executable, '-m', 'experiments.run', os.path.abspath(__file__),
                         '--out', out, '--jobs', str(jobs)], cwd=REPO, env=env,
                        capture_output=True, text=True)
  wall = time.time() - t0
  if proc.returncode:
    print(proc.stdout[-4000:], proc.stderr[-4000:], sep='\n', file=sys.stderr)
    raise SystemExit(proc.returncode)
  line = re.search(r'Runner: (\d+) s .* is (\d+) s: ([\d.]+)x', proc.stdout + proc.stderr)
  rows = breakdown(out)
  own = sum(r['arithmetic'] for r in rows)
  arithmetic = arithmetic or own
  train = sum(r['train_seconds'] for r in rows)
  analyze = sum(r['analyze_seconds'] for r in rows)
  print(f'\n{len(rows)} runs x {steps} steps, --jobs {jobs}, in {out}')
  if line:
    print(f'runner: {line.group(0)}')
  print(f'wall (runner start-up included) {wall:.1f} s; training arithmetic {arithmetic:.1f} s '
        f'(these runs\' own rows: {own:.1f} s): {wall / arithmetic:.2f}x')
  print(f'{"run":<22}{"train s":>9}{"arith s":>9}{"beyond":>9}{"analyze s":>11}')
  for r in rows:
    print(f'{r["run"]:<22}{r["train_seconds"]:>9.1f}{r["arithmetic"]:>9.1f}'
          f'{r["train_seconds"] - r["arithmetic"]:>9.1f}{r["analyze_seconds"]:>11.1f}')
  print(f'summed over runs: training processes {train:.1f} s ({train - own:.1f} s beyond their '
        f'rows\' arithmetic), analyses {analyze:.1f} s; wall x jobs - both '
        f'{wall * jobs - train - analyze:.1f} s (runner start-up, fork server, reports, figures)')
  return {'jobs': jobs, 'wall': wall, 'arithmetic': arithmetic, 'own_arithmetic': own,
          'ratio': wall / arithmetic, 'runs': rows,
          'runner_line': line.group(0) if line else None}


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  base = args.out or tempfile.mkdtemp(prefix='runner_probe_')
  results, arithmetic = [], None
  for jobs in [int(j) for j in args.jobs.split(',')]:
    result = probe(jobs, args.steps, os.path.join(base, f'jobs{jobs}'), arithmetic)
    arithmetic = arithmetic or result['arithmetic']
    results.append(result)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
