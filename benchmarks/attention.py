"""Attention cores (gated_attention/model/attention_kernels.py), forward + backward, by sequence length.

Times the gradient of sum(attention(q, k, v)^2) after a warm-up call (compilation excluded), the
best of --rounds, with the same number of tokens at every length (batch = --tokens / T), on the
default backend. The CPU choice of 'auto' (attention_kernels.choose: chunked up to
CHUNKED_MAX_T_CPU, then blockwise) was made from its output at three head dims.

`--pytorch` adds PyTorch's fused causal attention (torch.nn.functional.scaled_dot_product_attention
with enable_gqa, on the CPU with one torch thread per core this process may use; torch==2.13.0 from
requirements-test.txt) as the last column: the same inputs and loss, timed the same way, and the
largest difference of its gradients from the first JAX implementation's. docs/performance.md
uses it for the training-speed shapes (benchmarks/shapes.py):

  python -m benchmarks.attention --lengths=256 --tokens=4096 --heads=4,2,64 --rounds=15 --pytorch
  python -m benchmarks.attention --lengths=512 --tokens=4096 --heads=8,4,64 --rounds=7 --pytorch

  python -m benchmarks.attention [--lengths=128,256,512,1024,2048]
                                 [--impls=xla,blockwise:128,chunked:128]
                                 [--heads=4,2,32] [--tokens=4096] [--rounds=3] [--pytorch]
"""

import argparse
import os
import time

import numpy as np

import jax
import jax.numpy as jnp
from gated_attention.model import attention_kernels


def inputs(T: int, B: int, heads) -> tuple[np.ndarray, ...]:
  """q [B, T, H, d], k and v [B, T, K, d], float32, standard normal (seed 0)."""
  H, K, d = heads
  rng = np.random.default_rng(0)
  return tuple(rng.normal(size=(B, T, n, d)).astype(np.float32) for n in (H, K, K))


def _best(call, rounds: int) -> float:
  best = float('inf')
  for _ in range(rounds):
    start = time.perf_counter()
    call()
    best = min(best, time.perf_counter() - start)
  return best


def jax_grads(impl: str, block: int, q, k, v):
  """The compiled gradient of sum(attention(q, k, v)^2) and its value at (q, k, v)."""
  loss = lambda q, k, v: jnp.sum(attention_kernels.attend(  # noqa: E731
      q, k, v, impl, block_q=block, block_kv=block) ** 2)
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  args = tuple(jnp.asarray(x) for x in (q, k, v))
  return (lambda: jax.block_until_ready(step(*args))), jax.block_until_ready(step(*args))


def pytorch_grads(q, k, v):
  """PyTorch's SDPA (causal, GQA) for the same loss: a call that runs forward + backward, and
  the gradients of the first call in JAX's [B, T, heads, d] layout."""
  import torch  # pylint: disable=g-import-not-at-top  (only with --pytorch)
  torch.set_num_threads(len(os.sched_getaffinity(0)))   # the cores this process may use
  qt, kt, vt = (torch.from_numpy(x).transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))

  def call():
    for x in (qt, kt, vt):
      x.grad = None
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                                           enable_gqa=True)
    (out ** 2).sum().backward()

  call()
  return call, tuple(x.grad.transpose(1, 2).numpy() for x in (qt, kt, vt))


def max_difference(a, b) -> float:
  """The largest |a - b| over the three gradients."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--lengths', default='128,256,512,1024,2048')
  parser.add_argument('--impls', default='xla,blockwise:128,chunked:128', help='impl[:block],...')
  parser.add_argument('--heads', default='4,2,32', help='H,K,d (the tiny model: 4,2,32)')
  parser.add_argument('--tokens', type=int, default=4096)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--pytorch', action='store_true',
                      help="add PyTorch's fused SDPA (CPU; needs torch, requirements-test.txt)")
  args = parser.parse_args()
  heads = tuple(int(x) for x in args.heads.split(','))
  print(f'{jax.default_backend()}: ms per forward + backward, {args.tokens} tokens, H,K,d={heads}')
  for T in (int(x) for x in args.lengths.split(',')):
    row, first = [], None
    qkv = inputs(T, max(1, args.tokens // T), heads)
    for spec in args.impls.split(','):
      impl, _, block = spec.partition(':')
      call, grads = jax_grads(impl, int(block or 0), *qkv)
      first = grads if first is None else first
      row.append(f'{spec} {1e3 * _best(call, args.rounds):7.1f}')
    if args.pytorch:
      call, grads = pytorch_grads(*qkv)
      row.append(f'pytorch_sdpa {1e3 * _best(call, args.rounds):7.1f} '
                 f'(grads within {max_difference(grads, first):.1e})')
    print(f'T={T:5d}  ' + '  '.join(row), flush=True)


if __name__ == '__main__':
  main()
