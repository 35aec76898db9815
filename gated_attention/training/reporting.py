"""What a training run reports: metrics.jsonl and TensorBoard rows, the progress line, and
throughput (tokens/s, achieved TFLOP/s, MFU on known chips). Only process 0 writes."""

import json
import math
import os
import re
import sys
import threading
import time

import jax
import numpy as np

from gated_attention import chips
from gated_attention import storage
from gated_attention.errors import CheckpointError
from gated_attention.model import transformer as model_lib
from gated_attention.runs import rundir


_HOOKED = []


def _summary_writer():
  """tensorboardX's SummaryWriter, imported without torch. tensorboardX's writer imports torch
  whenever it is installed (only to accept torch tensors as values; ours are floats): 1.4 of the
  1.5 s its import took in every `main.py` process where torch is installed, as it is in this
  repository's test environment (requirements-test.txt). A torch this process already imported
  is left as it is."""
  if 'torch' in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    return SummaryWriter
  sys.modules['torch'] = None       # `import torch` raises ImportError while it is None
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    if sys.modules.get('torch', 0) is None:
      del sys.modules['torch']
  return SummaryWriter


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


class _Appender:
  """A local run's metrics.jsonl: one line a row, appended and flushed at once. A last line left
  torn (a disk that filled while a row was written, a kill) is cut off when the next run opens
  the file (`repair_torn_tail`), so every line parses and no row is glued onto it."""

  def __init__(self, workdir: str):
    path = os.path.join(workdir, rundir.METRICS_FILE)
    repair_torn_tail(path)
    # unbuffered: a write that fails (a full disk) leaves nothing behind for close() to retry
    self.file = open(path, 'ab', buffering=0)  # pylint: disable=consider-using-with

  def _write(self, data: bytes):
    while data:
      data = data[self.file.write(data):]

  def write(self, line: str):
    self._write(line.encode())

  def flush(self):
    pass

  def close(self):
    self.file.close()


def repair_torn_tail(path: str, say=None) -> int:
  """Cuts a torn last line off a local metrics.jsonl (bytes after its last newline: a row whose
  write a full disk or a kill cut short; issue 57: it stayed as a line that never parses, and
  the next run's first row was written after it). Truncating needs no free space. The bytes
  removed (0 if the file ends with a newline, is empty or is absent); `say` names them."""
  try:
    f = open(path, 'r+b')  # pylint: disable=consider-using-with
  except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
    return 0
  with f:
    end = f.seek(0, os.SEEK_END)
    keep, block = end, 1 << 16
    while keep > 0:
      start = max(0, keep - block)
      f.seek(start)
      newline = f.read(keep - start).rfind(b'\n')
      if newline >= 0:
        keep = start + newline + 1
        break
      keep = start
    if keep == end:
      return 0
    f.seek(keep)
    torn = f.read(min(end - keep, 80))
    f.truncate(keep)
  step = re.match(rb'\{"step": (\d+)', torn)
  (say or _say_now)(f'Note: {path} ended in a torn row ({end - keep} bytes'
      f'{f" of step {int(step.group(1))}" if step else ""}: a write cut short by a full disk or '
      'a kill); it was removed, so every line parses. The steps after the latest checkpoint are '
      'trained and logged again.')
  return end - keep


def _say_now(text: str):
  print(text, flush=True)


class _Chunks:
  """A run on object storage (no append): rows are buffered and written as numbered chunk
  objects RUN/metrics/<n>.jsonl, each created only if absent (never overwriting one), at every
  checkpoint (so the rows up to a checkpoint are stored before it), at the end, and when the
  oldest buffered row is `every_s` seconds old. rundir.read_metrics reads them back in order."""

  def __init__(self, workdir: str, every_s: float):
    self.workdir, self.every_s = workdir, every_s
    self.next = max(rundir.metrics_chunk_numbers(workdir), default=0) + 1
    self.lines, self.since = [], None

  def write(self, line: str):
    self.lines.append(line)
    self.since = self.since or time.monotonic()
    if time.monotonic() - self.since >= self.every_s:
      self.flush()

  def flush(self):
    if not self.lines:
      return
    data = ''.join(self.lines)
    while not storage.create(rundir.metrics_chunk(self.workdir, self.next), data):
      self.next += 1            # a chunk of that number exists (written by an earlier attempt)
    self.next += 1
    self.lines, self.since = [], None

  def close(self):
    self.flush()


