"""The per-step cost of the goodput account and the profiler's hooks outside a traced window
(training/goodput.py, training/profile.py).

One process trains the default config's model (configs/g1_elementwise.py, `tiny`) on its data,
in blocks of `--steps` steps: with what training/loop.py adds to each step (a lap after the
batch and after the step, the profiler's `before` / `annotate` / last-step check, and at each
log point a lap and a snapshot handed to the account's writer thread, which writes it to a
local run directory) and without, alternating, `--rounds` pairs. Both read the loss at the log
points, as the loop does. Printed: each block's seconds per step and the median ratio with /
without (the goal: under 1.01; within one run, so the machine's drift cancels, but on a loaded
machine the blocks' own noise is larger than the effect), and the hooks timed alone, 200,000
times without a step between them: their seconds a step, against the step's time.

  python -m benchmarks.goodput [--steps=40] [--rounds=7] [--json=FILE]

Measured 2026-12-05 on the 2-core CPU, other jobs running: the hooks alone 1.55 us a step
(0.0006% of a 281-ms step); the block ratio 0.947 and 1.055 in two runs (rounds 0.6-1.4: noise).
"""

import argparse
import json
import tempfile
import time

import jax
import ml_collections
import numpy as np

from gated_attention import input_pipeline, sharding
from gated_attention.configs import g1_elementwise
from gated_attention.training import goodput, profile, train

LOG_EVERY = 10      # the loop's log points: a read of the loss (and, with the account, a snapshot)


def _hooks_alone(account, profiler, steps: int = 200_000) -> float:
  """Seconds a step spends in the hooks themselves (no training step between them): what the
  block ratio measures, without the machine's noise of the steps."""
  start = time.perf_counter()
  for i in range(steps):
    profiler.before(i + 1)
    account.lap('data_wait')
    with profiler.annotate(i + 1):
      pass
    if i + 1 == profiler.last:
      profiler.after(i + 1, None)
    if (i + 1) % LOG_EVERY == 0:
      account.lap('steps')
      account.publish(i + 1)
  return (time.perf_counter() - start) / steps


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--json', default='')
  args = parser.parse_args(argv)
  c = g1_elementwise.get_config('tiny')
  setup = train.Setup(c, sharding.build_mesh(c.mesh))
  data = input_pipeline.build_data(c.data, global_batch_size=c.train.batch_size, seed=c.seed)
  batches = [setup.global_batch(next(data.train_iter), whole=True) for _ in range(8)]
  params, opt = setup.init(c.seed)
  workdir = tempfile.mkdtemp(prefix='goodput_benchmark_')
  account = goodput.Account()
  account.begin(workdir, 0)
  tc = ml_collections.ConfigDict({'profile_steps': 0, 'profile_start': 0,
                                  'profile_processes': 'first'})
  profiler = profile.Profiler(tc, workdir, 0)
  times = {'with': [], 'without': []}
  step = 0

  def block(keep: bool) -> float:
    nonlocal params, opt, step
    start = time.perf_counter()
    for i in range(args.steps):
      if keep:
        profiler.before(step + 1)
      batch = batches[i % len(batches)]
      if keep:
        account.lap('data_wait')
        with profiler.annotate(step + 1):
          params, opt, metrics = setup.train_step(params, opt, batch, 1.0)
        if step + 1 == profiler.last:
          profiler.after(step + 1, params)
      else:
        params, opt, metrics = setup.train_step(params, opt, batch, 1.0)
      step += 1
      if (i + 1) % LOG_EVERY == 0:
        jax.device_get(metrics['loss'])
        if keep:
          account.lap('steps')
          account.publish(step)
    jax.block_until_ready(metrics['loss'])
    return (time.perf_counter() - start) / args.steps

  with jax.set_mesh(setup.mesh):
    block(True)   # compiles
    block(False)
    for _ in range(args.rounds):
      for keep in (False, True):
        times['with' if keep else 'without'].append(block(keep))
  hooks = _hooks_alone(account, profiler)
  account.finish(step, 'finished')
  ratio = float(np.median(np.array(times['with']) / np.array(times['without'])))
  step_s = float(np.median(times['without']))
  result = {'seconds_per_step': times, 'median_ratio': ratio, 'steps': args.steps,
            'rounds': args.rounds, 'hooks_seconds_per_step': hooks,
            'hooks_fraction_of_step': hooks / step_s}
  for name, values in times.items():
    print(f'{name:>8} the account: ' + ' '.join(f'{1e3 * v:.1f}' for v in values) + ' ms/step')
  print(f'median ratio with / without: {ratio:.4f}')
  print(f'the hooks alone: {1e6 * hooks:.2f} us a step, {100 * hooks / step_s:.4f}% of a '
        f'{1e3 * step_s:.0f}-ms step')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == '__main__':
  main()
