"""Training speed of a hybrid (Gated DeltaNet + attention, issue 58) against an all-attention
model of the same width and depth, as a ratio measured in one process.

Both are configs/<variant>.py:hybrid_tiny (4 layers, hidden 128, G1 elementwise gate by
default): the hybrid as the scale builds it (three Gated DeltaNet layers, chunked delta rule,
then one attention layer), the other with every layer attention (`model.layer_types=()`, all
else equal: partial RoPE, zero-centred norms, the same FFNs). Each times the jitted training
step (train.Setup.train_step: forward, backward, clipping, AdamW; float32 on CPU) on
`--batch` x `--seq_len` tokens (default 1 x 4096), round-robin (`--steps` steps of each per
round, `--rounds` rounds) so that a busy machine slows both alike; the median round is
reported, and the goal of issue 58: hybrid / attention step time <= 1.5.

  nice -n 10 python -m benchmarks.hybrid [--seq_len=4096] [--batch=1] [--steps=2] [--rounds=5]
                                        [--variant=g1_elementwise] [--chunk=64] [--json=PATH]
"""

import argparse
import importlib
import json

from benchmarks import throughput

GOAL = 1.5   # issue 58: the chunked DeltaNet trains within 1.5x of the all-attention model


def configs(variant: str, seq_len: int, batch: int, chunk: int) -> dict:
  """{'hybrid': ..., 'attention': ...}: configs/<variant>.py:hybrid_tiny, and the same with every
  layer attention."""
  out = {}
  for name in ('hybrid', 'attention'):
    c = importlib.import_module(f'configs.{variant}').get_config('hybrid_tiny')
    c.data.seq_len, c.train.batch_size = seq_len, batch
    c.model.deltanet.chunk_size = chunk
    if name == 'attention':
      c.model.layer_types = ()
    out[name] = c
  return out


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--seq_len', type=int, default=4096)
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--steps', type=int, default=2, help='steps of each model per round')
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--variant', default='g1_elementwise')
  p.add_argument('--chunk', type=int, default=64, help='the delta rule\'s chunk (tokens)')
  p.add_argument('--json', default='', help='also write the result to this file')
  args = p.parse_args(argv)
  timers = {name: throughput.StepTimer(c)
            for name, c in configs(args.variant, args.seq_len, args.batch, args.chunk).items()}
  throughput.interleave(timers, args.rounds, args.steps)
  summary = {name: t.summary() for name, t in timers.items()}
  ratio = summary['hybrid']['step_s'] / summary['attention']['step_s']
  per_round = [h / a for h, a in zip(timers['hybrid'].seconds[1:], timers['attention'].seconds[1:])]
  result = dict(variant=args.variant, seq_len=args.seq_len, batch=args.batch, chunk=args.chunk,
                rounds=args.rounds, steps=args.steps, models=summary, ratio=ratio,
                ratio_per_round=per_round, goal=GOAL, within_goal=ratio <= GOAL)
  for name, s in summary.items():
    print(f'{name:10s} {s["step_s"] * 1e3:9.1f} ms/step  {s["tokens_per_s"]:9.0f} tokens/s')
  print(f'hybrid / attention step time: {ratio:.3f} (per round: '
        f'{", ".join(f"{r:.2f}" for r in per_round)}); goal <= {GOAL}: '
        f'{"met" if ratio <= GOAL else "NOT met"}')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == '__main__':
  main()
