"""What a training run reports: metrics.jsonl and TensorBoard rows, the progress line, and
throughput (tokens/s, achieved TFLOP/s, MFU on known chips). Only process 0 writes."""

import json
import math
import os
import sys
import time

import jax
import numpy as np

from gated_attention import chips
from gated_attention.model import transformer as model_lib


class MetricsWriter:
  """metrics.jsonl (one JSON object per line, with "step" and "split") and TensorBoard events.

  Only process 0 writes.
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self.tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))
    except ImportError:  # TensorBoard output is optional
      self.tb = None

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: _jsonable(v) for k, v in metrics.items()})
    self.jsonl.write(json.dumps(row) + '\n')
    self.jsonl.flush()
    if self.tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != 'step':
          self.tb.add_scalar(f'{split}/{k}', v, step)
      self.tb.flush()

  def close(self):
    if self.enabled:
      self.jsonl.close()
      if self.tb is not None:
        self.tb.close()


def _jsonable(v):
  v = np.asarray(v)
  if v.ndim == 0:
    x = v.item()
    return None if isinstance(x, float) and not math.isfinite(x) else x
  return [_jsonable(x) for x in v]


class Progress:
  """A tqdm bar with ETA on a terminal; plain log lines otherwise."""

  def __init__(self, start: int, total: int):
    self.bar = None
    if jax.process_index() == 0 and sys.stdout.isatty():
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, initial=start, unit='step', dynamic_ncols=True)
    self.t0, self.start, self.total = time.time(), start, total

  def update(self, step: int, line: str | None):
    if self.bar is not None:
      self.bar.update(step - self.bar.n)
      if line:
        self.bar.set_postfix_str(line)
    elif line and jax.process_index() == 0:
      done = step - self.start
      eta = (time.time() - self.t0) / max(done, 1) * (self.total - step)
      print(f'step {step}/{self.total} {line} eta {eta:.0f}s', flush=True)

  def write(self, text: str):
    if jax.process_index() != 0:
      return
    if self.bar is not None:
      self.bar.write(text)
    else:
      print(text, flush=True)

  def close(self):
    if self.bar is not None:
      self.bar.close()


class Throughput:
  """Step time, tokens/s, achieved TFLOP/s per device, (on known chips) MFU, and data_wait:
  the fraction of the wall time since the last reset spent waiting for batches."""

  def __init__(self, config, model_cfg):
    self.tokens_per_step = config.train.batch_size * config.data.seq_len
    self.flops_per_token = model_lib.train_flops_per_token(model_cfg, config.data.seq_len)
    self.chip = chips.chip_spec(jax.devices()[0].device_kind)
    self.t_last, self.steps, self.waited = time.time(), 0, 0.0

  def tick(self, data_wait: float = 0.0):
    """One step, which waited `data_wait` seconds for its batch."""
    self.steps += 1
    self.waited += data_wait

  def reset(self):
    self.t_last, self.steps, self.waited = time.time(), 0, 0.0

  def metrics(self) -> dict:
    elapsed = max(time.time() - self.t_last, 1e-9)
    dt = elapsed / max(self.steps, 1)
    tflops = self.flops_per_token * self.tokens_per_step / dt / 1e12 / jax.device_count()
    out = dict(step_time=dt, tokens_per_sec=self.tokens_per_step / dt,
               tflops_per_sec_per_device=tflops, data_wait=min(self.waited / elapsed, 1.0))
    if self.chip:
      out['mfu'] = tflops * 1e12 / self.chip['peak_bf16_flops']
    return out


