"""training/reporting.py's device memory: what the backend reports, as metrics."""

import types

import jax
import pytest

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