class _Mirror:
  """A local folder whose files are copied whole to a remote one at every flush (TensorBoard's
  event files and the libraries' logs of a run on object storage: they append)."""

  def __init__(self, remote: str, prefix: str):
    self.remote, self.local = remote, storage.scratch.make(prefix)   # a killed run's are removed here
    self._sent = {}

  def sync(self):
    for name in storage.scratch.files(self.local):
      path = os.path.join(self.local, name)
      if not os.path.isfile(path):
        continue
      stat = os.stat(path)
      if self._sent.get(name) != (stat.st_size, stat.st_mtime_ns):
        with open(path, 'rb') as f:
          storage.write(storage.join(self.remote, name), f.read())
        self._sent[name] = (stat.st_size, stat.st_mtime_ns)

  def close(self):
    try:
      self.sync()
    finally:
      storage.scratch.remove(self.local)


# A run on object storage writes its buffered metrics rows at least this often (seconds).
METRICS_FLUSH_S = 60.0


class MetricsWriter:
  """metrics.jsonl (one JSON object per line, with "step" and "split") and TensorBoard events;
  on object storage metric chunks (`_Chunks`) and event files written locally and copied to
  RUN/tensorboard/ at every flush.

  Only process 0 writes. TensorBoard output is optional: if writing it fails (a full disk), it is
  turned off for the rest of the run with one note; metrics.jsonl keeps every row. `flush()`
  stores every row written so far (the loop calls it before each checkpoint).
  """

  def __init__(self, workdir: str, flush_s: float = METRICS_FLUSH_S):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    self.tb_mirror = None
    if storage.is_remote(workdir):
      self.jsonl = _Chunks(workdir, flush_s)
      self.tb_mirror = _Mirror(storage.join(workdir, rundir.TENSORBOARD_DIR),
                               'gated_attention_tensorboard_')
      tb_dir = self.tb_mirror.local
    else:
      os.makedirs(workdir, exist_ok=True)
      self.jsonl = _Appender(workdir)
      tb_dir = os.path.join(workdir, rundir.TENSORBOARD_DIR)
    self.tb_failed = threading.Event()
    try:
      self.tb = _summary_writer()(tb_dir)
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
    try:
      self.jsonl.write(json.dumps(row) + '\n')
    except OSError as e:      # a full disk (or a lost bucket) between two checkpoints
      raise CheckpointError(
          f'Writing the metrics of step {step} failed: {type(e).__name__}: {e}. The checkpoints '
          'already written are intact; free space (or fix the storage), then run the same '
          'command again to resume from the latest one.') from e
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

  def flush(self):
    """Stores the rows written so far (object storage: a chunk; TensorBoard's files copied)."""
    if not self.enabled:
      return
    try:
      self.jsonl.flush()
      if self.tb_mirror is not None:
        self.tb_mirror.sync()
    except storage.StorageError as e:   # a stalled or lost endpoint (each request is bounded)
      storage.waits.closing('metrics')
      raise storage.StorageError(
          f'Storing the metrics rows failed: {e} The checkpoints already written are intact; '
          'once the storage answers, run the same command again to resume from the latest '
          'one.') from e

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
      if self.tb_mirror is not None:
        self.tb_mirror.close()


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


def device_memory() -> dict:
  """The devices' memory as the backend reports it (`memory_stats()`; TPU and GPU do, the CPU
  does not: then {}): the largest peak and current bytes in use over this process's devices,
  and their limit, in GiB."""
  peak, now, limit = [], [], []
  for device in jax.local_devices():
    try:
      stats = device.memory_stats()
    except Exception:  # pylint: disable=broad-except   (a backend without the call)
      stats = None
    if not stats or 'peak_bytes_in_use' not in stats:
      continue
    peak.append(stats['peak_bytes_in_use'])
    now.append(stats.get('bytes_in_use', 0))
    if stats.get('bytes_limit'):
      limit.append(stats['bytes_limit'])
  if not peak:
    return {}
  out = {'memory_peak_gib': max(peak) / 2**30, 'memory_in_use_gib': max(now) / 2**30}
  if limit:
    out['memory_limit_gib'] = min(limit) / 2**30
  return out


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


