"""The first minutes on a GPU: the throughput benchmark, then the accelerator-scale sink runs.

One command, sized to a budget of GPU time (default 12 minutes in all, start-up excluded), every
result written to files under --out as it arrives (nothing is only printed):

  python -m benchmarks.gpu_session --out=gpu_session        # on the GPU machine

1. `python -m benchmarks.gpu` (tokens/s, MFU, peak memory of tiny, ~100M and 1.7B models;
   its --budget_s is a quarter of the session's) -> OUT/gpu.json and OUT/gpu.log.
2. The gate's overhead (`python -m benchmarks.gpu --overhead --models=tiny,dense_100m`: the
   baseline and G1 elementwise timed round-robin in one process per model, the gate's share of
   the step against the paper's "under 2%"; a tenth of the budget) -> OUT/overhead.json and
   OUT/overhead.log.
3. The sink at accelerator scale (experiments/sink_accelerator.py: dense_90m, context 2048,
   32 sequences per step), baseline and G1 elementwise, one seed, resized to what is left: the
   steps per run come from the benchmark's measured dense_100m tokens/s (the same shapes; 1,000
   when it did not run), at most the recipe's 4,000. The byte tokenizer by default (the recipe's
   BPE takes minutes of CPU to train first; --tokenizer=PATH uses one). Through the experiment
   runner, so a run cut off by the budget resumes with the same command:
   OUT/sink/results.md (the table), OUT/sink/runs/<run>/ (metrics, checkpoints, analysis).
4. OUT/session.json: each stage's command, status, wall time and what it produced.

Every stage has a deadline (the session's budget); a stage that fails or runs out of time is
recorded and the session goes on. Without a GPU the benchmark refuses (recorded) and the sink
stage runs on whatever JAX has: `--scale=tiny --steps=4` is the CPU check of the control flow
(tests/test_benchmarks.py).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS_PER_STEP = 32 * 2048          # sink_accelerator's batch x context (gated_attention/config/scales.py)
MAX_STEPS = 4000                     # the recipe's length
FALLBACK_STEPS = 1000
RUN_OVERHEAD_S = 90.0                # a run's compile, evaluations, checkpoints, analysis


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m benchmarks.gpu_session', description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', default='gpu_session', help='output directory')
  p.add_argument('--budget_s', type=float, default=720.0, help='GPU time for everything')
  p.add_argument('--scale', default='dense_90m', help='the sink runs\' scale')
  p.add_argument('--steps', type=int, default=0, help='steps per sink run (0: from the budget)')
  p.add_argument('--tokenizer', default='byte', help='data.tokenizer of the sink runs')
  p.add_argument('--variants', default='baseline,g1_elementwise')
  return p.parse_args(argv)


def sink_steps(tokens_per_sec: float | None, seconds: float, runs: int) -> int:
  """Steps per run so that `runs` runs fit `seconds` at `tokens_per_sec` (None: unmeasured)."""
  if not tokens_per_sec:
    return FALLBACK_STEPS
  per_run = max(seconds / runs - RUN_OVERHEAD_S, 0.0)
  return int(max(100, min(MAX_STEPS, per_run * tokens_per_sec / TOKENS_PER_STEP)))


def measured_tokens_per_s(rows: list[dict]) -> float | None:
  """benchmarks/gpu.py's dense_100m tokens/s (its rows' `tokens_per_s`), or None."""
  return next((r.get('tokens_per_s') for r in rows if r.get('model') == 'dense_100m'), None)


def _stage(session: dict, name: str, args: list[str], log: str, timeout: float) -> str:
  """Runs `python args` with a deadline, output to `log`; records and returns its status."""
  t0 = time.time()
  entry = session['stages'].setdefault(name, {})
  entry.update(command=' '.join([sys.executable] + args), log=log, status='running')
  with open(log, 'w') as f:
    try:
      rc = subprocess.call([sys.executable] + args, cwd=ROOT, stdout=f,
                           stderr=subprocess.STDOUT, timeout=max(timeout, 1.0))
      status = 'done' if rc == 0 else f'failed (exit {rc})'
    except subprocess.TimeoutExpired:
      status = f'stopped at its deadline ({timeout:.0f} s)'
  entry.update(status=status, seconds=round(time.time() - t0, 1))
  return status


def _benchmark_rows(log: str) -> list[dict]:
  """The JSON list benchmarks/gpu.py prints last, or [] (it refused or failed)."""
  text = open(log).read()
  start = text.rfind('\n[')
  try:
    return json.loads(text[start + 1:]) if start >= 0 else []
  except ValueError:
    return []


def _experiment_file(out: str, args, steps: int) -> str:
  """experiments/sink_accelerator.py with this session's variants, tokenizer and length."""
  path = os.path.join(out, 'sink_session.py')
  source = os.path.join(ROOT, 'experiments', 'sink_accelerator.py')
  overrides = {'data.tokenizer': args.tokenizer, 'train.steps': steps,
               'train.warmup_steps': max(1, min(500, steps // 8)),
               'train.eval_every': max(1, steps // 4), 'train.checkpoint_every': max(1, steps // 2)}
  with open(path, 'w') as f:
    f.write(
            f'"""Sink at accelerator scale, sized to a GPU session ({steps} steps per run)\n\n'
            f'experiments/sink_accelerator.py with {overrides}."""\n'
            f'_recipe = {{}}\nexec(open({source!r}).read(), _recipe)\n'
            f'SCALE = {args.scale!r}\n'
            f'SEEDS = [0]\n'
            f'VARIANTS = {args.variants.split(",")!r}\n'
            f'OVERRIDES = dict(_recipe["OVERRIDES"], **{overrides!r})\n'
            f'ANALYZE_OVERRIDES = _recipe["ANALYZE_OVERRIDES"]\n'
            f'COLUMNS = _recipe["COLUMNS"]\n'
            'del _recipe\n')
  return path


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  deadline = time.time() + args.budget_s
  session = {'budget_s': args.budget_s, 'stages': {}}
  path = os.path.join(out, 'session.json')

  def save():
    with open(path + '.tmp', 'w') as f:
      json.dump(session, f, indent=1)
    os.replace(path + '.tmp', path)

  save()
  bench_log = os.path.join(out, 'gpu.log')
  _stage(session, 'benchmark', ['-m', 'benchmarks.gpu', f'--budget_s={args.budget_s / 4:.0f}'],
         bench_log, timeout=min(args.budget_s * 0.4, deadline - time.time()))
  rows = _benchmark_rows(bench_log)
  with open(os.path.join(out, 'gpu.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  session['stages']['benchmark']['rows'] = len(rows)
  save()

  overhead_log = os.path.join(out, 'overhead.log')
  _stage(session, 'overhead', ['-m', 'benchmarks.gpu', '--overhead', '--models=tiny,dense_100m',
                               f'--budget_s={args.budget_s / 10:.0f}'],
         overhead_log, timeout=min(args.budget_s * 0.15, deadline - time.time()))
  with open(os.path.join(out, 'overhead.json'), 'w') as f:
    json.dump(_benchmark_rows(overhead_log), f, indent=1)
  save()

  measured = measured_tokens_per_s(rows)
  runs = len(args.variants.split(','))
  steps = args.steps or sink_steps(measured, deadline - time.time(), runs)
  session['sink_steps'] = steps
  session['sink_steps_from'] = ('--steps' if args.steps else
                                f'dense_100m at {measured:,.0f} tokens/s' if measured else
                                f'no measurement: {FALLBACK_STEPS}')
  experiment = _experiment_file(out, args, steps)
  save()
  sink_out = os.path.join(out, 'sink')
  _stage(session, 'sink', ['-m', 'experiments.run', experiment, '--out', sink_out],
         os.path.join(out, 'sink.log'), timeout=deadline - time.time())
  session['stages']['sink']['results'] = os.path.join(sink_out, 'results.md')
  save()
  print(json.dumps(session, indent=1))
  return 0 if all(s['status'] == 'done' for s in session['stages'].values()) else 1


if __name__ == '__main__':
  sys.exit(main())
