"""Training throughput, MFU and peak memory on one NVIDIA GPU (issue 14, item 5).

For each model, a few training steps (train.Setup.train_step: forward, backward, AdamW; bf16
compute, float32 parameters) on random tokens, after one compiling step:
  tiny            the tiny scale's model (0.9 M parameters, 128 tokens), batch 256
  dense_100m      the dense_90m scale (12 layers, d=768, 2,048 tokens), batch 32
  dense_1p7b_28l  the paper's 1.7B dense model (28 layers, 4,096 tokens, full remat), batch 16
Each model runs in its own subprocess, so its peak memory is its own (the device's
memory_stats()['peak_bytes_in_use']) and an out-of-memory batch is retried at half the size
(down to 1). Reported: tokens/s, achieved TFLOP/s (model.train_flops_per_token: 6 x the matmul
parameters + causal attention, without the remat recomputation), MFU against the chip's dense
bf16 peak (gated_attention/chips.py: A100 / H100 / H200 SXM), peak GiB. The defaults take about
5 minutes on an H100 / H200 (mostly the 1.7B model's compilation); `--budget_s` skips the models
that would start after it.

XLA flags (set in XLA_FLAGS unless XLA_FLAGS already names them; see
https://docs.jax.dev/en/latest/gpu_performance_tips.html and NVIDIA JAX-Toolbox's
https://docs.nvidia.com/jax-toolbox/performance-profiling/gpu-performance):
  --xla_gpu_enable_latency_hiding_scheduler=true   schedules to overlap communication (and
        asynchronous copies) with compute; JAX-Toolbox's default; matters most with several GPUs
  --xla_gpu_enable_triton_gemm=false   plain GEMMs go to cuBLAS(Lt) rather than XLA's Triton GEMM
        emitter (JAX-Toolbox's recommendation for LLM training; set true to compare)
  --xla_gpu_enable_command_buffer      left at XLA's default (CUDA graphs for fusions, cuBLAS
        and custom calls: fewer kernel launches); `--xla_gpu_enable_command_buffer=` turns them
        off, e.g. for a readable profile
and XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 (JAX preallocates 75% of the GPU otherwise) unless set.
Without a GPU the script refuses with a message saying so.

  python -m benchmarks.gpu [--models=tiny,dense_100m,dense_1p7b_28l] [--variant=g1_elementwise]
                           [--steps=5] [--budget_s=480] [--overhead [--rounds=5]]

With `--overhead`, each model's child times the baseline and the variant in one process,
round-robin (`--rounds` rounds of `--steps` steps of each, after compiling both), and reports the
gate's share of the gated step, 1 - baseline / gated step time, paired within each round (median,
mean and 95% t interval over rounds), beside its share of the FLOPs: the paper's "under 2%
wall-time" overhead (Qiu et al. 2025, Sec. 1) measured on the accelerator
(benchmarks/throughput.py measures it on a CPU).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# model name -> (scale of gated_attention/config/scales.py, first batch size to try)
MODELS = {'tiny': ('tiny', 256), 'dense_100m': ('dense_90m', 32),
          'dense_1p7b_28l': ('dense_1p7b_28l', 16)}
XLA_FLAGS = {'--xla_gpu_enable_latency_hiding_scheduler': 'true',
             '--xla_gpu_enable_triton_gemm': 'false'}
MEM_FRACTION = '0.9'
OOM_MARKERS = ('RESOURCE_EXHAUSTED', 'Out of memory', 'out of memory')
RESULT = 'RESULT '


class NoGPU(SystemExit):
  pass


def with_xla_flags(existing: str) -> str:
  """`existing` XLA_FLAGS plus each flag of XLA_FLAGS that it does not name."""
  named = {f.split('=')[0] for f in existing.split()}
  added = [f'{k}={v}' for k, v in XLA_FLAGS.items() if k not in named]
  return ' '.join([existing.strip(), *added]).strip()


def child_env(env: dict) -> dict:
  """The environment of a measuring subprocess: the flags above where not set."""
  env = dict(env, XLA_FLAGS=with_xla_flags(env.get('XLA_FLAGS', '')))
  env.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', MEM_FRACTION)
  return env


def require_gpu(backend: str, devices: list) -> None:
  """Raises NoGPU (exits with its message) unless JAX's default backend is an NVIDIA GPU."""
  kinds = sorted({d.device_kind for d in devices})
  if backend != 'gpu' or not any('NVIDIA' in k.upper() for k in kinds):
    raise NoGPU(f'benchmarks/gpu.py needs an NVIDIA GPU, but JAX\'s default backend is '
                f'{backend!r} with devices {kinds}. Run it on a GPU host with jax[cuda12] '
                '(pip install -U "jax[cuda12]"); benchmarks/throughput.py times the CPU.')


