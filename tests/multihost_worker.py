"""One process of the multi-host test (tests/test_multihost.py), or its single-process reference.

  python tests/multihost_worker.py steps     OUT WORKDIR DEVICES [PORT NUM_PROCESSES PROCESS_ID]
  python tests/multihost_worker.py loop      OUT WORKDIR DEVICES PORT NUM_PROCESSES PROCESS_ID
  python tests/multihost_worker.py legacy    OUT WORKDIR DEVICES PORT NUM_PROCESSES PROCESS_ID
  python tests/multihost_worker.py reference OUT WORKDIR DEVICES

steps:     jax.distributed over localhost (gloo CPU collectives), train.Setup on the mesh of every
           process's devices, this process's own data stream (build_data with process_index/count
           and per_process_stream: runs saved before issue 45), a few train steps; writes this
           process's losses and what it saw of the mesh.
loop:      the same through loop.run (metrics written by process 0 only, orbax checkpoints
           coordinated across processes, evaluation), then a resumed run of one more step.
legacy:    loop.run of a run saved as before issue 45 (a data stream per process), then resumed.
reference: one process with all the devices, the global stream (what `loop` reads in each process);
           and the per-process streams of runs saved before issue 45 concatenated (what `steps`
           assembles with make_array_from_process_local_data); writes both losses.
"""

import json
import os
import sys

if __name__ == '__main__':   # (imported by a test for `config` alone, it leaves JAX as it is)
  MODE, OUT, WORKDIR, DEVICES = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tests import xla  # pylint: disable=g-import-not-at-top
  xla.set_session_flags()                       # the tests' -O0 (tests/xla.py), if not set
  os.environ['XLA_FLAGS'] = xla.flags(DEVICES)  # ... with DEVICES fake CPU devices
  os.environ['JAX_PLATFORMS'] = 'cpu'

import jax  # noqa: E402
import numpy as np  # noqa: E402

from gated_attention.config import scales  # noqa: E402

PROCESSES = 2
STEPS = 3


def config(port=None, num_processes=0, process_id=-1, steps=STEPS):
  c = scales.get_config('moe_tiny')
  c.variant = 'g1_elementwise'
  c.model.gate.position = 'g1'
  c.model.update(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                 vocab_size=384)
  c.model.moe.update(num_experts=8, top_k=2, expert_ffn_size=32)
  c.data.update(seq_len=16, val_batches=1, shuffle_buffer=16)
  c.train.update(batch_size=8, steps=steps, warmup_steps=1, learning_rate=1e-2, log_every=1,
                 eval_every=STEPS, checkpoint_every=STEPS)
  # Data parallel across the two processes (the DCN split), FSDP and experts inside each.
  c.mesh.update(data=2, dcn_data=2, fsdp=2, tensor=1, expert=2, rules='fsdp_expert')
  if port:
    c.distributed.update(coordinator_address=f'127.0.0.1:{port}', num_processes=num_processes,
                         process_id=process_id, initialization_timeout=120)
  return c


def mesh_layout(mesh):
  return np.vectorize(lambda d: d.process_index)(mesh.devices).tolist()


