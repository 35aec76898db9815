"""Several seeds as one program (training/seeds.py) against one seed at a time (issue 27 item 2).

Two measurements, both of the sink task's model (experiments/sink_synthetic.py's OVERRIDES:
2 layers, 1 head of 128, 16 x 128 tokens per step) in one process:

  1. The step: Stacked.train_step on S seeds against S calls of Setup.train_step (one seed
     each), both compiled first, then timed round-robin (`--rounds` rounds of `--steps` steps of
     each), so a busy machine slows them alike. Printed: the median seconds of S single steps
     and of one batched step, and their ratio (above 1: batching is faster).
  2. Whole runs: seeds.run of S seeds for `--train_steps` steps against loop.run of each seed
     alone, one after the other (each single run compiles its own step, as a separate run
     does; process start-up is not counted). Printed: the wall time of each, their ratio, and
     how far each seed's numbers are from its single run: per-step train loss, grad_norm,
     update_norm (max |a - b| and max |a - b| / |b|), the last validation loss, F-Attn and
     M-Act, and the final checkpoint's parameters (max |a - b|), with whether they are bitwise
     equal.

  python -m benchmarks.seeds [--seeds=3] [--train_steps=300] [--rounds=5] [--steps=10]
                             [--program=auto|unrolled|vmap]
                             [--skip_runs] [--workdir=DIR] [--json=FILE]
"""

import argparse
import importlib.util
import json
import os
import shutil
import tempfile
import time

import jax
import numpy as np

from gated_attention import sharding
from gated_attention.runs import rundir
from gated_attention.training import loop
from gated_attention.training import seeds as seeds_lib
from gated_attention.training import train as train_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sink_config(variant: str = 'g1_elementwise', steps: int = 300, seed: int = 0,
                program: str = 'auto'):
  """configs/<variant>.py:tiny with experiments/sink_synthetic.py's OVERRIDES, `steps` steps."""
  path = os.path.join(REPO, 'experiments', 'sink_synthetic.py')
  spec = importlib.util.spec_from_file_location('_sink_synthetic', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  vspec = importlib.util.spec_from_file_location(
      f'_variant_{variant}', os.path.join(REPO, 'configs', f'{variant}.py'))
  vmodule = importlib.util.module_from_spec(vspec)
  vspec.loader.exec_module(vmodule)
  c = vmodule.get_config('tiny')
  c.update_from_flattened_dict({**module.OVERRIDES, 'train.steps': steps, 'seed': seed,
                                'train.seeds_program': program,
                                'train.eval_every': min(steps, module.OVERRIDES[
                                    'train.eval_every']),
                                'train.checkpoint_every': steps})
  return c


def time_steps(config, num_seeds: int, rounds: int, steps: int) -> dict:
  """Measurement 1: median seconds of `num_seeds` single steps and of one batched step (the
  program of config.train.seeds_program)."""
  setup = train_lib.Setup(config, sharding.build_mesh(config.mesh))
  stacked = seeds_lib.Stacked(setup)
  B, T, V = config.train.batch_size, config.data.seq_len, config.model.vocab_size
  rng = np.random.default_rng(0)
  local = [{'inputs': rng.integers(0, V, (B, T), dtype=np.int32),
            'targets': rng.integers(0, V, (B, T), dtype=np.int32),
            'loss_mask': np.ones((B, T), np.float32)} for _ in range(num_seeds)]
  with jax.set_mesh(setup.mesh):
    batches = [setup.global_batch(b) for b in local]
    singles = [setup.init(s) for s in range(num_seeds)]
    params_S, opt_S = stacked.stack_state([setup.init(s) for s in range(num_seeds)])
    batch_S = stacked.stack_batch(batches)
    single_s, batched_s = [], []
    for r in range(rounds + 1):                   # round 0 compiles both
      start = time.perf_counter()
      for _ in range(steps):
        for i in range(num_seeds):
          p, o, m = setup.train_step(*singles[i], batches[i], 1.0)
          singles[i] = (p, o)
      jax.block_until_ready(m)
      single_s.append((time.perf_counter() - start) / steps)
      start = time.perf_counter()
      for _ in range(steps):
        params_S, opt_S, m = stacked.train_step(params_S, opt_S, batch_S, 1.0)
      jax.block_until_ready(m)
      batched_s.append((time.perf_counter() - start) / steps)
  one, many = float(np.median(single_s[1:])), float(np.median(batched_s[1:]))
  return {'seeds': num_seeds, 'single_steps_s': one, 'batched_step_s': many,
          'speedup': one / many, 'rounds': rounds, 'steps_per_round': steps,
          'program': stacked.program}


def _series(workdir, split, key):
  rows = {r['step']: r for r in rundir.read_metrics(workdir) if r.get('split') == split}
  return np.array([rows[s][key] for s in sorted(rows)], np.float64), sorted(rows)


def compare_runs(batched: str, single: str) -> dict:
  """How far one seed's batched run is from its single run."""
  out = {}
  for key in ('loss', 'grad_norm', 'update_norm', 'param_norm'):
    (a, sa), (b, sb) = _series(batched, 'train', key), _series(single, 'train', key)
    assert sa == sb, (sa[:5], sb[:5])
    d = np.abs(a - b)
    out[key] = {'max_abs': float(d.max()), 'max_rel': float((d / np.abs(b)).max()),
                'bitwise': bool(np.array_equal(a, b))}
  for key in ('loss', 'f_attn_mean', 'm_act_mean'):
    (a, _), (b, _) = _series(batched, 'val', key), _series(single, 'val', key)
    out[f'val_{key}'] = {'batched': float(a[-1]), 'single': float(b[-1]),
                         'abs': float(abs(a[-1] - b[-1]))}
  cfg = rundir.read_config(single)
  f = rundir.model_factory(cfg)
  (_, pa), (_, pb) = f.restore(batched, warn=lambda _: None), f.restore(single, warn=print)
  la, lb = jax.tree.leaves(pa), jax.tree.leaves(pb)
  out['params'] = {
      'max_abs': max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(la, lb)),
      'max_rel': max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))) /
                           max(float(np.max(np.abs(np.asarray(y)))), 1e-30))
                     for x, y in zip(la, lb)),
      'bitwise': all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))}
  return out


