"""What a training run reports: metrics.jsonl and TensorBoard rows, the progress line, and
throughput (tokens/s, achieved TFLOP/s, MFU on known chips). Only process 0 writes."""

import json
import math
import os
import sys
import threading
import time

import jax
import numpy as np

from gated_attention import chips
from gated_attention.model import transformer as model_lib
from gated_attention.runs import rundir


_HOOKED = []


def _quiet_tensorboard_thread():
  """tensorboardX writes events in a thread of its own: on a full disk its OSError was a traceback
  on the console (and another from its exit hook), after the run's own one-paragraph error. A
  thread tagged by MetricsWriter that fails with an OSError sets its writer's flag instead."""
  if _HOOKED:
    return
  previous = threading.excepthook

  def hook(args):
    failed = getattr(args.thread, '_metrics_writer_failed', None)
    if failed is not None and issubclass(args.exc_type, OSError):
      failed.set()
      return
    previous(args)
  threading.excepthook = hook
  _HOOKED.append(hook)


class MetricsWriter:
  """metrics.jsonl (one JSON object per line, with "step" and "split") and TensorBoard events.

  Only process 0 writes. TensorBoard output is optional: if writing it fails (a full disk), it is
  turned off for the rest of the run with one note; metrics.jsonl keeps every row.
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.jsonl = open(os.path.join(workdir, rundir.METRICS_FILE), 'a')
    self.tb_failed = threading.Event()
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self.tb = SummaryWriter(os.path.join(workdir, rundir.TENSORBOARD_DIR))
    except ImportError:  # TensorBoard output is optional
      self.tb = None
    except OSError as e:
      self.tb = None
      self._note(e)
    self.tb_events = None       # tensorboardX's EventFileWriter (its thread, its close)
    if self.tb is not None:
      _quiet_tensorboard_thread()
      try:
        self.tb_events = self.tb._get_file_writer().event_writer  # pylint: disable=protected-access
        self.tb_events._worker._metrics_writer_failed = self.tb_failed  # pylint: disable=protected-access
      except AttributeError:    # another tensorboardX: its thread's errors are its own
        pass
      except OSError as e:
        self._tb_off(e)

  def _note(self, e):
    print(f'Note: TensorBoard events are off for the rest of this run (writing them failed: '
          f'{type(e).__name__}: {e}); metrics.jsonl has every row.', flush=True)

  def _tb_off(self, e):
    """No more TensorBoard events: tensorboardX's own close (and its exit hook) would raise
    again, and its queue blocks once its thread is gone."""
    if self.tb is not None:
      if self.tb_events is not None:
        self.tb_events._closed = True  # pylint: disable=protected-access
      self.tb = None
      self._note(e)

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: _jsonable(v) for k, v in metrics.items()})
    self.jsonl.write(json.dumps(row) + '\n')
    self.jsonl.flush()
    if self.tb is not None and self.tb_failed.is_set():
      self._tb_off(OSError('its writer thread failed'))
    if self.tb is not None:
      try:
        for k, v in row.items():
          if isinstance(v, (int, float)) and k != 'step':
            self.tb.add_scalar(f'{split}/{k}', v, step)
        self.tb.flush()
      except OSError as e:
        self._tb_off(e)

  def close(self):
    if self.enabled:
      self.jsonl.close()
      if self.tb is not None and self.tb_failed.is_set():
        self._tb_off(OSError('its writer thread failed'))
      if self.tb is not None:
        try:
          self.tb.close()
        except OSError as e:
          self._tb_off(e)


def _jsonable(v):
  v = np.asarray(v)
  if v.ndim == 0:
    x = v.item()
    return None if isinstance(x, float) and not math.isfinite(x) else x
  return [_jsonable(x) for x in v]


class Progress:
  """A tqdm bar with ETA on a terminal; plain log lines otherwise. With a `prefix` (one of several
  seeds trained together, training/seeds.py) always plain lines, each starting with it."""

  def __init__(self, start: int, total: int, prefix: str = ''):
    self.bar, self.prefix = None, prefix
    if jax.process_index() == 0 and sys.stdout.isatty() and not prefix:
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
      print(f'{self.prefix}step {step}/{self.total} {line} eta {eta:.0f}s', flush=True)

  def write(self, text: str):
    if jax.process_index() != 0:
      return
    if self.bar is not None:
      self.bar.write(text)
    else:
      print(self.prefix + text, flush=True)

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


