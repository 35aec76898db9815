"""`--config.train.grad_accum=auto`: the trainer finds its own gradient accumulation.

    config, setup, record = grad_accum.resolve(config, workdir, mesh)   # session.py, first

Before the first step, the train step is compiled on this session's devices at grad_accum 1, 2,
4, ... (training/fit.py's walk, the one `--fit_grad_accum` runs; while every device keeps at
least one sequence per micro-batch) and the first whose compiled memory fits is taken. One line
says what was chosen and why. The global batch (`train.batch_size`) and the schedule do not
change: grad_accum only splits each step's batch into micro-batches (train.train_step averages
their gradients), so the run is the same run to float rounding whatever is chosen.

Fits: the compiled step's `memory_analysis()`, arguments + outputs - donated + temporaries +
generated code (what `--mode=compile` reports, compile/aot.py), is at most the memory of a
device: `config.memory.device_memory_gib` when it is set (the tests' fake limits; or a margin of
your own), else the device's own limit (`memory_stats()['bytes_limit']`: GPUs and TPUs report
it). A compiler that refuses the step for its memory (RESOURCE_EXHAUSTED) is a "does not fit"; any
other compile error is raised. A CPU reports no limit: without device_memory_gib the first
candidate is taken (and says so). The step compiled for the choice is the one the first step runs
(JAX keeps the compiled executable: nothing is compiled twice).

The choice is recorded in RUN/grad_accum.json (runs/rundir.py GRAD_ACCUM_FILE) with the devices
it was made on, and RUN/config.json holds the number. A resumed run with grad_accum=auto keeps the
recorded choice on devices of the same kind and number (nothing is compiled to choose); on other
devices (a slice of another size) it walks again and records the new choice. Every process of a
multi-host run walks alike; process 0's choice is the one all take.
"""

import datetime

import jax

from gated_attention.config import schema
from gated_attention.errors import ConfigError, UserError
from gated_attention.runs import rundir
from gated_attention.training import fit
from gated_attention.training import train as train_lib

GIB = 2 ** 30


def is_auto(config) -> bool:
  return schema.is_auto(config.train.grad_accum)


def devices_of(mesh) -> dict:
  """What a choice depends on: the devices' platform, kind and number."""
  d = mesh.devices.flat[0]
  return {'platform': d.platform, 'kind': d.device_kind, 'count': int(mesh.devices.size)}


def device_limit(config, mesh) -> tuple[float | None, str]:
  """(bytes a device may hold, where that figure comes from), or (None, why there is none)."""
  gib = float(config.memory.get('device_memory_gib', 0) or 0)
  if gib > 0:
    return gib * GIB, 'config.memory.device_memory_gib'
  limits = []
  for d in mesh.devices.flat:
    if d.process_index != jax.process_index():
      continue
    try:
      stats = d.memory_stats()
    except Exception:  # pylint: disable=broad-except   (a backend without the call)
      stats = None
    if stats and stats.get('bytes_limit'):
      limits.append(stats['bytes_limit'])
  if limits:
    return float(min(limits)), 'the device\'s own limit'
  return None, f'the {devices_of(mesh)["platform"]} devices report no memory limit'