def time_runs(num_seeds: int, train_steps: int, root: str, program: str = 'auto') -> dict:
  """Measurement 2: seeds.run of the seeds against loop.run of each, wall time and numbers."""
  dirs = rundir.seed_workdirs(os.path.join(root, 'batched'), range(num_seeds))
  start = time.perf_counter()
  seeds_lib.run(sink_config(steps=train_steps, program=program), dirs)
  batched = time.perf_counter() - start
  singles, per_seed = {}, {}
  for s in range(num_seeds):
    singles[s] = os.path.join(root, f'single_s{s}')
    start = time.perf_counter()
    loop.run(sink_config(steps=train_steps, seed=s), singles[s])
    per_seed[s] = time.perf_counter() - start
  single = sum(per_seed.values())
  return {'seeds': num_seeds, 'train_steps': train_steps, 'batched_wall_s': batched,
          'single_wall_s': single, 'single_wall_per_seed_s': per_seed,
          'speedup': single / batched,
          'differences': {s: compare_runs(dirs[s], singles[s]) for s in range(num_seeds)}}


def main():
  p = argparse.ArgumentParser(prog='python -m benchmarks.seeds', description=__doc__.split('\n')[0])
  p.add_argument('--seeds', type=int, default=3)
  p.add_argument('--train_steps', type=int, default=300)
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--steps', type=int, default=10)
  p.add_argument('--skip_runs', action='store_true', help='measurement 1 only')
  p.add_argument('--workdir', help='where the runs go (default: a temporary directory, removed)')
  p.add_argument('--json', help='also write the results to this file')
  p.add_argument('--program', default='auto', choices=seeds_lib.PROGRAMS,
                 help="config.train.seeds_program ('auto': unrolled on CPU, vmap elsewhere)")
  a = p.parse_args()
  result = {'device': jax.devices()[0].device_kind}
  result['step'] = time_steps(sink_config(program=a.program), a.seeds, a.rounds, a.steps)
  print(json.dumps(result['step']), flush=True)
  if not a.skip_runs:
    root = a.workdir or tempfile.mkdtemp(prefix='bench_seeds_')
    try:
      result['runs'] = time_runs(a.seeds, a.train_steps, root, a.program)
    finally:
      if not a.workdir:
        shutil.rmtree(root, ignore_errors=True)
    r = result['runs']
    print(json.dumps({k: v for k, v in r.items() if k != 'differences'}), flush=True)
    for s, d in r['differences'].items():
      print(f'seed {s}: ' + json.dumps(d), flush=True)
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()