def batch_sizes(first: int) -> list[int]:
  """The batch sizes to try, halving after each out-of-memory failure: 16 -> 16, 8, 4, 2, 1."""
  if first < 1:
    raise ValueError(f'batch size must be positive, got {first}')
  sizes = [first]
  while sizes[-1] > 1:
    sizes.append(sizes[-1] // 2)
  return sizes


def is_oom(stderr: str) -> bool:
  return any(m in stderr for m in OOM_MARKERS)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
  """Model FLOPs utilisation: achieved model FLOP/s over the chip's dense bf16 peak."""
  return tokens_per_s * flops_per_token / peak_flops if peak_flops else None


def gpu_config(model: str, variant: str, batch: int):
  """configs/<variant>.py at the model's scale, bf16 compute, `batch` sequences per step."""
  import importlib  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(f'configs.{variant}').get_config(MODELS[model][0])
  c.model.dtype = 'bfloat16'
  c.train.update(batch_size=batch, grad_accum=1)
  c.mesh.update(data=-1, fsdp=1, rules='data_parallel')   # one device
  return c


def measure(model: str, variant: str, batch: int, steps: int) -> dict:
  """In this process (a child): compile, time `steps` steps; the row of the report."""
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import throughput  # pylint: disable=g-import-not-at-top
  from gated_attention import chips  # pylint: disable=g-import-not-at-top
  require_gpu(jax.default_backend(), jax.devices())
  device = jax.devices()[0]
  start = time.perf_counter()
  timer = throughput.StepTimer(gpu_config(model, variant, batch))
  compile_s = time.perf_counter() - start
  timer.run(steps)
  s = timer.summary()
  chip = chips.chip_spec(device.device_kind)
  peak = chip['peak_bf16_flops'] if chip else None
  return dict(model=model, variant=variant, batch=batch, seq_len=timer.config.data.seq_len,
              params=_params(timer), device=device.device_kind,
              tokens_per_s=s['tokens_per_s'], tflops_per_s=s['flops_per_s'] / 1e12,
              mfu=mfu(s['tokens_per_s'], s['flops_per_token'], peak),
              peak_gib=device.memory_stats()['peak_bytes_in_use'] / 2**30,
              step_s=s['step_s'], first_step_s=compile_s)


def measure_overhead(model: str, variant: str, batch: int, steps: int, rounds: int) -> dict:
  """In this process (a child): the baseline's and `variant`'s steps at one batch, compiled, then
  timed round-robin; the gate's share of the gated step (throughput.gate_share)."""
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import throughput  # pylint: disable=g-import-not-at-top
  require_gpu(jax.default_backend(), jax.devices())
  timers = {'baseline': throughput.StepTimer(gpu_config(model, 'baseline', batch)),
            variant: throughput.StepTimer(gpu_config(model, variant, batch))}
  throughput.interleave(timers, rounds, steps)
  base, gated = timers['baseline'].summary(), timers[variant].summary()
  return dict(model=model, variant=variant, batch=batch,
              seq_len=timers[variant].config.data.seq_len, device=jax.devices()[0].device_kind, baseline_step_s=base['step_s'],
              step_s=gated['step_s'], rounds=rounds, steps=steps,
              **throughput.gate_share(timers[variant], timers['baseline']))


def print_overhead(rows: list[dict]):
  print('| model | batch x seq | baseline step s | gated step s | gate\'s share of step time '
        '(median; mean, 95% interval) | gate\'s share of FLOPs |')
  print('|---|---|---|---|---|---|')
  for r in rows:
    lo, hi = r['time_share_interval'] or (float('nan'), float('nan'))
    print(f'| {r["model"]} | {r["batch"]} x {r["seq_len"]} | {r["baseline_step_s"]:.4f} | '
          f'{r["step_s"]:.4f} | {100 * r["time_share_median"]:.2f}%; '
          f'{100 * r["time_share_mean"]:.2f}% [{100 * lo:.2f}%, {100 * hi:.2f}%] | '
          f'{100 * r["flops_share"]:.2f}% |')


def _params(timer) -> int:
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  return model_lib.param_report(timer.setup.model_cfg)['total']


def run_child(model: str, variant: str, batch: int, steps: int, timeout: float, env: dict,
              rounds: int = 0):
  """(row or None, error text or None, out of memory?) of one measuring subprocess, run with
  the environment `env`; `rounds` > 0: the gate's overhead (measure_overhead)."""
  cmd = [sys.executable, '-m', 'benchmarks.gpu', f'--child={model}', f'--variant={variant}',
         f'--batch={batch}', f'--steps={steps}'] + (['--overhead', f'--rounds={rounds}']
                                                    if rounds else [])
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env=env)
  except subprocess.TimeoutExpired:
    return None, f'timed out after {timeout:.0f} s', False
  for line in p.stdout.splitlines():
    if line.startswith(RESULT):
      return json.loads(line[len(RESULT):]), None, False
  return None, (p.stderr or p.stdout).strip()[-2000:], is_oom(p.stderr)


