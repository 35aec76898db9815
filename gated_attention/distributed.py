"""Multi-host start-up: jax.distributed from the config or the usual environment variables."""

import os

import jax

# Environment variables that mean a multi-process launch (SLURM, Open MPI, Cloud TPU, or JAX's
# own coordinator variable); jax.distributed.initialize() detects the cluster from them.
_CLUSTER_ENV = ('JAX_COORDINATOR_ADDRESS', 'SLURM_JOB_ID', 'OMPI_COMM_WORLD_SIZE',
                'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS')


def initialize(dist_cfg) -> None:
  """Calls jax.distributed.initialize when configured or launched on a cluster; else no-op."""
  if dist_cfg.coordinator_address:
    if dist_cfg.num_processes <= 0 or dist_cfg.process_id < 0:
      raise ValueError('config.distributed.coordinator_address is set: also set '
                       'config.distributed.num_processes and config.distributed.process_id.')
    jax.distributed.initialize(coordinator_address=dist_cfg.coordinator_address,
                               num_processes=dist_cfg.num_processes,
                               process_id=dist_cfg.process_id)
  elif any(os.environ.get(v) for v in _CLUSTER_ENV):
    jax.distributed.initialize()
