"""--mode=import and --mode=export: a Hugging Face model directory <-> a run directory.

  python main.py --mode=import --hf=/data/1B_gate_headwise --workdir=runs/hf_headwise
  python main.py --mode=export --workdir=runs/g1_headwise --out=out/g1_headwise_hf

An imported run is an ordinary run directory: config.json (the architecture from the HF
config.json, the directory's tokenizer.json) and a warm-start checkpoint at step 0 holding the
parameters alone, so --mode=analyze, the notebook, --mode=compare and --mode=train (which
starts a fresh optimizer and data iterator from it: continued training or fine-tuning on any
data source) open it unchanged.
"""

import contextlib
import gc
import os
import shutil
import time

import jax

from gated_attention import storage
from gated_attention.errors import CheckpointError
from gated_attention.runs import checkpoint as ckpt_lib
from gated_attention.runs import rundir
from gated_attention.runs.hf import convert

IMPORT_STEP = 0


def _peak_rss_gib() -> float:
  import resource  # pylint: disable=g-import-not-at-top
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def import_run(hf_dir: str, workdir: str, *, overrides: dict | None = None) -> dict:
  """Writes `workdir` from the HF directory `hf_dir`; `overrides` ({'model.dtype': ...,
  'data.source': ...}) apply to the run config (not to the architecture). Refuses a workdir that
  holds a run, before anything is written."""
  t0 = time.time()
  rundir.check_workdir(workdir)
  if storage.exists(storage.join(workdir, rundir.CONFIG_FILE)) or rundir.checkpoint_steps(workdir):
    raise CheckpointError(f'--workdir={workdir} already holds a run; import into a new '
                          'directory.')
  config, params = convert.load_hf(hf_dir)
  fixed = [k for k in overrides or {} if k.startswith('model.')
           and k.split('.')[1] not in rundir.MODEL_FREE]
  if fixed:
    raise CheckpointError(f'{", ".join(fixed)}: the architecture of an import comes '
                          f'from {hf_dir}/config.json and cannot be overridden.')
  config.update_from_flattened_dict(dict(overrides or {}))
  t_read = time.time() - t0
  rundir.model_factory(config)   # validates the model config on this machine
  count = int(sum(x.size for x in jax.tree.leaves(params)))
  _check_room(workdir, int(sum(x.nbytes for x in jax.tree.leaves(params))))
  created = not storage.exists(workdir)
  new = [p for p in (storage.join(workdir, rundir.CONFIG_FILE),
                     storage.join(workdir, ckpt_lib.CHECKPOINTS_DIR)) if not storage.exists(p)]
  try:
    rundir.check_or_write_config(workdir, config)
    checkpointer = ckpt_lib.Checkpointer(workdir)
    try:
      checkpointer.save_params(IMPORT_STEP, params)  # host arrays: orbax writes them as they are
      del params  # orbax holds its own copy while it writes asynchronously: free ours meanwhile
      gc.collect()
    finally:
      checkpointer.close()
  except (CheckpointError, OSError) as e:  # a full or failing disk: nothing half-imported is kept
    for path in new:
      with contextlib.suppress(OSError):
        storage.remove_tree(path)
    if created and not storage.is_remote(workdir) and os.path.isdir(workdir) and not os.listdir(
        workdir):
      os.rmdir(workdir)   # (a prefix on object storage is gone with its last object)
    cause = e.__cause__ if isinstance(e, CheckpointError) and e.__cause__ else e
    reason = f'{type(cause).__name__}: {cause}'.splitlines()[0]
    raise CheckpointError(
        f'Importing {hf_dir} into --workdir={workdir} failed while writing it: {reason}. What '
        'the import had written there was removed; fix the cause (disk space, permissions) and '
        'run the same command again.') from e
  return {'workdir': storage.abspath(workdir), 'variant': config.variant, 'step': IMPORT_STEP,
          'scale': config.scale, 'source': os.path.abspath(hf_dir),
          'tokenizer': config.data.tokenizer, 'skipped': config.hf.get('skipped', ''),
          'parameters': count,
          'read_seconds': round(t_read, 1), 'seconds': round(time.time() - t0, 1),
          'peak_rss_gib': round(_peak_rss_gib(), 2)}


def _check_room(workdir: str, nbytes: int):
  """Refuses an import whose checkpoint (`nbytes` of parameters, as orbax writes them) cannot
  fit on the workdir's disk, before anything is written. Object storage has no such limit."""
  if storage.is_remote(workdir):
    return
  probe = os.path.abspath(workdir)
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  free = shutil.disk_usage(probe).free
  need = int(nbytes * 1.05) + (256 << 10)   # orbax's own files and OCDBT's overhead
  if free < need:
    raise CheckpointError(
        f'The import needs about {need / 2**20:.1f} MiB on the disk of --workdir={workdir}, and '
        f'only {free / 2**20:.1f} MiB are free there. Free space or choose a --workdir on '
        'another disk; nothing was written.')


def export_run(workdir: str, out_dir: str, *, step: int | None = None, dtype: str = 'float32',
               remote_code_dir: str | None = None,
               max_shard_bytes: int = convert.DEFAULT_MAX_SHARD_BYTES) -> dict:
  """Writes checkpoint `step` (default: the latest) of the run in `workdir` as a HF model
  directory `out_dir` (convert.save_hf). What no HF model class expresses is refused before
  the checkpoint is read."""
  t0 = time.time()
  config = rundir.read_config(workdir)
  convert.check_exportable(config)
  convert.check_out_dir(out_dir)   # before the checkpoint is read: an --out that cannot be written
  run = rundir.load_run(workdir, step, config=config)
  step, params = run.step, jax.device_get(run.params)
  # Trained here (every document started with BOS): the tokenizer puts BOS first. An import's
  # own weights (its step 0) keep their source tokenizer's behaviour.
  trained_here = config.get('hf') is None or step > IMPORT_STEP
  out = convert.save_hf(config, params, out_dir, dtype=dtype, max_shard_bytes=max_shard_bytes,
                        remote_code_dir=remote_code_dir, bos_first=trained_here)
  return dict(out, out_dir=storage.abspath(out_dir), step=step, seconds=round(time.time() - t0, 1),
              peak_rss_gib=round(_peak_rss_gib(), 2))
