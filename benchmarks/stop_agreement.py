"""The per-step cost of agreeing on a stop in a multi-process run (cluster/stop.py).

Two jax.distributed processes on this machine (2 CPU devices each, gloo) train the default
config's model (configs/g1_elementwise.py, `tiny`) on its data, in blocks of `--steps` steps:
with the agreement (each step carries the processes' stop flags and the loop reads the flags
of the step two back, as training/interrupt.py does) and without, alternating, `--rounds` pairs. Printed: each
block's seconds per step and the median ratio with / without (the goal: under 1.01). Within one
run, so the machine's drift cancels.

  python -m benchmarks.stop_agreement [--steps=40] [--rounds=5] [--json=FILE]

Measured 2026-12-05 on the 2-core CPU (alone): 40 steps x 5 rounds at 180-201 ms a step, the
ratio per round 0.995-1.044, median 0.9989: no cost measurable above the machine's noise. Not
measured on an accelerator, where a step can be shorter than its dispatch: the read two steps
back keeps the host at most two steps ahead of the devices.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Both variants read the loss every LOG_EVERY steps, as the training loop's log points do. (With
# no read at all for 40 steps, two CPU processes ran that far ahead of their devices and
# deadlocked once in XLA's CPU executor; the agreement's own reads keep the loop two steps ahead.)
LOG_EVERY = 10


def _worker(process_id: int, port: int, steps: int, rounds: int, out: str):
  os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
  os.environ['JAX_PLATFORMS'] = 'cpu'
  sys.path.insert(0, REPO)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from gated_attention.configs import g1_elementwise  # pylint: disable=g-import-not-at-top
  from gated_attention import cluster, input_pipeline, sharding  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train  # pylint: disable=g-import-not-at-top
  c = g1_elementwise.get_config('tiny')
  c.distributed.update(coordinator_address=f'127.0.0.1:{port}', num_processes=2,
                       process_id=process_id)
  cluster.initialize(c.distributed)
  setup = train.Setup(c, sharding.build_mesh(c.mesh))
  data = input_pipeline.build_data(c.data, global_batch_size=c.train.batch_size, seed=c.seed,
                                   process_index=process_id, process_count=2)
  batches = [setup.global_batch(next(data.train_iter), whole=True) for _ in range(8)]
  params, opt = setup.init(c.seed)
  agreement = cluster.StopAgreement()
  times = {'with': [], 'without': []}

  def block(agree: bool) -> float:
    nonlocal params, opt
    start = time.perf_counter()
    for i in range(steps):
      batch = batches[i % len(batches)]
      if agree:     # what training/interrupt.py's Interrupt.step and stop_now do
        assert agreement.decided() is None
        params, opt, metrics = setup.train_step_with_flags(
            params, opt, batch, agreement.flags(None, setup), 1.0)
        agreement.push(metrics.pop('stop_flags'), setup)
      else:
        params, opt, metrics = setup.train_step(params, opt, batch, 1.0)
      if (i + 1) % LOG_EVERY == 0:   # the loop's log points read the loss, in both
        jax.device_get(metrics['loss'])
    jax.block_until_ready(metrics['loss'])
    return (time.perf_counter() - start) / steps

  with jax.set_mesh(setup.mesh):
    block(True)   # compiles both programs
    block(False)
    for _ in range(rounds):
      for agree in (False, True):
        times['with' if agree else 'without'].append(block(agree))
  ratio = float(np.median(np.array(times['with']) / np.array(times['without'])))
  if process_id == 0:
    with open(out, 'w') as f:
      json.dump({'seconds_per_step': times, 'median_ratio': ratio, 'steps': steps,
                 'rounds': rounds}, f, indent=1)
  cluster.finish()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--json', default='')
  parser.add_argument('--worker', type=int, default=-1, help=argparse.SUPPRESS)
  parser.add_argument('--port', type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument('--out', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker >= 0:
    return _worker(args.worker, args.port, args.steps, args.rounds, args.out)
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  out = args.json or os.path.join(REPO, 'stop_agreement.json')
  env = dict(os.environ, JAX_COORDINATOR_BIND_ADDRESS=f'127.0.0.1:{port}')
  procs = [subprocess.Popen([sys.executable, '-m', 'benchmarks.stop_agreement', f'--worker={i}',
                             f'--port={port}', f'--steps={args.steps}',
                             f'--rounds={args.rounds}', f'--out={out}'], cwd=REPO, env=env)
           for i in range(2)]
  if any(p.wait() for p in procs):
    sys.exit('a worker failed')
  with open(out) as f:
    result = json.load(f)
  for name, values in result['seconds_per_step'].items():
    print(f'{name:>8} agreement: ' + ' '.join(f'{1e3 * v:.1f}' for v in values) + ' ms/step')
  print(f'median ratio with / without: {result["median_ratio"]:.4f}')
  if not args.json:
    os.remove(out)
  return result


if __name__ == '__main__':
  main()