def run_model(model: str, args, deadline: float, env: dict) -> dict | None:
  """The report row of `model` at the largest batch that fits, or None (failed, or out of
  time)."""
  for batch in batch_sizes(MODELS[model][1]):
    left = deadline - time.time()
    if left < 30:
      print(f'{model}: skipped, --budget_s spent', flush=True)
      return None
    row, err, oom = run_child(model, args.variant, batch, args.steps, left, env,
                              args.rounds if args.overhead else 0)
    if row:
      return row
    if oom:
      print(f'{model}: batch {batch} out of memory, halving', flush=True)
      continue
    if err and 'needs an NVIDIA GPU' in err:
      raise NoGPU(err.splitlines()[-1])
    print(f'{model}: failed at batch {batch}:\n{err}', flush=True)
    return None
  return None


def print_table(rows: list[dict]):
  print('| model | params | batch x seq | tokens/s | TFLOP/s | MFU | peak GiB | first step s |')
  print('|---|---|---|---|---|---|---|---|')
  for r in rows:
    m = 'n/a' if r['mfu'] is None else f'{r["mfu"]:.1%}'
    print(f'| {r["model"]} | {r["params"] / 1e6:,.1f} M | {r["batch"]} x {r["seq_len"]} | '
          f'{r["tokens_per_s"]:,.0f} | {r["tflops_per_s"]:.1f} | {m} | {r["peak_gib"]:.1f} | '
          f'{r["first_step_s"]:.0f} |')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default=','.join(MODELS))
  parser.add_argument('--variant', default='g1_elementwise')
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--budget_s', type=float, default=480.0)
  parser.add_argument('--overhead', action='store_true',
                      help='time the baseline and --variant round-robin: the gate\'s share')
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--child', default='', help=argparse.SUPPRESS)
  parser.add_argument('--batch', type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    row = (measure_overhead(args.child, args.variant, args.batch, args.steps, args.rounds)
           if args.overhead else measure(args.child, args.variant, args.batch, args.steps))
    print(RESULT + json.dumps(row))
    return
  models = args.models.split(',')
  if set(models) - set(MODELS) or args.steps < 1:
    parser.error(f'--models from {", ".join(MODELS)}; --steps >= 1.')
  env = child_env(dict(os.environ))
  os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'   # this process only checks the GPU
  import jax  # pylint: disable=g-import-not-at-top
  require_gpu(jax.default_backend(), jax.devices())
  deadline = time.time() + args.budget_s
  rows = [r for r in (run_model(m, args, deadline, env) for m in models) if r]
  print(json.dumps(rows, indent=2))
  (print_overhead if args.overhead else print_table)(rows)


if __name__ == '__main__':
  main()
