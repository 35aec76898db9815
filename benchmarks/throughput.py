"""Training-step throughput of the baseline and the G1 gates (issue 14), and the gate's overhead.

Times the jitted training step (train.Setup.train_step: forward, backward, global-norm clipping,
AdamW; float32 on CPU) of each variant at one of the shapes of benchmarks/shapes.py:
  a: 4 layers, d=256, 4 query / 2 KV heads of 64, SwiGLU 768, 16 x 256 tokens per step
  b: 4 layers, d=512, 8 query / 4 KV heads of 64, SwiGLU 1536, 8 x 512 tokens per step
All variants are compiled first and then timed in one process, round-robin (`--steps` steps of
each variant per round, `--rounds` rounds), so a busy machine slows them alike; the median round
is reported. Per variant: tokens/s, achieved FLOP/s (model.train_flops_per_token: 6 x the matmul
parameters + the causal attention, per token), the fraction of a matmul peak this script
measures itself (the median of float32 2048 x 2048 matmuls, jitted: a practical peak of this
machine, not the vendor's), and the gate's overhead: the variant's step time over the
baseline's, and the gate's share of the gated step (1 - baseline / gated step time: the paper's
"under 2% wall-time" overhead, Qiu et al. 2025, Sec. 1), paired within each round (the two timed
back to back), its median and 95% t interval over the rounds, beside the gate's share of the
step's FLOPs (what the arithmetic alone predicts). The G1 gates use the fused query-and-gate projection (model.fused_gate_projection,
gating.py); `--separate_gate` times the separate projection instead.

With `--pytorch`, the same variants in stock transformers Qwen3 on torch (the gate added as the
authors do: benchmarks/reference_pytorch.py) join the round-robin in this process, so each round
times JAX and PyTorch back to back, and the ratio JAX / PyTorch tokens/s is printed per variant.
Interleaving matters here: on a shared 2-core machine the speed drifts by 20-40% over minutes
(the same JAX step measured 1.3 s and 2.0 s within a quarter of an hour), so a PyTorch run
started after the JAX one measures a different machine. Neither library computes while the
other does; their thread pools only idle (torch's OpenMP threads spin for a moment first).
`--compare_cpu_options` adds each variant compiled with XLA's default options rather than the
project's (runs/factory.py CPU_COMPILER_OPTIONS), to the same round-robin.

  python -m benchmarks.throughput [--shape=a|b] [--steps=10] [--rounds=5]
                                  [--variants=baseline,g1_headwise,g1_elementwise] [--pytorch]
                                  [--compare_cpu_options]
"""

import importlib
import json
import os
import time

import numpy as np

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from benchmarks import shapes
from gated_attention.model import attention_kernels  # noqa: E402
from gated_attention import sharding
from gated_attention.training import train
from gated_attention.model import transformer as model_lib  # noqa: E402


def shape_config(variant: str, shape: str, fused_gate: bool = True):
  """configs/<variant>.py at the tiny scale, resized to `shape` (benchmarks/shapes.py)."""
  c = importlib.import_module(f'configs.{variant}').get_config('tiny')
  c.model.update(shapes.model_fields(shape), fused_gate_projection=fused_gate)
  c.data.seq_len = shapes.SHAPES[shape]['seq_len']
  c.train.batch_size = shapes.SHAPES[shape]['batch']
  return c


