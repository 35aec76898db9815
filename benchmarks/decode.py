"""Decode speed with and without the KV cache (gated_attention/inference/generate.py).

Without the cache every new token runs the model over the whole sequence so far (at the fixed
length prompt + new tokens, so nothing recompiles); with it, one token per step attends to the
cache. Both are timed after a warm-up call (compilation excluded), interleaved round by round in
one process, on a freshly initialised model of the config (speed does not depend on training):
new tokens per second and the cache's speed-up.

  python -m benchmarks.decode [--config=g1_elementwise:tiny] [--batch=1,8] [--prompt_len=32]
                              [--new_tokens=224] [--rounds=3]
"""

import argparse
import importlib
import json
import time

import numpy as np

from flax import nnx
from gated_attention.inference import generate
from gated_attention.model import transformer as model
from gated_attention.model.config import ModelConfig


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--config', default='g1_elementwise:tiny', help='<variant>:<scale>')
  parser.add_argument('--batch', default='1,8')
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--new_tokens', type=int, default=224)
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  variant, scale = (args.config.split(':') + ['tiny'])[:2]
  cfg = ModelConfig.from_config(importlib.import_module(f'configs.{variant}').get_config(scale).model)
  gen = generate.Generator(model.Transformer(cfg, rngs=nnx.Rngs(0)),
                           max_len=args.prompt_len + args.new_tokens)
  rng = np.random.default_rng(0)
  results = []
  for batch in [int(b) for b in args.batch.split(',')]:
    prompts = rng.integers(0, cfg.vocab_size, (batch, args.prompt_len)).tolist()
    times = {True: [], False: []}
    for r in range(args.rounds + 1):  # round 0 compiles
      for use_cache in (True, False):
        t0 = time.perf_counter()
        out = gen.generate(prompts, max_new_tokens=args.new_tokens, use_cache=use_cache)
        if r:
          times[use_cache].append(time.perf_counter() - t0)
    new = out.new_tokens
    row = {'batch': batch, 'prompt_len': args.prompt_len, 'new_tokens_per_sequence':
           args.new_tokens,
           'cache_tokens_per_s': new / float(np.median(times[True])),
           'no_cache_tokens_per_s': new / float(np.median(times[False]))}
    row['speedup'] = row['cache_tokens_per_s'] / row['no_cache_tokens_per_s']
    results.append(row)
    print(f'{variant}:{scale} batch {batch}: with cache {row["cache_tokens_per_s"]:.0f} '
          f'tokens/s, without {row["no_cache_tokens_per_s"]:.0f} tokens/s '
          f'({row["speedup"]:.1f}x), prompt {args.prompt_len} + {args.new_tokens} new tokens, '
          f'median of {args.rounds} rounds', flush=True)
  print(json.dumps(results))


if __name__ == '__main__':
  main()
