"""What a real int8 kernel would buy: one int8 x int8 -> int32 matmul against float32 (and
bfloat16) on this machine's backend, in one process (ratios, not absolute times).

`--mode=quantization` (inference/quantized.py) simulates quantization in float: it measures
what the integer grids do to the loss, not the speed or the memory. A deployment computes
W8A8 linears as int8 x int8 products accumulated in int32 (then rescaled by the two scales);
this benchmark asks whether XLA on this backend has such a kernel and what it is worth, with
`jax.lax.dot_general(..., preferred_element_type=jnp.int32)` on int8 operands against the same
shapes in float32. Each is compiled, checked (the int32 result equals the float64 product of the
same integers exactly), then timed interleaved round by round (median).

  python -m benchmarks.int8_matmul [--shapes=256x2048x2048,2048x2048x6144] [--rounds=7]
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np


def _operands(m, k, n, seed=0):
  rng = np.random.default_rng(seed)
  a = rng.integers(-127, 128, (m, k), dtype=np.int8)
  b = rng.integers(-127, 128, (k, n), dtype=np.int8)
  return a, b


def dot(dtype_out):
  return jax.jit(lambda a, b: jax.lax.dot_general(
      a, b, (((1,), (0,)), ((), ())), preferred_element_type=dtype_out))


def measure(m: int, k: int, n: int, rounds: int) -> dict:
  a8, b8 = _operands(m, k, n)
  cases = {'int8_int32': (dot(jnp.int32), jnp.asarray(a8), jnp.asarray(b8)),
           'float32': (dot(jnp.float32), jnp.asarray(a8, jnp.float32),
                       jnp.asarray(b8, jnp.float32)),
           'bfloat16': (dot(jnp.float32), jnp.asarray(a8, jnp.bfloat16),
                        jnp.asarray(b8, jnp.bfloat16))}
  exact = a8.astype(np.float64) @ b8.astype(np.float64)
  out = {'shape': f'{m}x{k}x{n}', 'backend': jax.default_backend(),
         'device': str(jax.devices()[0].device_kind)}
  for name, (f, a, b) in cases.items():
    try:
      r = np.asarray(f(a, b).block_until_ready(), np.float64)
    except Exception as e:  # pylint: disable=broad-except  # no kernel for this dtype here
      out[name] = {'error': f'{type(e).__name__}: {str(e)[:200]}'}
      continue
    out[name] = {'exact': bool(np.array_equal(r, exact)), 'seconds': []}
  for _ in range(rounds):
    for name, (f, a, b) in cases.items():
      if 'seconds' in out[name]:
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        out[name]['seconds'].append(time.perf_counter() - t0)
  flops = 2.0 * m * k * n
  for name in cases:
    if 'seconds' in out[name]:
      s = float(np.median(out[name].pop('seconds')))
      out[name].update(median_seconds=s, gflops=flops / s / 1e9)
  f32 = out['float32'].get('median_seconds')
  for name in ('int8_int32', 'bfloat16'):
    if f32 and 'median_seconds' in out[name]:
      out[name]['speedup_over_float32'] = f32 / out[name]['median_seconds']
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--shapes', default='256x2048x2048,2048x2048x6144',
                      help='MxKxN,... (M tokens, K inputs, N outputs)')
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args()
  rows = []
  for spec in args.shapes.split(','):
    m, k, n = (int(x) for x in spec.split('x'))
    row = measure(m, k, n, args.rounds)
    rows.append(row)
    cells = [f'{name} ' + (f'{row[name]["gflops"]:.0f} GFLOP/s' if 'gflops' in row[name]
                           else row[name].get('error', '?')) for name in
             ('float32', 'bfloat16', 'int8_int32')]
    print(f'{row["shape"]} on {row["backend"]} ({row["device"]}): ' + ', '.join(cells) +
          (f'; int8 {row["int8_int32"]["speedup_over_float32"]:.2f}x float32' if
           'speedup_over_float32' in row['int8_int32'] else ''), flush=True)
  print(json.dumps(rows))


if __name__ == '__main__':
  main()
