"""Attention cores (gated_attention/model/attention_kernels.py), forward + backward, by sequence length.

Times the gradient of sum(attention(q, k, v)^2) after a warm-up call (compilation excluded), the
best of --rounds, with the same number of tokens at every length (batch = --tokens / T), on the
default backend. The CPU choice of 'auto' (attention_kernels.choose: chunked up to
CHUNKED_MAX_T_CPU, then blockwise) was made from its output at three head dims.

  python -m benchmarks.attention [--lengths=128,256,512,1024,2048]
                                 [--impls=xla,blockwise:128,chunked:128]
                                 [--heads=4,2,32] [--tokens=4096] [--rounds=3]
"""

import argparse
import time

import numpy as np

import jax
import jax.numpy as jnp
from gated_attention.model import attention_kernels


def time_one(impl: str, block: int, T: int, B: int, heads, rounds: int) -> float:
  """Best seconds of one forward + backward call."""
  H, K, d = heads
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(B, T, n, d)), jnp.float32) for n in (H, K, K))
  loss = lambda q, k, v: jnp.sum(attention_kernels.attend(  # noqa: E731
      q, k, v, impl, block_q=block, block_kv=block) ** 2)
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  jax.block_until_ready(step(q, k, v))
  best = float('inf')
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(step(q, k, v))
    best = min(best, time.perf_counter() - start)
  return best


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--lengths', default='128,256,512,1024,2048')
  parser.add_argument('--impls', default='xla,blockwise:128,chunked:128', help='impl[:block],...')
  parser.add_argument('--heads', default='4,2,32', help='H,K,d (the tiny model: 4,2,32)')
  parser.add_argument('--tokens', type=int, default=4096)
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  heads = tuple(int(x) for x in args.heads.split(','))
  print(f'{jax.default_backend()}: ms per forward + backward, {args.tokens} tokens, H,K,d={heads}')
  for T in (int(x) for x in args.lengths.split(',')):
    row = []
    for spec in args.impls.split(','):
      impl, _, block = spec.partition(':')
      ms = 1e3 * time_one(impl, int(block or 0), T, max(1, args.tokens // T), heads, args.rounds)
      row.append(f'{spec} {ms:7.1f}')
    print(f'T={T:5d}  ' + '  '.join(row), flush=True)


if __name__ == '__main__':
  main()
