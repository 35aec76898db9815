"""Process start-up: jax.distributed from the config or the usual environment variables, once,
before anything touches a JAX device (the design of a multi-process run: cluster/__init__.py).

Sources, first match wins:
  1. config.distributed.coordinator_address (+ num_processes and process_id);
  2. JAX_COORDINATOR_ADDRESS with JAX_NUM_PROCESSES and JAX_PROCESS_ID;
  3. a cluster launcher JAX detects by itself: SLURM (srun with more than one task), Open MPI
     (mpirun -n >1), Cloud TPU multi-host and multi-slice (TPU_WORKER_HOSTNAMES / MEGASCALE_*).
Otherwise a single process: nothing to do.
"""

import logging
import os

import jax
from jax._src import distributed as jax_distributed_impl

from gated_attention import compilation_cache
from gated_attention.cluster import liveness
from gated_attention.errors import ConfigError

DEFAULT_HEARTBEAT_TIMEOUT = 100   # seconds (JAX's default)

def _int_env(name: str) -> int | None:
  value = os.environ.get(name, '')
  return int(value) if value.strip().lstrip('-').isdigit() else None


def launcher() -> str | None:
  """The multi-process launcher the environment shows, or None for a single process."""
  if os.environ.get('JAX_COORDINATOR_ADDRESS'):
    return 'env'
  if (_int_env('SLURM_STEP_NUM_TASKS') or _int_env('SLURM_NTASKS') or 1) > 1 and \
      os.environ.get('SLURM_STEP_ID') is not None:
    return 'slurm'
  if (_int_env('OMPI_COMM_WORLD_SIZE') or 1) > 1:
    return 'mpi'
  if os.environ.get('MEGASCALE_COORDINATOR_ADDRESS') or ',' in os.environ.get(
      'TPU_WORKER_HOSTNAMES', ''):
    return 'tpu'
  return None


def _use_gloo_for_cpu():
  """Cross-process collectives on CPU devices need an implementation (gloo); it is harmless on
  accelerators, which bring their own."""
  try:
    if jax.config.jax_cpu_collectives_implementation in (None, '', 'none'):
      jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  except AttributeError:  # an older or newer jax without the option
    pass


def initialize(dist_cfg) -> bool:
  """Calls jax.distributed.initialize when configured or launched on a cluster.

  Returns True when this is a multi-process run (after initializing), False otherwise.
  """
  if jax.distributed.is_initialized():
    return True
  kwargs = {}
  if dist_cfg.coordinator_address:
    if dist_cfg.num_processes <= 0 or dist_cfg.process_id < 0:
      raise ConfigError('config.distributed.coordinator_address is set: also set '
                       'config.distributed.num_processes and config.distributed.process_id.')
    kwargs.update(coordinator_address=dist_cfg.coordinator_address,
                  num_processes=int(dist_cfg.num_processes), process_id=int(dist_cfg.process_id))
  else:
    source = launcher()
    if source is None:
      return False
    if source == 'env':
      n, i = _int_env('JAX_NUM_PROCESSES'), _int_env('JAX_PROCESS_ID')
      if n is not None and i is not None:
        kwargs.update(coordinator_address=os.environ['JAX_COORDINATOR_ADDRESS'],
                      num_processes=n, process_id=i)
  ids = str(dist_cfg.get('local_device_ids', '') or '').strip()
  if ids:
    kwargs['local_device_ids'] = [int(x) for x in ids.split(',')]
  timeouts = {name: int(dist_cfg.get(name, 0) or 0) for name in
              ('initialization_timeout', 'heartbeat_timeout', 'shutdown_timeout')}
  for name, seconds in timeouts.items():
    if seconds < 0:
      raise ConfigError(f'config.distributed.{name}={seconds} must be a positive number of '
                        'seconds (0: the default).')
  if timeouts['initialization_timeout']:
    kwargs['initialization_timeout'] = timeouts['initialization_timeout']
  if timeouts['shutdown_timeout']:
    kwargs['shutdown_timeout_seconds'] = timeouts['shutdown_timeout']
  heartbeat = timeouts['heartbeat_timeout'] or DEFAULT_HEARTBEAT_TIMEOUT
  # JAX's own detection (it aborts with a dump of every thread) is the backstop, well after ours.
  kwargs['heartbeat_timeout_seconds'] = 2 * heartbeat + 10
  _use_gloo_for_cpu()
  jax.distributed.initialize(**kwargs)
  logging.info('jax.distributed: process %d of %d, %d local / %d global devices.',
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  if jax.process_count() > 1:
    liveness.start(jax_distributed_impl.global_state.client, heartbeat)
    compilation_cache.for_multiprocess_cpu()
  return jax.process_count() > 1


def finish():
  """This process ended its work normally: the others stop watching its heartbeat (a process
  that exits with an error is not finished, and the others stop once its heartbeat is missed)."""
  liveness.finish()
