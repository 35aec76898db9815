"""Ahead-of-time compilation of the sharded training step for a TPU topology, on any machine.

  python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=compile --topology=v5p:4x4x4

With libtpu installed (`pip install -r requirements-tpu.txt`) JAX can describe the devices of a
TPU slice it is not running on (`jax.experimental.topologies.get_topology_desc`). `report` builds
the config's mesh on those devices (`config.mesh`, one axis -1), builds `train.Setup` on it (the
same shardings and the same jit as training), lowers the real train step (forward, backward,
AdamW update, gradient accumulation) from abstract shapes and compiles it with the TPU compiler.
Nothing is allocated and no TPU is needed. The report gives:

- memory: per-device bytes from `compiled.memory_analysis()` (arguments, outputs, aliased
  (donated) bytes, temporaries, generated code, total) against the chip's HBM. The TPU compiler
  rejects most steps that do not fit (then the report gives its "needs X, has Y" and the largest
  buffers of its memory-usage report, which libtpu writes to its log); a step that compiles but
  exceeds HBM is reported as not fitting, with the largest arrays of the compiled program.
- flops: `compiled.cost_analysis()` against the analytic count (`model.train_flops_per_token`, the
  one function training uses too). XLA's cost analysis counts the body of every while loop once,
  and the layers (scan) and micro-batches (grad_accum scan) are while loops, so the raw number
  is scaled by the loop trip counts measured on the step's jaxpr (hlo_cost.jaxpr_cost); the
  bytes accessed likewise, by trip counts read from the compiled HLO (hlo_cost.hlo_loop_cost).
- roofline: step time = max(FLOPs / peak bf16 rate, bytes accessed / HBM bandwidth) per device,
  and the MFU that implies (analytic model FLOPs / (time x peak)). It ignores communication and
  MXU efficiency: an upper bound, useful to compare meshes and variants, not a promise.
- collectives: counts by kind in the compiled program, and their result bytes per step.

The TPU slice's compile-only devices (libtpu on a machine without TPUs) are tpu.py's; the
long-context evaluation's step (--plan=long_context) is compiled by aot_long_context.py with this
module's memory and out-of-memory readers.
"""

import math
import re
import time

from gated_attention.compile import hlo_cost
from gated_attention.compile import tpu
from gated_attention.config import schema
from gated_attention.training import fit
from gated_attention.chips import CHIPS
from gated_attention.errors import UserError


def shard_bytes(tree) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def _human(n: float) -> str:
  return f'{n / 2**30:.2f}GiB' if n >= 2**30 else f'{n / 2**20:.1f}MiB'


def gib(x) -> float:
  return round(x / 2**30, 3)


_SIZE = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


def _parse_size(s: str) -> float:
  m = re.match(r'([\d.]+)\s*([KMGT]?)', s)
  return float(m.group(1)) * _SIZE[m.group(2)] if m else float('nan')


