"""training/reporting.py: the device memory the backend reports, as metrics; metrics.jsonl's torn
last line (a disk that filled while a row was written) repaired by the next run (issue 57)."""

import errno
import json
import os
import types

import jax
import pytest

from gated_attention.errors import CheckpointError
from gated_attention.runs import rundir
from gated_attention.training import reporting


def _device(stats):
  def memory_stats():
    if isinstance(stats, Exception):
      raise stats
    return stats
  return types.SimpleNamespace(memory_stats=memory_stats)


def test_the_largest_peak_and_the_smallest_limit_over_the_devices(monkeypatch):
  gib = 2**30
  devices = [_device({'peak_bytes_in_use': 3 * gib, 'bytes_in_use': 1 * gib,
                      'bytes_limit': 16 * gib}),
             _device({'peak_bytes_in_use': 5 * gib + gib // 2, 'bytes_in_use': 2 * gib,
                      'bytes_limit': 15 * gib}),
             _device(None), _device(NotImplementedError('no stats'))]
  monkeypatch.setattr(jax, 'local_devices', lambda: devices)
  assert reporting.device_memory() == pytest.approx(
      {'memory_peak_gib': 5.5, 'memory_in_use_gib': 2.0, 'memory_limit_gib': 15.0})


def test_nothing_where_the_backend_reports_nothing(monkeypatch):
  assert all(d.memory_stats() is None for d in jax.local_devices())    # the CPU
  assert reporting.device_memory() == {}
  monkeypatch.setattr(jax, 'local_devices', lambda: [_device({'bytes_in_use': 7})])
  assert reporting.device_memory() == {}


# metrics.jsonl's torn tail ------------------------------------------------------------------------

class _FullDisk:
  """A metrics file on a disk that fills: the first write that reaches `room` bytes is cut
  short there, as the kernel does, and the next raises ENOSPC."""

  def __init__(self, file, room: int):
    self.file, self.room = file, room

  def write(self, data: bytes) -> int:
    if self.room <= 0:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    n = self.file.write(data[:self.room])
    self.room -= n
    return n

  def close(self):
    self.file.close()


def _lines(workdir) -> list[bytes]:
  with open(os.path.join(workdir, rundir.METRICS_FILE), 'rb') as f:
    return f.read().split(b'\n')


def test_a_torn_row_stops_the_run_and_the_next_start_cuts_it_off(tmp_path, capsys):
  """Issue 57: a disk filling mid-row left `{"step": 41, "split": "train", "finite": true, ...`
  unended in metrics.jsonl for good (the next run ended it with a newline: a line that never
  parses). The write names the full disk; the next writer cuts the torn row off, says so, and
  every line parses, its own rows on lines of their own."""
  workdir = str(tmp_path)
  writer = reporting.MetricsWriter(workdir)
  writer.tb = None
  for step in (1, 2):
    writer.write(step, 'train', {'loss': 3.5 + step})
  writer.jsonl.file = _FullDisk(writer.jsonl.file, room=20)
  with pytest.raises(CheckpointError, match=r'Writing the metrics of step 3 failed: OSError: '
                     r'\[Errno 28\] No space left on device.*run the same command again'):
    writer.write(3, 'train', {'loss': 6.5})
  writer.close()
  torn = _lines(workdir)
  assert len(torn) == 3 and torn[-1] == b'{"step": 3, "split":', torn   # torn, unended
  capsys.readouterr()

  writer = reporting.MetricsWriter(workdir)           # the next start
  note = capsys.readouterr().out
  assert 'ended in a torn row (20 bytes of step 3' in note and 'removed' in note, note
  writer.write(3, 'train', {'loss': 6.25})
  writer.close()
  lines = _lines(workdir)
  assert lines[-1] == b''
  rows = [json.loads(line) for line in lines[:-1]]       # every line parses
  assert [(r['step'], r['loss']) for r in rows] == [(1, 4.5), (2, 5.5), (3, 6.25)]
  assert reporting.repair_torn_tail(os.path.join(workdir, rundir.METRICS_FILE)) == 0


@pytest.mark.parametrize('content', [b'', b'{"step": 1', b'{"step": 1}\n', b'x' * 70000 + b'\n' + b'y' * 70000])
def test_repair_torn_tail_keeps_every_whole_line(tmp_path, content):
  """Whole lines kept, the bytes after the last newline cut (a file with no newline at all
  becomes empty; a tail longer than one read block is found)."""
  path = tmp_path / 'metrics.jsonl'
  path.write_bytes(content)
  keep = content[:content.rfind(b'\n') + 1]
  assert reporting.repair_torn_tail(str(path), say=lambda _: None) == len(content) - len(keep)
  assert path.read_bytes() == keep
  assert reporting.repair_torn_tail(str(tmp_path / 'absent.jsonl')) == 0


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
  """tensorboardX's writer imports torch whenever it is installed (it is here: the tests'
  requirements), about 1 s and 180 MB in every `main.py` process for nothing its SummaryWriter
  needs from it (reporting._summary_writer). In a fresh process: the events are written, torch
  was not imported, and `import torch` still works after."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = (
      'import sys\n'
      'from gated_attention.training import reporting\n'
      'writer = reporting.MetricsWriter(sys.argv[1])\n'
      'writer.write(1, "train", {"loss": 3.25})\n'
      'writer.close()\n'
      'print("torch imported:", sys.modules.get("torch") is not None)\n'
      'try:\n'
      '  import torch\n'
      '  print("torch imports after:", torch.ones(2).sum().item() == 2.0)\n'
      'except ModuleNotFoundError:\n'
      '  print("torch is not installed")\n')
  out = subprocess.run([sys.executable, '-c', code, str(tmp_path)], capture_output=True,
                       text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'torch imported: False' in out.stdout, out.stdout
  events = os.listdir(tmp_path / rundir.TENSORBOARD_DIR)
  assert any(name.startswith('events.out.tfevents') for name in events), events
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec('torch') is not None:   # installed: the blocked import was undone
    assert 'torch imports after: True' in out.stdout, out.stdout