class StepTimer:
  """One config's compiled training step on the default devices, with a random batch."""

  def __init__(self, config, seed: int = 0, cpu_compiler_options=None):
    self.config = config
    self.mesh = sharding.build_mesh(config.mesh)
    self.setup = train.Setup(config, self.mesh, cpu_compiler_options)
    B, T = config.train.batch_size, config.data.seq_len
    toks = np.random.default_rng(seed).integers(0, config.model.vocab_size, (B, T + 1))
    batch = {'inputs': toks[:, :-1].astype(np.int32), 'targets': toks[:, 1:].astype(np.int32),
             'loss_mask': np.ones((B, T), np.float32)}
    with jax.set_mesh(self.mesh):
      self.batch = self.setup.global_batch(batch)
    self.state = self.setup.init(seed)
    self.tokens_per_step = B * T
    self.flops_per_token = model_lib.train_flops_per_token(self.setup.model_cfg, T)
    self.seconds = []                                       # per step, one entry per round
    self.run(1)                                             # compile

  def run(self, steps: int) -> float:
    """Runs `steps` steps; returns (and records) the seconds per step."""
    with jax.set_mesh(self.mesh):
      params, opt = self.state
      start = time.perf_counter()
      for _ in range(steps):
        params, opt, metrics = self.setup.train_step(params, opt, self.batch, 1.0)
      jax.block_until_ready(metrics)
      dt = (time.perf_counter() - start) / steps
    self.state = (params, opt)
    self.seconds.append(dt)
    return dt

  def summary(self) -> dict:
    """Median seconds per step (compilation excluded), tokens/s, achieved FLOP/s."""
    step_s = float(np.median(self.seconds[1:] or self.seconds))
    return dict(step_s=step_s, tokens_per_s=self.tokens_per_step / step_s,
                flops_per_s=self.flops_per_token * self.tokens_per_step / step_s,
                flops_per_token=self.flops_per_token)


def interleave(timers: dict, rounds: int, steps: int):
  """`rounds` round-robin rounds of `steps` steps of every timer."""
  for _ in range(rounds):
    for t in timers.values():
      t.run(steps)


def matmul_peak(n: int = 2048, rounds: int = 10, dtype=jnp.float32) -> float:
  """FLOP/s of a jitted n x n matmul on the default device, the median of `rounds`."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(jnp.matmul)
  jax.block_until_ready(f(a, b))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(f(a, b))
    times.append(time.perf_counter() - start)
  return 2.0 * n ** 3 / float(np.median(times))


def gate_share(timer: StepTimer, base: StepTimer) -> dict:
  """The gate's share of the gated step, 1 - baseline / gated step time, within each round (the
  two timed back to back; the compiling step left out): the median, mean and 95% t interval over
  rounds, and the gate's share of the step's FLOPs (train_flops_per_token)."""
  from experiments import stats  # pylint: disable=g-import-not-at-top
  shares = 1 - np.asarray(base.seconds[1:]) / np.asarray(timer.seconds[1:])
  t = stats.t_interval(shares) if len(shares) else {'mean': None, 'interval': None}
  return {'time_share_median': float(np.median(shares)) if len(shares) else None,
          'time_share_mean': t['mean'], 'time_share_interval': t['interval'],
          'flops_share': 1 - base.flops_per_token / timer.flops_per_token}


def rows(summaries: dict, peak_flops: float, timers: dict | None = None) -> list[dict]:
  """Per variant: the summary, the fraction of the matmul peak and the overhead over the
  baseline (step time ratio; None without a baseline); with `timers`, the gate's share
  (gate_share) of each variant against the baseline."""
  base = summaries.get('baseline')
  out = [dict(variant=name, **s, peak_fraction=s['flops_per_s'] / peak_flops,
              overhead_vs_baseline=s['step_s'] / base['step_s'] if base else None)
         for name, s in summaries.items()]
  if timers and 'baseline' in timers:
    for r in out:
      if r['variant'] != 'baseline' and r['variant'] in timers:
        r.update(gate_share(timers[r['variant']], timers['baseline']))
  return out


def pytorch_timers(variants, shape: str) -> dict:
  """benchmarks/reference_pytorch.py's step timers for `variants` (torch on every core this
  process may use), to interleave with the JAX ones."""
  from benchmarks import reference_pytorch  # pylint: disable=g-import-not-at-top  (needs torch)
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  return {v: reference_pytorch.StepTimer(v, shape) for v in variants}


def paired_ratio(jax_timer: StepTimer, torch_timer) -> float:
  """JAX / PyTorch tokens/s: the median over rounds of the ratio within each round (the two
  timed back to back), which cancels the machine's drift between rounds."""
  jax_s = np.asarray(jax_timer.seconds[1:])               # [0] is the compiling step
  torch_s = np.asarray(torch_timer.seconds)
  return float(np.median(torch_s / jax_s))