def _describe_shape(shapes: str, cfg, n_dev: int) -> str:
  """A guess at what a buffer is, from its shape(s), for the largest-buffer list."""
  m, tc, T = cfg.model, cfg.train, cfg.data.seq_len
  dims = {int(d) for d in re.findall(r'(?<=[\[,])\d+(?=[\],])', shapes)}
  micro = tc.batch_size // tc.grad_accum
  if m.moe.num_experts and dims & {tc.batch_size * T * m.moe.top_k, micro * T * m.moe.top_k}:
    return ('MoE dispatch over ALL tokens of the global (micro-)batch x top_k: the token sort / '
            'ragged_dot is not sharded, every device holds it')
  if m.moe.num_experts and dims & {micro * T * m.moe.top_k // n_dev}:
    return 'MoE dispatch (this device\'s tokens x top_k)'
  if m.vocab_size in dims and T in dims:
    return 'logits (or their gradient) [B, T, vocab]'
  if re.search(rf'\b{T},{T}\]', shapes):
    return 'attention scores/probabilities [.., T, T]'
  if m.vocab_size in dims:
    return 'embedding / LM head (or its gradient / optimizer state)'
  lead = re.match(r'\D*\[(\d+),(\d+)', shapes)
  if lead and int(lead.group(1)) == m.num_layers:
    if m.moe.num_experts and int(lead.group(2)) == m.moe.num_experts:
      return 'stacked expert weights, their gradients or AdamW moments'
    return 'stacked per-layer weights (or gradients, AdamW moments, saved activations)'
  return ''


def largest_hlo_arrays(hlo_text: str, cfg, n_dev: int, top: int = 10) -> list:
  """hlo_cost.hlo_arrays as report rows, with a guess at what each array is."""
  return [{'size': _human(size), 'count': n, 'shapes': shape, 'op': op,
           'likely': _describe_shape(shape, cfg, n_dev)}
          for shape, op, n, size in hlo_cost.hlo_arrays(hlo_text, top)]


def oom_details(err: str, cfg, n_dev: int, logs_before: dict) -> dict:
  """Compiler's 'used X of Y' and the largest buffers of its memory-usage report."""
  out = {'compiler_error': err.strip().splitlines()[0][:500]}
  m = (re.search(r'required for HLO temporaries \(([\d.]+[KMGT]?)\) exceeds available HBM '
                 r'\(([\d.]+[KMGT]?)\)', err) or
       re.search(r'Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?)', err) or
       re.search(r'Requires ([\d.]+[KMGT]?), has ([\d.]+[KMGT]?) available', err))
  report = tpu.oom_report(logs_before)
  if report:
    m = re.search(r'Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) hbm', report) or m
    rows = re.findall(r'^\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+\w+);\s*\d+;\s*(\d+);\s*(.+)$', report,
                      re.M)
    out['largest_buffers'] = [
        {'size': size, 'values': int(n), 'shapes': shapes.strip()[:200],
         'likely': _describe_shape(shapes, cfg, n_dev)} for size, n, shapes in rows[:10]]
  if m:
    out['required_bytes'] = _parse_size(m.group(1))
    out['hbm_available_to_xla_bytes'] = _parse_size(m.group(2))
  return out


# ----------------------------------------------------------------------------------------------
# The report


def _header(config, topology, devices, setup, analytic) -> dict:
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  tc, T = config.train, config.data.seq_len
  gen = tpu.parse_topology(topology)[0]
  cores_per_chip = len({getattr(d, 'core_on_chip', 0) for d in devices})
  chip = CHIPS[gen]
  params = model_lib.param_report(setup.model_cfg)
  out = {
      'config': f'{config.variant}:{config.scale}',
      'topology': f'{gen}:{topology.split(":", 1)[1]}',
      'chip': gen, 'devices': len(devices), 'devices_per_chip': cores_per_chip,
      'device_kind': devices[0].device_kind, 'mesh': dict(setup.mesh.shape),
      'rules': config.mesh.rules,
      'params': {'total': params['total'], 'active': params['active']},
      'batch': {
          'global_batch': tc.batch_size, 'seq_len': T, 'tokens_per_step': tc.batch_size * T,
          'grad_accum': tc.grad_accum, 'data_parallel_shards': setup.batch_shards,
          'per_device_batch': tc.batch_size / setup.batch_shards,
          'per_device_micro_batch': tc.batch_size / setup.batch_shards / tc.grad_accum,
          'remat': config.model.remat,
      },
      'chip_spec': dict(chip, per_device={k: v / cores_per_chip for k, v in chip.items()}),
      'flops': {
          'analytic_per_step': analytic, 'analytic_per_device': analytic / len(devices),
          'analytic_formula': '6 x active matmul params x tokens + 6 x layers x heads x '
                              'head_dim x seq_len x tokens (causal attention)'},
  }
  if setup.model_cfg.is_hybrid:
    out['flops']['analytic_formula'] = (
        '6 x active matmul params x tokens + 6 x attention layers x heads x head_dim x seq_len x '
        'tokens (causal attention) + 3 x Gated DeltaNet layers x the chunked delta rule\'s '
        'forward FLOPs per token x tokens (deltanet.DeltaNetSpec.flops_per_token)')
  if config.mesh.get('dcn_data', 1) != 1:
    out['note'] = ('config.mesh.dcn_data > 1 (multi-slice) is not modelled: this compiles one '
                   'slice holding the whole mesh.')
  return out


def _not_fitting(out, error, config, n_dev, logs_before, per_device, state_bytes) -> dict:
  """The report of a step the TPU compiler rejected for memory."""
  details = oom_details(error, config, n_dev, logs_before)
  out['fits'] = False
  out['memory'] = dict(details, state_bytes_per_device=state_bytes,
                       hbm_bytes_per_device=per_device['hbm_bytes'])
  req = details.get('required_bytes')
  has = details.get('hbm_available_to_xla_bytes', per_device['hbm_bytes'])
  out['message'] = (
      f'Does NOT fit: the step needs {gib(req) if req else "?"} GiB per device, the '
      f'{out["chip"]} device has {gib(has)} GiB. Largest buffers: ' + '; '.join(
          f'{b["size"]} {b["shapes"][:120]}' + (f' ({b["likely"]})' if b['likely'] else '')
          for b in details.get('largest_buffers', [])[:3]) +
      '. Try a larger slice, more --config.train.grad_accum, --config.model.remat=full, or '
      'other --config.mesh rules.')
  return out


def memory_analysis(compiled, per_device, state_bytes) -> dict:
  from gated_attention.training import grad_accum  # pylint: disable=g-import-not-at-top
  ma = compiled.memory_analysis()
  total = grad_accum.total_bytes(ma)
  return {
      'arguments_bytes': ma.argument_size_in_bytes,
      'outputs_bytes': ma.output_size_in_bytes,
      'aliased_bytes': ma.alias_size_in_bytes,
      'temporaries_bytes': ma.temp_size_in_bytes,
      'generated_code_bytes': ma.generated_code_size_in_bytes,
      'total_bytes': total,
      'total_gib': gib(total),
      'hbm_bytes_per_device': per_device['hbm_bytes'],
      'hbm_fraction': round(total / per_device['hbm_bytes'], 4),
      'state_bytes_per_device': state_bytes,
      'host_bytes': (ma.host_argument_size_in_bytes + ma.host_output_size_in_bytes -
                     ma.host_alias_size_in_bytes + ma.host_temp_size_in_bytes),
      'total_formula': 'arguments + outputs - aliased (donated) + temporaries + generated code',
  }


def _costs(compiled, hlo, cost, flops, n_dev) -> tuple[float, float, dict]:
  """XLA's FLOPs and bytes per device at the loops' trip counts; fills in `flops`."""
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  raw_flops, raw_bytes = float(ca.get('flops', 0.0)), float(ca.get('bytes accessed', 0.0))
  loops = hlo_cost.hlo_loop_cost(hlo)
  f_scale = cost['flops'] / cost['flops_once'] if cost['flops_once'] else 1.0
  b_scale = loops['bytes'] / loops['bytes_once'] if loops['bytes_once'] else 1.0
  xla_flops, analytic = raw_flops * f_scale, flops['analytic_per_step']
  kernel_flops = loops['kernel_flops']   # Pallas kernels XLA counts nothing for (kernel_cost.py)
  flops.update({
      'xla_per_device': xla_flops,
      'xla_per_step': xla_flops * n_dev,
      'kernels_uncounted_by_xla_per_device': kernel_flops,
      'counted_per_device': xla_flops + kernel_flops,
      'xla_over_analytic': round((xla_flops + kernel_flops) * n_dev / analytic, 3),
      'by_kernel_per_device': {k.split(':', 1)[1]: v for k, v in loops.items()
                               if k.startswith('flops:')},
      'xla_cost_analysis_raw_per_device': raw_flops,
      'loop_scale': round(f_scale, 3),
      'note': ('XLA cost analysis counts each while-loop body once; xla_per_device scales it by '
               'the loop trip counts of the step (loop_scale, from the jaxpr). '
               'program_matmul_per_step: the matmul FLOPs of the traced step, all devices. '
               'counted_per_device = xla_per_device + the Pallas kernels XLA cannot see (splash '
               'attention: analytic FLOPs of its computed causal tiles, kernel_cost.py; megablox '
               'is in XLA\'s count through its cost estimate). xla_over_analytic (counted / '
               'analytic) > 1 from remat (recomputed forward), attention kernels\' diagonal '
               'tiles and backward recomputation, and, for MoE with grad_accum > 1, the forward '
               'that gathers the global load-balancing statistics.'),
  })
  return xla_flops + kernel_flops, raw_bytes * b_scale + loops['kernel_bytes'], dict(
      loops, bytes_loop_scale=round(b_scale, 3), raw_bytes=raw_bytes)


def _roofline(xla_flops, xla_bytes, loops, cost, analytic, per_device, n_dev, tokens) -> dict:
  """max(FLOPs / peak, bytes / bandwidth) per device, and the MFU it implies."""
  peak, bw = per_device['peak_bf16_flops'], per_device['hbm_bandwidth']
  t_compute, t_memory = xla_flops / peak, xla_bytes / bw
  step = max(t_compute, t_memory)
  kernels = sum(v for k, v in loops.items() if k.startswith('flops:'))  # not in the jaxpr's dots
  traced = max((cost['flops'] / n_dev + kernels) / peak, t_memory)
  split = {'compute: XLA ops': (xla_flops - kernels) / peak}
  split.update({f'compute: {k.split(":", 1)[1]}': v / peak for k, v in loops.items()
                if k.startswith('flops:')})
  split.update({f'memory: {k.split(":", 1)[1]}': v / bw for k, v in loops.items()
                if k.startswith('bytes:')})
  return {
      'step_seconds': step, 'compute_seconds': t_compute, 'memory_seconds': t_memory,
      'bound': 'compute' if t_compute >= t_memory else 'memory',
      'mfu': round(analytic / n_dev / (step * peak), 4) if step else None,
      'tokens_per_second': tokens / step if step else None,
      # The same with the traced step's matmul FLOPs (spread evenly) plus the Pallas kernels'
      # (from the HLO) instead of XLA's count: differs where XLA's count is not the real work.
      'mfu_traced_flops': round(analytic / n_dev / (traced * peak), 4) if cost['flops'] else None,
      'xla_bytes_accessed_per_device': xla_bytes,
      'xla_bytes_accessed_raw_per_device': loops['raw_bytes'],
      'bytes_loop_scale': loops['bytes_loop_scale'],
      'kernel_bytes_uncounted_by_xla_per_device': loops['kernel_bytes'],
      'seconds_by_category': {k: round(v, 4) for k, v in split.items()},
      'collective_seconds_at_hbm_bandwidth': round(loops['collective_bytes'] / bw, 4),
      'top_bytes': [{'seconds': round(b / bw, 4), 'category': c, 'op': w, 'shapes': sh}
                    for b, c, w, sh in loops['top']],
      'note': 'max(FLOPs/peak, bytes/HBM bandwidth) per device; ignores ICI communication and '
              'MXU efficiency, so the MFU is an upper bound. FLOPs: XLA\'s plus the Pallas '
              'kernels XLA counts nothing for (splash attention; kernel_cost.py). Bytes: XLA\'s '
              'bytes accessed, scaled by bytes_loop_scale, the loop trip-count factor measured on '
              'the compiled HLO (XLA counts each loop body once), plus those kernels\' operands '
              'and outputs (with their re-read tiles). seconds_by_category: compute (FLOPs / '
              'peak; sums to compute_seconds) and memory (this module\'s own HLO byte count '
              'by category / bandwidth: where the traffic is; its total differs from XLA\'s, '
              'which memory_seconds uses, by up to ~40%); collectives are counted as HBM '
              'traffic only, their ICI time is not modelled.',
  }


def _lower_and_compile(setup):
  """(traced, compiled or None, error or None, {lower, compile} seconds, logs before)."""
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention.training import grad_accum  # pylint: disable=g-import-not-at-top
  batch = grad_accum.abstract_batch(setup)
  t0 = time.time()
  with jax.set_mesh(setup.mesh):
    traced = setup.train_step.trace(setup.abstract_params, setup.abstract_opt, batch, 1.0)
    lowered = traced.lower()
  t1, logs_before = time.time(), tpu.log_sizes()
  try:
    compiled, error = lowered.compile(), None
  except Exception as e:  # pylint: disable=broad-except
    compiled, error = None, str(e)
  seconds = {'lower': round(t1 - t0, 2), 'compile': round(time.time() - t1, 2)}
  return traced, compiled, error, seconds, logs_before


def report(config, topology: str, *, keep_hlo: bool = False) -> dict:
  """Compile the training step of `config` for a TPU topology; returns the JSON-able report."""
  _, devices = tpu.topology_devices(topology)
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train
  n_dev = len(devices)
  setup = train.Setup(config, sharding.build_mesh(config.mesh, devices))
  tokens = config.train.batch_size * config.data.seq_len
  analytic = model_lib.train_flops_per_token(setup.model_cfg, config.data.seq_len) * tokens
  out = _header(config, topology, devices, setup, analytic)
  per_device = out['chip_spec']['per_device']
  traced, compiled, error, out['compile_seconds'], logs = _lower_and_compile(setup)
  cost = hlo_cost.jaxpr_cost(traced.jaxpr)
  out['flops'].update(program_matmul_per_step=cost['flops'],
                      program_over_analytic=round(cost['flops'] / analytic, 3))
  state_bytes = shard_bytes((setup.abstract_params, setup.abstract_opt))
  if compiled is None:
    if 'RESOURCE_EXHAUSTED' not in error and 'memory' not in error.lower():
      raise RuntimeError(f'Compiling {out["config"]} for {topology} failed: {error}')
    return _not_fitting(out, error, config, n_dev, logs, per_device, state_bytes)
  out['memory'] = memory_analysis(compiled, per_device, state_bytes)
  hlo = compiled.as_text()
  xla_flops, xla_bytes, loops = _costs(compiled, hlo, cost, out['flops'], n_dev)
  out['roofline'] = _roofline(xla_flops, xla_bytes, loops, cost, analytic, per_device, n_dev,
                              tokens)
  out['collectives'] = dict(hlo_cost.count_collectives(hlo),
                            result_bytes_per_device_per_step=loops['collective_bytes'])
  _conclude(out, hlo, config, n_dev, per_device)
  if keep_hlo:
    out['_hlo'] = hlo
  return out


def _conclude(out, hlo, config, n_dev, per_device):
  """`fits` and the one-line `message` (with the largest arrays when it does not fit)."""
  total = out['memory']['total_bytes']
  out['fits'] = fits = total <= per_device['hbm_bytes']  # the compiler does not reject them all
  if fits:
    out['message'] = (f'Fits: {gib(total)} GiB of {gib(per_device["hbm_bytes"])} GiB per '
                      f'device; roofline MFU {out["roofline"]["mfu"]:.1%} '
                      f'({out["roofline"]["bound"]}-bound).')
    return
  arrays = largest_hlo_arrays(hlo, config, n_dev)
  out['memory']['largest_arrays'] = arrays
  out['message'] = (
      f'Does NOT fit: the compiled step needs {gib(total)} GiB per device, the {out["chip"]} '
      f'device has {gib(per_device["hbm_bytes"])} GiB. Largest arrays: ' + '; '.join(
          f'{a["size"]} {a["shapes"][:100]} x{a["count"]} ({a["likely"] or a["op"][-60:]})'
          for a in arrays[:3]) +
      '. Try a larger slice, more --config.train.grad_accum, or other --config.mesh rules.')


# ----------------------------------------------------------------------------------------------
# The smallest grad_accum that fits (--mode=compile --fit_grad_accum)


def fit_grad_accum(config, topology: str, *, log=print, compile_fn=None,
                   num_devices: int | None = None) -> dict:
  """Compiles the step at config.train.grad_accum x 1, 2, 4, ... (fit.candidates: while every
  device keeps at least one sequence per micro-batch) and returns the report of the first that
  fits, with `fit_grad_accum` listing every attempt; one line is logged per attempt. A step that
  does not fit is usually refused by the compiler in seconds. Raises UserError (one paragraph:
  the largest tried, what else to change) when none fits. `compile_fn(config, topology)`:
  `report` (tests pass a fake, and `num_devices`, the topology's devices, without libtpu)."""
  compile_fn = compile_fn or report
  if schema.is_auto(config.train.grad_accum):   # train.grad_accum=auto: the walk from 1
    config = fit.with_grad_accum(config, 1)
  n_dev = num_devices or len(tpu.topology_devices(topology)[1])
  shards = fit.batch_shards(config, n_dev)
  tc = config.train

  def attempt(ga):
    t = time.time()
    try:
      r = compile_fn(fit.with_grad_accum(config, ga), topology)
    except RuntimeError as e:   # a compile that failed for another reason than memory
      return {'fits': None, 'error': str(e).strip().splitlines()[0][:300]}
    r['message'] = (r['message'].split('. Largest')[0].rstrip('.') +   # the verdict, not the list
                    f' [{time.time() - t:.0f} s]')
    return r

  grad_accums = fit.candidates(tc.batch_size, shards, tc.grad_accum)
  found, tried = fit.walk(grad_accums, attempt, tc.batch_size / shards, log)
  where = (f'for {config.variant}:{config.scale} on {topology} (global batch {tc.batch_size}, '
           f'sequence {config.data.seq_len}, {shards} data-parallel shards)')
  if found is None:
    raise UserError(fit.none_fits(tried, where))
  log(f'Smallest grad_accum that fits {where}: {found.grad_accum}.')
  out = found.result
  out['fit_grad_accum'] = {'grad_accum': found.grad_accum,
                           'attempts': [{'grad_accum': a.grad_accum, 'fits': a.fits,
                                         'message': a.message} for a in tried]}
  return out
