"""The cluster: the processes of a multi-host run, one per host (TPU VM, GPU node) or per GPU,
every one running the same command. What is about processes rather than one process's training
is here, behind this face (`from gated_attention import cluster`):

    startup.py    `initialize` / `finish`: jax.distributed from the config or the launcher
    liveness.py   each process's heartbeat; a lost process stops the others (exit status 75)
    stop.py       the stop agreement: every process stops after the same step

A multi-process run, start to end, and where each part lives:
  - start-up: `cluster.initialize(config.distributed)`, before anything touches a JAX device.
    Sources, first match wins: config.distributed.coordinator_address (+ num_processes and
    process_id); JAX_COORDINATOR_ADDRESS with JAX_NUM_PROCESSES and JAX_PROCESS_ID; a launcher
    JAX detects by itself (SLURM, Open MPI, Cloud TPU multi-host and multi-slice). Otherwise a
    single process: nothing to do. On CPU devices gloo carries the collectives, and every
    process uses its freshly compiled programs in the form the persistent cache gives
    (compilation_cache.for_multiprocess_cpu: cached and fresh CPU executables, mixed, hang them).
  - the mesh spans every process's devices (sharding.build_mesh; config.mesh.dcn_data puts the
    data axis across slices / hosts); the training batches are one global stream, and each
    process puts its devices' rows of it on them (train.Setup.global_batch), so a run saved by
    N processes resumes on M.
  - logs: only process 0 writes metrics and prints (loop.MetricsWriter, loop.Progress).
  - checkpoints: orbax writes every process's shards of the arrays, process 0 the metadata, with
    barriers between them; the data position is saved once.
  - a stop signal (SIGTERM, Ctrl-C) reaching any process, seconds apart or not at all on the
    others, stops every process after the same step, and they all save (stop.py: each step
    carries every process's signal; training/interrupt.py holds the handlers and their bounds).
  - a lost process (no heartbeat for distributed.heartbeat_timeout seconds) stops the others with
    one paragraph and exit status 75, instead of a hang in a collective (liveness.py);
    jax.distributed's own timeout, 2 x ours + 10 s, is the backstop. The loss of process 0, the
    coordinator, is not covered: the others' JAX clients abort at once.
  - a process that ends its work normally says so (`cluster.finish()`) and is no longer watched.

docs/faults.md ("Multi-host") has each event measured and its test (tests/test_multihost*.py).
"""

from gated_attention.cluster import liveness
from gated_attention.cluster.liveness import EXIT_LOST_PROCESS
from gated_attention.cluster.liveness import await_verdict
from gated_attention.cluster.startup import DEFAULT_HEARTBEAT_TIMEOUT
from gated_attention.cluster.startup import finish
from gated_attention.cluster.startup import initialize
from gated_attention.cluster.startup import launcher
from gated_attention.cluster.stop import LAG
from gated_attention.cluster.stop import StopAgreement

__all__ = ['DEFAULT_HEARTBEAT_TIMEOUT', 'EXIT_LOST_PROCESS', 'LAG', 'StopAgreement',
           'await_verdict', 'finish', 'initialize', 'launcher', 'liveness']