def abstract_batch(setup) -> dict:
  """The step's batch as abstract global arrays (what the data pipeline puts on the devices:
  inputs / targets int32, loss_mask float32, [batch_size, seq_len], sharded over the batch)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  shape = (setup.cfg.train.batch_size, setup.cfg.data.seq_len)
  return {k: jax.ShapeDtypeStruct(shape, dt, sharding=setup.batch_sharding)
          for k, dt in (('inputs', jnp.int32), ('targets', jnp.int32),
                        ('loss_mask', jnp.float32))}


def compiled_bytes(setup) -> int:
  """Per-device bytes of `setup`'s compiled train step (--mode=compile's total); raises
  MemoryError when the compiler refuses it for its memory."""
  with jax.set_mesh(setup.mesh):
    lowered = setup.train_step.trace(setup.abstract_params, setup.abstract_opt,
                                     abstract_batch(setup), 1.0).lower()
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower():
      raise MemoryError(text.strip().splitlines()[0][:200]) from e
    raise
  return int(total_bytes(compiled.memory_analysis()))


def total_bytes(ma):
  """Per-device bytes of a compiled program from its memory_analysis(): arguments + outputs -
  aliased + temporaries + generated code (--mode=compile's total)."""
  return (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes +
          ma.temp_size_in_bytes + ma.generated_code_size_in_bytes)


def _agreed(grad_accum: int) -> int:
  """Process 0's choice, in every process (one process: itself)."""
  if jax.process_count() == 1:
    return grad_accum
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return int(multihost_utils.broadcast_one_to_all(np.int32(grad_accum)))


def resolve(config, workdir: str, mesh, *, say=print, measure=None):
  """(config with train.grad_accum a number, the train.Setup built for it or None, the record to
  write to RUN/grad_accum.json or None when the run's own is kept). `measure(setup)`: the
  per-device bytes of a candidate's step (default compiled_bytes; tests pass a fake)."""
  measure = measure or compiled_bytes
  where = devices_of(mesh)
  tc = config.train
  run_file = rundir.grad_accum_path(workdir)
  saved = rundir.read_grad_accum(workdir)
  if saved is not None and saved.get('devices') == where:
    chosen = int(saved['grad_accum'])
    say(f'grad_accum=auto: {chosen}, as chosen when this run started on these devices '
        f'({where["count"]} x {where["kind"]}; {run_file}); the global batch {tc.batch_size} '
        'and the schedule are unchanged. (--config.train.grad_accum=N sets another.)')
    return fit.with_grad_accum(config, chosen), None, None
  again = ''
  if saved is not None:
    was = saved.get('devices') or {}
    again = (f' (chosen again: this run chose {saved.get("grad_accum")} on {was.get("count")} x '
             f'{was.get("kind")})')
  shards = fit.batch_shards(config, where['count'])
  grad_accums = fit.candidates(tc.batch_size, shards, 1)
  if not grad_accums:
    raise ConfigError(f'config.train.batch_size={tc.batch_size} does not give each of the '
                      f'{shards} data-parallel shards of mesh {dict(mesh.shape)} a whole number '
                      'of sequences: no grad_accum can split it. Give a batch_size that '
                      f'{shards} divides (or other --config.mesh sizes).')
  limit, source = device_limit(config, mesh)
  setups = {}

  def attempt(ga):
    setups[ga] = setup = train_lib.Setup(fit.with_grad_accum(config, ga), mesh)
    try:
      total = measure(setup)
    except MemoryError as e:
      return {'fits': False, 'message': f'refused by the compiler ({e})'}
    if limit is None:
      return {'fits': True, 'message': f'{total / GIB:.2f} GiB per device', 'bytes': total}
    return {'fits': total <= limit, 'bytes': total,
            'message': f'{total / GIB:.2f} GiB of {limit / GIB:.2f} GiB per device'}

  found, tried = fit.walk(grad_accums, attempt, tc.batch_size / shards, log=lambda _: None)
  here = (f'on {where["count"]} x {where["kind"]} (global batch {tc.batch_size}, sequence '
          f'{config.data.seq_len}, {shards} data-parallel shards)')
  if found is None:
    raise UserError('--config.train.grad_accum=auto: ' + fit.none_fits(tried, here))
  chosen = _agreed(found.grad_accum)
  if chosen not in setups:   # another process chose otherwise (it should not): process 0's
    setups[chosen] = train_lib.Setup(fit.with_grad_accum(config, chosen), mesh)
  why = ('; '.join(f'{a.grad_accum}: {a.message}' + ('' if a.fits else ', does not fit')
                   for a in tried))
  if limit is None:
    reason = (f'{source}, so the first candidate is taken ({why}); set '
              '--config.memory.device_memory_gib to fit one')
  else:
    reason = f'the smallest whose compiled step fits {source} ({why})'
  micro = tc.batch_size // shards // chosen
  say(f'grad_accum=auto: {chosen}{again} ({micro} sequence(s) per device per micro-batch) {here}, '
      f'{reason}; the global batch and the schedule are unchanged; recorded in {run_file}.')
  record = {'grad_accum': chosen, 'devices': where,
            'device_memory_gib': None if limit is None else round(limit / GIB, 3),
            'limit_source': source,
            'attempts': [{'grad_accum': a.grad_accum, 'fits': a.fits, 'message': a.message,
                          'bytes': a.result.get('bytes')} for a in tried],
            'chosen_at': datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec='seconds')}
  return fit.with_grad_accum(config, chosen), setups[chosen], record