def print_table(table: list[dict], peak_flops: float):
  print(f'matmul peak (float32 2048^3, median): {peak_flops / 1e9:.1f} GFLOP/s')
  head = ('| variant | tokens/s | GFLOP/s | of matmul peak | step vs baseline | gate\'s share of '
          'step time (median; mean, 95% interval) | gate\'s share of FLOPs |')
  torch = 'jax_over_pytorch' in table[0]
  if torch:
    head += ' PyTorch tokens/s | JAX / PyTorch (paired) |'
  print(head + '\n' + '|---' * head.count(' | ') + '|---|')
  for r in table:
    over = '' if r['overhead_vs_baseline'] is None else f'{r["overhead_vs_baseline"]:.3f}'
    share = flops = ''
    if r.get('time_share_median') is not None:
      share = f'{100 * r["time_share_median"]:.1f}%; {100 * r["time_share_mean"]:.1f}%'
      if r['time_share_interval']:
        share += ' [{:.1f}%, {:.1f}%]'.format(*(100 * x for x in r['time_share_interval']))
      flops = f'{100 * r["flops_share"]:.1f}%'
    line = (f'| {r["variant"]} | {r["tokens_per_s"]:,.0f} | {r["flops_per_s"] / 1e9:.1f} | '
            f'{r["peak_fraction"]:.2f} | {over} | {share} | {flops} |')
    if torch:
      line += (f' {r["pytorch_tokens_per_s"]:,.0f} | {r["jax_over_pytorch"]:.2f} |'
               if 'jax_over_pytorch' in r else ' | |')
    print(line)


def main():
  parser = shapes.parser(__doc__.split('\n')[0])
  parser.add_argument('--separate_gate', action='store_true',
                      help='time the separate gate projection (model.fused_gate_projection=False)')
  parser.add_argument('--compare_cpu_options', action='store_true',
                      help="also time each variant compiled with XLA's default options instead "
                           'of factory.CPU_COMPILER_OPTIONS (rows "<variant> (XLA defaults)")')
  parser.add_argument('--pytorch', action='store_true',
                      help='also time benchmarks/reference_pytorch.py, interleaved, and print the ratio')
  args = parser.parse_args()
  variants = shapes.variants(parser, args)
  timers = {v: StepTimer(shape_config(v, args.shape, not args.separate_gate)) for v in variants}
  torch_timers = pytorch_timers(variants, args.shape) if args.pytorch else {}
  cfg = next(iter(timers.values())).setup.model_cfg
  T = shapes.SHAPES[args.shape]['seq_len']
  core = attention_kernels.choose(cfg.attention_impl, cfg.platform, cfg.compute_dtype, T,
                                  cfg.head_dim, cfg.attention_block_q, cfg.attention_block_kv)
  print(f'shape {args.shape} {shapes.SHAPES[args.shape]}, {jax.default_backend()}, '
        f'attention core {core}, scan_layers={cfg.scan_layers}, '
        f'{args.rounds} rounds x {args.steps} steps'
        + (', PyTorch interleaved' if torch_timers else ''), flush=True)
  default_timers = {v: StepTimer(shape_config(v, args.shape, not args.separate_gate),
                                 cpu_compiler_options={})
                    for v in (variants if args.compare_cpu_options else ())}
  order = {}                 # each variant's JAX step, then its PyTorch one and XLA-default one
  for v in variants:
    order[v] = timers[v]
    if v in torch_timers:
      order['torch', v] = torch_timers[v]
    if v in default_timers:
      order[f'{v} (XLA defaults)'] = default_timers[v]
  interleave(order, args.rounds, args.steps)
  peak = matmul_peak()
  table = rows({v: t.summary() for v, t in order.items() if not isinstance(v, tuple)}, peak,
               {v: t for v, t in order.items() if not isinstance(v, tuple)})
  for r in table:
    if r['variant'] in torch_timers:
      torch_timer = torch_timers[r['variant']]
      r.update(pytorch_tokens_per_s=torch_timer.summary()['tokens_per_s'],
               jax_over_pytorch=paired_ratio(timers[r['variant']], torch_timer))
  print(json.dumps(table, indent=2))
  print_table(table, peak)


if __name__ == '__main__':
  main()