def steps_mode(c, process_index, process_count, n_steps=STEPS, after_step=None,
               per_process=True, setup=None):
  """`per_process`: the streams of runs saved before issue 45 (each process its own; one
  process stands in for both by concatenating them); else the global stream, which every
  process reads whole and the step shards."""
  from gated_attention import input_pipeline  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train
  setup = setup or train.Setup(c, sharding.build_mesh(c.mesh))
  mesh = setup.mesh
  params, opt = setup.init(c.seed)
  build = lambda p, n: input_pipeline.build_data(  # noqa: E731
      c.data, global_batch_size=c.train.batch_size, seed=c.seed, process_index=p,
      process_count=n, per_process_stream=per_process)
  if per_process:
    shards = [build(p, PROCESSES)
              for p in ([process_index] if process_count > 1 else range(PROCESSES))]
  else:
    shards = [build(process_index, process_count)]
  losses, extra = [], {}
  with jax.set_mesh(mesh):
    for step in range(1, n_steps + 1):
      local = [next(d.train_iter) for d in shards]
      local = {k: np.concatenate([b[k] for b in local]) for k in local[0]}
      batch = setup.global_batch(local, whole=not per_process)
      params, opt, metrics = setup.train_step(params, opt, batch, 1.0)
      losses.append(float(metrics['loss']))
      if after_step is not None:
        extra.update(after_step(step, setup, params))
  wi = params['blocks']['ffn']['wi_gate']
  return {'losses': losses, 'mesh_process_layout': mesh_layout(mesh),
          'wi_gate_spec': str(wi.sharding.spec),
          'wi_gate_local_shard': list(wi.addressable_shards[0].data.shape),
          'wi_gate_processes': sorted({d.process_index for d in wi.sharding.device_set}),
          'local_batch_rows': int(next(iter(local.values())).shape[0]), **extra}


def reference_val(c):
  """After step STEPS: the validation loss as loop.run computes it (one process sees the whole
  global batch, so the val set is the one every process count sees)."""
  from gated_attention import input_pipeline  # pylint: disable=g-import-not-at-top
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  data = input_pipeline.build_data(c.data, global_batch_size=c.train.batch_size, seed=c.seed)

  def after_step(step, setup, params):
    return {'val_loss': loop.evaluate(setup, params, data)['loss']} if step == STEPS else {}
  return after_step


def main():
  from gated_attention import cluster  # pylint: disable=g-import-not-at-top
  out = {}
  if MODE == 'reference':
    from gated_attention import sharding  # pylint: disable=g-import-not-at-top
    from gated_attention.training import train  # pylint: disable=g-import-not-at-top
    c = config()
    setup = train.Setup(c, sharding.build_mesh(c.mesh))   # one compiled step for both
    out.update(steps_mode(c, 0, 1, STEPS + 1, reference_val(c), per_process=False, setup=setup))
    legacy = steps_mode(c, 0, 1, STEPS, per_process=True, setup=setup)
    out['losses_per_process_streams'] = legacy['losses']
  else:
    port, n, i = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    c = config(port, n, i)
    assert cluster.initialize(c.distributed)
    assert (jax.process_count(), jax.process_index()) == (n, i)
    assert jax.device_count() == n * DEVICES and jax.local_device_count() == DEVICES
    out['cpu_collectives'] = str(jax.config.jax_cpu_collectives_implementation)
    if MODE == 'steps':
      out.update(steps_mode(c, i, n))
    elif MODE == 'legacy':
      # A run as runs were saved before issue 45: one data stream per process (forced for the
      # fresh run; the resumed one finds it out from the checkpoint's per-process positions).
      from gated_attention.training import loop, session  # pylint: disable=g-import-not-at-top
      fresh = session._per_process_streams  # pylint: disable=protected-access
      session._per_process_streams = lambda workdir: True  # pylint: disable=protected-access
      loop.run(c, WORKDIR)
      session._per_process_streams = fresh  # pylint: disable=protected-access
      loop.run(config(port, n, i, steps=STEPS + 1), WORKDIR)
    else:
      from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
      out['val'] = loop.run(c, WORKDIR)
      out['val'] = {k: v for k, v in out['val'].items() if np.ndim(v) == 0}
      # Resume from the coordinated checkpoint for one more step.
      out['val_resumed'] = loop.run(config(port, n, i, steps=STEPS + 1), WORKDIR)['loss']
    out['process_index'] = jax.process_index()
  with open(OUT, 'w') as f:
    json.dump(out, f)
  if MODE != 'reference':
    # As main.py does (gated_attention/cli.py): finished first, so this process's heartbeat
    # watch stops before the coordinator does. Without it, on a loaded machine, process 0's
    # watch beat once more after the service had shut down and exited 75, "the coordinator
    # does not answer" (a README test run beside a training run).
    cluster.finish()
    jax.distributed.shutdown()


if __name__ == '__main__':
  main()
