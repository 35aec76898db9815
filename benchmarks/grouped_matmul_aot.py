"""XLA FLOPs of a grouped (expert) matmul and its gradients, compiled ahead of time for a TPU.

  python -m benchmarks.grouped_matmul_aot [--topology=v5p:2x2x1] [--groups=16] [--rows=8192]

Compiles value_and_grad(sum(grouped_matmul(x, w, group_sizes) * c)) wrt x and w for one device of
a compile-only TPU topology (libtpu, no TPU needed; see gated_attention/compile/tpu.py) with
moe.grouped_matmul = ragged_dot and = megablox, and prints XLA's cost_analysis FLOPs next to the
useful work (fwd 2MKN + input grad 2MKN + weight grad 2MKN; the group sizes sum to M). On TPU,
ragged_dot's weight gradient compiles to a dense product over all G groups (~G x 2MKN); megablox's
tgmm visits only each group's rows. Pallas kernels report the FLOPs of their CostEstimate.
"""

import argparse
import json


from gated_attention.compile import tpu  # pylint: disable=g-import-not-at-top


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--topology', default='v5p:2x2x1')
  p.add_argument('--groups', type=int, default=16)
  p.add_argument('--rows', type=int, default=8192)
  p.add_argument('--k', type=int, default=1024)
  p.add_argument('--n', type=int, default=1024)
  a = p.parse_args()
  _, devices = tpu.topology_devices(a.topology)   # prepares libtpu, keeps the default backend CPU
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from gated_attention.model import grouped_matmul  # pylint: disable=g-import-not-at-top

  G, M, K, N = a.groups, a.rows, a.k, a.n
  sh = jax.sharding.SingleDeviceSharding(devices[0])
  args = (jax.ShapeDtypeStruct((M, K), jnp.bfloat16, sharding=sh),
          jax.ShapeDtypeStruct((G, K, N), jnp.bfloat16, sharding=sh),
          jax.ShapeDtypeStruct((G,), jnp.int32, sharding=sh),
          jax.ShapeDtypeStruct((M, N), jnp.bfloat16, sharding=sh))
  useful = 2 * M * K * N
  out = {'topology': a.topology, 'device_kind': devices[0].device_kind,
         'G': G, 'M': M, 'K': K, 'N': N, 'useful_flops_per_matmul (2MKN)': useful}

  def flops(fn):
    cost = jax.jit(fn).trace(*args).lower().compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get('flops', 0.0))

  for impl in ('ragged_dot', 'megablox'):
    def loss(x, w, gs, c, impl=impl):
      return jnp.sum(grouped_matmul.grouped_matmul(x, w, gs, impl).astype(jnp.float32) * c)
    r = {
        'forward': flops(loss),
        'grad_x': flops(jax.grad(loss, 0)),
        'grad_w': flops(jax.grad(loss, 1)),
        'value_and_grad_xw': flops(jax.value_and_grad(loss, (0, 1))),
    }
    # The loss is linear in the product, so grad alone needs no forward matmul.
    r['ratios_to_useful'] = {'forward': r['forward'] / useful,
                             'grad_x (dx)': r['grad_x'] / useful,
                             'grad_w (dw)': r['grad_w'] / useful,
                             'value_and_grad_xw (fwd + dx + dw)': r['value_and_grad_xw'] / (3 * useful)}
    out[impl] = r
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
