"""Opening a run directory read-only: its config, metrics, latest checkpoint and tokenizer.

  run = load_run('runs/g1')           # config, params, model, tokenizer, metrics rows, step
  attention_map(run.model, run.tokenizer, 'The cat sat on the mat.')

Layout (written by loop.py and checkpoint.py): <workdir>/config.json, metrics.jsonl and
checkpoints/<step>/{state,data}; the analysis writes <workdir>/analysis/. Nothing here writes
into the run directory (checkpoints are opened read-only), so runs can be opened from
read-only copies.
"""

import dataclasses
import functools
import json
import os

import ml_collections
import numpy as np

from configs import base as base_config
from gated_attention.errors import UserError

# JAX, flax and orbax are imported where they are used, so that reading configs and metrics
# (compare) stays fast.

CONFIG_FILE = 'config.json'
METRICS_FILE = 'metrics.jsonl'
CHECKPOINTS_DIR = 'checkpoints'
ANALYSIS_DIR = 'analysis'


class RunError(UserError, ValueError):
  """A run directory that cannot be opened; the message names the directory and the fix."""


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's saved config (config.json) as a ConfigDict."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isdir(workdir):
    raise RunError(f'{workdir!r} is not a directory; pass the --workdir of a training run.')
  if not os.path.isfile(path):
    raise RunError(f'{workdir!r} has no {CONFIG_FILE}: it is not a training run directory (or the '
                   'run never started). Train first: python main.py --config=configs/<variant>.py '
                   f'--workdir={workdir}')
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise RunError(f'{path} is unreadable ({e}).') from e
  return base_config.from_saved(saved)


def read_metrics(workdir: str, *, every_row: bool = False) -> list[dict]:
  """The rows of metrics.jsonl (each has 'step' and 'split'); [] when there is none.

  A run resumed after a crash (or rolled back) repeats steps: a later row for the same (split,
  step) replaces the earlier one, so curves have one point per step; with `every_row`, all rows
  in file order (events such as loss spikes happened in every attempt). Unparseable (e.g.
  truncated) lines are skipped.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.isfile(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if isinstance(row, dict) and 'step' in row and 'split' in row:
        rows.append(row)
  if every_row:
    return rows
  latest = {(r['split'], r['step']): r for r in rows}
  return sorted(latest.values(), key=lambda r: (r['step'], r['split']))


def checkpointer(workdir: str):
  """The run's checkpoints, opened read-only (checkpoint.Checkpointer)."""
  from gated_attention.runs import checkpoint  # pylint: disable=g-import-not-at-top
  return checkpoint.Checkpointer(workdir, read_only=True)


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the finished checkpoints (unfinished orbax temporaries are ignored)."""
  if not os.path.isdir(os.path.join(workdir, CHECKPOINTS_DIR)):
    return []
  ckpt = checkpointer(workdir)
  try:
    return ckpt.all_steps()
  finally:
    ckpt.close()


def latest_step(workdir: str) -> int | None:
  steps = checkpoint_steps(workdir)
  return steps[-1] if steps else None


def pick_step(workdir: str, step: int | None) -> int:
  """`step`, or the latest when None; a RunError naming the steps there are otherwise."""
  steps = checkpoint_steps(workdir)
  if not steps:
    raise RunError(f'{workdir!r} has no finished checkpoint under {CHECKPOINTS_DIR}/: nothing to '
                   'open. Train first (checkpoints are written every '
                   'config.train.checkpoint_every steps and at the end) or pick another --workdir.')
  if step is None:
    return steps[-1]
  if step not in steps:
    raise RunError(f'{workdir!r} has no checkpoint at step {step}; it has {steps}.')
  return step


def build_mesh(config):
  """The run's mesh; if it does not fit the devices here, plain data parallelism over them."""
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  try:
    return sharding.build_mesh(config.mesh)
  except ValueError as e:
    print(f'Note: the run\'s mesh does not fit here ({e}); using data parallelism over '
          f'{jax.device_count()} device(s).')
    return sharding.build_mesh(ml_collections.ConfigDict(
        dict(data=-1, fsdp=1, tensor=1, expert=1)))


def restore_params(setup, workdir: str, step: int) -> dict:
  """The parameters of checkpoint `step` (verified), on the shardings of `setup` (a
  train.Setup)."""
  ckpt = checkpointer(workdir)
  try:
    return ckpt.restore_params(step, setup.abstract_params)
  finally:
    ckpt.close()


def restore_latest_params(setup, workdir: str) -> tuple[int, dict]:
  """(step, parameters) of the newest checkpoint that verifies (older ones after a bad newer
  one, with a warning; nothing is changed on disk)."""
  ckpt = checkpointer(workdir)
  try:
    return ckpt.restore_latest_params(setup.abstract_params)
  finally:
    ckpt.close()


