"""Training throughput of `moe_tiny` against a dense model with the same activated parameters.

The dense twin replaces each MoE layer by one SwiGLU of width top_k * expert_ffn_size (the
activated expert width), so both models do the same matmul FLOPs per token apart from routing.
All models are timed in one process, interleaved round by round, and reported as tokens/s and as
ratios to the dense twin (absolute numbers on a shared CPU are noisy; the ratios much less so).

  python -m benchmarks.moe_throughput [--variant=g1_elementwise] [--rounds=5] [--steps=10]
"""

import argparse
import importlib
import json

import numpy as np

from benchmarks import throughput  # StepTimer, interleave
from gated_attention.model import transformer as model_lib  # pylint: disable=g-bad-import-order


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
  timers = {name: throughput.StepTimer(c) for name, c in configs(args.variant).items()}
  throughput.interleave(timers, args.rounds, args.steps)
  runs = {}
  for name, t in timers.items():
    report = model_lib.param_report(t.setup.model_cfg)
    runs[name] = dict(times=t.seconds[1:], tokens=t.tokens_per_step, total=report['total'],
                      active=report['active'])   # seconds[0]: the compiling step
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
