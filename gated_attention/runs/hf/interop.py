"""--mode=import and --mode=export: a Hugging Face model directory <-> a run directory.

  python main.py --mode=import --hf=/data/1B_gate_headwise --workdir=runs/hf_headwise
  python main.py --mode=export --workdir=runs/g1_headwise --out=out/g1_headwise_hf

An imported run is an ordinary run directory: config.json (the architecture from the HF
config.json, the directory's tokenizer.json) and a warm-start checkpoint at step 0 holding the
parameters alone, so --mode=analyze, the notebook, --mode=compare and --mode=train (which
starts a fresh optimizer and data iterator from it: continued training or fine-tuning on any
data source) open it unchanged.
"""

import gc
import os
import time

import jax

from gated_attention.runs import checkpoint as ckpt_lib
from gated_attention.runs import rundir as workdir_lib
from gated_attention.errors import CheckpointError
from gated_attention.training import train as train_lib
from gated_attention.runs import load as runs
from gated_attention.runs.hf import convert, hf_config

IMPORT_STEP = 0


def _peak_rss_gib() -> float:
  import resource  # pylint: disable=g-import-not-at-top
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def import_run(hf_dir: str, workdir: str, *, overrides: dict | None = None) -> dict:
  """Writes `workdir` from the HF directory `hf_dir`; `overrides` ({'model.dtype': ...,
  'data.source': ...}) apply to the run config (not to the architecture). Refuses a workdir that
  holds a run, before anything is written."""
  t0 = time.time()
  workdir_lib.check_workdir(workdir)
  saved = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  if os.path.exists(saved) or runs.checkpoint_steps(workdir):
    raise CheckpointError(f'--workdir={workdir} already holds a run; import into a new '
                          'directory.')
  config, params = convert.load_hf(hf_dir)
  fixed = [k for k in overrides or {} if k.startswith('model.')
           and k.split('.')[1] not in workdir_lib.MODEL_FREE]
  if fixed:
    raise CheckpointError(f'{", ".join(fixed)}: the architecture of an import comes '
                          f'from {hf_dir}/config.json and cannot be overridden.')
  config.update_from_flattened_dict(dict(overrides or {}))
  t_read = time.time() - t0
  train_lib.Setup(config, runs.build_mesh(config))   # validates the config on this machine
  workdir_lib.check_or_write_config(workdir, config)
  count = int(sum(x.size for x in jax.tree.leaves(params)))
  checkpointer = ckpt_lib.Checkpointer(workdir)
  try:
    checkpointer.save_params(IMPORT_STEP, params)  # host arrays: orbax writes them as they are
    del params  # orbax holds its own copy while it writes asynchronously: free ours meanwhile
    gc.collect()
  finally:
    checkpointer.close()
  return {'workdir': os.path.abspath(workdir), 'variant': config.variant, 'step': IMPORT_STEP,
          'source': os.path.abspath(hf_dir), 'tokenizer': config.data.tokenizer,
          'parameters': count,
          'read_seconds': round(t_read, 1), 'seconds': round(time.time() - t0, 1),
          'peak_rss_gib': round(_peak_rss_gib(), 2)}


def export_run(workdir: str, out_dir: str, *, step: int | None = None, dtype: str = 'float32',
               remote_code_dir: str | None = None,
               max_shard_bytes: int = convert.DEFAULT_MAX_SHARD_BYTES) -> dict:
  """Writes checkpoint `step` (default: the latest) of the run in `workdir` as a HF model
  directory `out_dir` (convert.save_hf). What no HF model class expresses is refused before
  the checkpoint is read."""
  t0 = time.time()
  config = runs.read_config(workdir)
  hf_config.check_exportable(config)
  requested, step = step, runs.pick_step(workdir, step)
  setup = train_lib.Setup(config, runs.build_mesh(config))
  if requested is None:         # the latest that verifies (a bad newer one: a warning)
    step, params = runs.restore_latest_params(setup, workdir)
  else:
    params = runs.restore_params(setup, workdir, step)
  params = jax.device_get(params)
  out = convert.save_hf(config, params, out_dir, dtype=dtype, max_shard_bytes=max_shard_bytes,
                        remote_code_dir=remote_code_dir)
  return dict(out, out_dir=os.path.abspath(out_dir), step=step, seconds=round(time.time() - t0, 1),
              peak_rss_gib=round(_peak_rss_gib(), 2))