@dataclasses.dataclass
class Run:
  """An opened run: its saved config, parameters (a pure dict, sharded on `mesh`), the model's
  graph definition, tokenizer and metrics rows. `workdir` is None for `init_run`."""
  workdir: str | None
  config: ml_collections.ConfigDict
  model_cfg: object             # config.ModelConfig
  step: int | None
  params: dict
  graphdef: object
  tokenizer: object
  metrics: list[dict]
  mesh: object

  @functools.cached_property
  def model(self):
    """A Transformer (nnx) holding the parameters (the same object on every access)."""
    from flax import nnx  # pylint: disable=g-import-not-at-top
    return nnx.merge(self.graphdef, self.params)

  @property
  def analysis_dir(self) -> str | None:
    return None if self.workdir is None else os.path.join(self.workdir, ANALYSIS_DIR)

  def report(self) -> dict | None:
    """RUN/analysis/report.json, if the analysis has been run."""
    if self.workdir is None:
      return None
    path = os.path.join(self.analysis_dir, 'report.json')
    if not os.path.isfile(path):
      return None
    with open(path) as f:
      return json.load(f)


def _tokenizer(config):
  import input_pipeline  # pylint: disable=g-import-not-at-top
  return input_pipeline.data_tokenizer(config.data)


def load_run(workdir: str, step: int | None = None, config=None) -> Run:
  """Opens `workdir`: saved config, metrics rows, tokenizer and checkpoint `step` (default
  latest). `config`: the run's config with evaluation overrides (analyze.analysis_config, e.g.
  YaRN), instead of the saved one."""
  config = read_config(workdir) if config is None else config
  requested, step = step, pick_step(workdir, step)
  from gated_attention.training import train as train_lib  # pylint: disable=g-import-not-at-top
  mesh = build_mesh(config)
  setup = train_lib.Setup(config, mesh)
  if requested is None:         # the latest that verifies
    step, params = restore_latest_params(setup, workdir)
  else:
    params = restore_params(setup, workdir, step)
  return Run(workdir=workdir, config=config, model_cfg=setup.model_cfg, step=step, params=params,
             graphdef=setup.graphdef, tokenizer=_tokenizer(config),
             metrics=read_metrics(workdir), mesh=mesh)


def init_run(config, seed: int | None = None) -> Run:
  """A Run for a freshly initialised (untrained) model of `config`: no workdir, no metrics."""
  from gated_attention.training import train as train_lib  # pylint: disable=g-import-not-at-top
  mesh = build_mesh(config)
  setup = train_lib.Setup(config, mesh)
  params, _ = setup.init(config.seed if seed is None else seed)
  return Run(workdir=None, config=config, model_cfg=setup.model_cfg, step=0, params=params,
             graphdef=setup.graphdef, tokenizer=_tokenizer(config), metrics=[], mesh=mesh)


@functools.cache
def _inspect_fn():
  """train.inspect_step compiled once per model structure (graphdefs hash by value)."""
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train as train_lib  # pylint: disable=g-import-not-at-top
  return jax.jit(train_lib.inspect_step, static_argnames='graphdef')


def token_labels(tokenizer, ids) -> list[str]:
  """A short printable label per token id (BOS shown as <bos>)."""
  labels = []
  for i in ids:
    i = int(i)
    if i == tokenizer.bos_id:
      labels.append('<bos>')
      continue
    text = tokenizer.decode([i]).replace(' ', '\u2423')          # a visible space
    labels.append(repr(text)[1:-1] or '?')
  return labels


def attention_map(model, tokenizer, text: str, *, max_tokens: int = 128,
                  add_bos: bool = True) -> dict:
  """Head-averaged attention maps of every layer for `text` ([BOS] + its tokens).

  Returns {'ids': [n], 'tokens': [n] labels, 'maps': [L, n, n] float (row = query, column = key),
  'f_attn': [L] (this text's F-Attn per layer), 'f_attn_per_head': [L, H]}. The model records
  maps of the first ATTN_MAP_LEN (128) positions, so the text is cut to `max_tokens` <= 128.
  """
  ids = list(tokenizer.encode(text))
  if add_bos:
    ids = [tokenizer.bos_id] + ids
  ids = ids[:min(max_tokens, 128)]
  if len(ids) < 2:
    raise ValueError('attention_map needs at least 2 tokens (BOS and one more); type some text.')
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  graphdef, state = nnx.split(model)
  params = nnx.to_pure_dict(state)
  tokens = np.asarray([ids], np.int32)
  aux = jax.device_get(_inspect_fn()(params, {'inputs': tokens}, graphdef=graphdef))
  f_attn_LxH = np.asarray(aux['f_attn_H'], np.float64)
  return {'ids': ids, 'tokens': token_labels(tokenizer, ids),
          'maps': np.asarray(aux['attn_map'], np.float64),
          'f_attn': f_attn_LxH.mean(axis=-1), 'f_attn_per_head': f_attn_LxH}
