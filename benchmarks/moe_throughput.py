"""Training throughput of `moe_tiny` against a dense model with the same activated parameters.

The dense twin replaces each MoE layer by one SwiGLU of width top_k * expert_ffn_size (the
activated expert width), so both models do the same matmul FLOPs per token apart from routing.
All models are timed in one process, interleaved round by round, and reported as tokens/s and as
ratios to the dense twin (absolute numbers on a shared CPU are noisy; the ratios much less so).

  python benchmarks/moe_throughput.py [--variant=g1_elementwise] [--rounds=5] [--steps=10]
"""

import argparse
import importlib
import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gated_attention import model as model_lib  # noqa: E402
from gated_attention import sharding, train  # noqa: E402


def configs(variant: str):
  moe = importlib.import_module(f'configs.{variant}').get_config('moe_tiny')
  capacity = importlib.import_module(f'configs.{variant}').get_config('moe_tiny')
  capacity.model.moe.dispatch = 'capacity'
  dense = importlib.import_module(f'configs.{variant}').get_config('tiny')
  dense.model.ffn_size = moe.model.moe.top_k * moe.model.moe.expert_ffn_size
  dense.model.tie_embeddings = moe.model.tie_embeddings
  return {'moe_tiny (dropless)': moe, 'moe_tiny (capacity 1.25)': capacity,
          'dense, same activated params': dense}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--variant', default='g1_elementwise')
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=10)
  args = parser.parse_args()
  runs = {}
  for name, c in configs(args.variant).items():
    mesh = sharding.build_mesh(c.mesh)
    setup = train.Setup(c, mesh)
    params, opt = setup.init(0)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 257, (c.train.batch_size, c.data.seq_len + 1)).astype(np.int32)
    batch = {'inputs': toks[:, :-1], 'targets': toks[:, 1:],
             'loss_mask': np.ones((c.train.batch_size, c.data.seq_len), np.float32)}
    with jax.set_mesh(mesh):
      batch = setup.global_batch(batch)
      params, opt, m = setup.train_step(params, opt, batch, 1.0)  # compile
      jax.block_until_ready(m)
    report = model_lib.param_report(setup.model_cfg)
    runs[name] = dict(setup=setup, mesh=mesh, state=(params, opt), batch=batch, times=[],
                      tokens=c.train.batch_size * c.data.seq_len, total=report['total'],
                      active=report['active'])
  for _ in range(args.rounds):
    for r in runs.values():
      with jax.set_mesh(r['mesh']):
        params, opt = r['state']
        t = time.perf_counter()
        for _ in range(args.steps):
          params, opt, m = r['setup'].train_step(params, opt, r['batch'], 1.0)
        jax.block_until_ready(m)
        r['times'].append((time.perf_counter() - t) / args.steps)
        r['state'] = (params, opt)
  dense = min(runs['dense, same activated params']['times'])
  rows = []
  for name, r in runs.items():
    best = min(r['times'])
    rows.append({'model': name, 'total_params': r['total'], 'active_params': r['active'],
                 'step_s_best': best, 'step_s_median': float(np.median(r['times'])),
                 'tokens_per_s': r['tokens'] / best, 'speed_vs_dense': dense / best})
  print(json.dumps(rows, indent=2))
  print('\n| model | total params | active params | tokens/s | speed vs dense |')
  print('|---|---|---|---|---|')
  for row in rows:
    print(f'| {row["model"]} | {row["total_params"]:,} | {row["active_params"]:,} | '
          f'{row["tokens_per_s"]:,.0f} | {row["speed_vs_dense"]:.2f} |')


if __name__ == '__main__':
  main()
