"""Why a test is slow: where each test's seconds go (docs/development.md, "Where the time goes").

    GATED_ATTENTION_TEST_TIMES=/tmp/times .venv/bin/python -m pytest -q      # every worker writes
    .venv/bin/python -m tests.timing /tmp/times                              # the summary

With the variable set (tests/conftest.py registers this plugin), every test adds one JSON line
to `<dir>/<worker>.jsonl`: its wall seconds (setup, call and teardown together), the seconds
JAX spent in this process tracing, lowering and compiling (`jax.monitoring`'s compile events,
a persistent-cache read included), how many programs it compiled and how many of those the
persistent cache answered, the subprocesses it started and the seconds their lives overlapped
the test, and the seconds the test's own thread slept. What is left is running: steps,
data, I/O, Python. Subprocesses' own compiles are theirs, inside "subprocess" seconds.
"""

import collections
import json
import os
import subprocess
import sys
import threading
import time

import pytest

_COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                   '/jax/core/compile/jaxpr_to_mlir_module_duration',
                   '/jax/core/compile/backend_compile_duration')


class _Recorder:
  """The plugin: one record per test, written at the end of its teardown."""

  def __init__(self, directory: str, worker: str):
    os.makedirs(directory, exist_ok=True)
    self.path = os.path.join(directory, f'{worker}.jsonl')
    self.main = threading.get_ident()
    self.current = None
    self._listen()
    self._wrap_popen()
    self._wrap_sleep()

  def _new(self):
    return {'wall_s': 0.0, 'compile_s': 0.0, 'compiles': 0, 'cache_hits': 0,
            'subprocesses': 0, 'subprocess_s': 0.0, 'sleep_s': 0.0, 'children': []}

  def _listen(self):
    from jax import monitoring  # pylint: disable=g-import-not-at-top

    def on_duration(event, duration, **_):
      if self.current is not None and event in _COMPILE_EVENTS:
        self.current['compile_s'] += duration
        self.current['compiles'] += event.endswith('backend_compile_duration')

    def on_event(event, **_):
      if self.current is not None and event == '/jax/compilation_cache/cache_hits':
        self.current['cache_hits'] += 1
    monitoring.register_event_duration_secs_listener(on_duration)
    monitoring.register_event_listener(on_event)

  def _wrap_popen(self):
    recorder, init = self, subprocess.Popen.__init__

    def counted_init(popen, *args, **kwargs):
      init(popen, *args, **kwargs)
      if recorder.current is not None:
        recorder.current['subprocesses'] += 1
        recorder.current['children'].append((popen, time.monotonic()))
    subprocess.Popen.__init__ = counted_init

  def _wrap_sleep(self):
    recorder, sleep = self, time.sleep

    def timed_sleep(seconds):
      if recorder.current is not None and threading.get_ident() == recorder.main:
        recorder.current['sleep_s'] += max(0.0, float(seconds))
      sleep(seconds)
    time.sleep = timed_sleep

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item, nextitem):
    del nextitem
    self.current, start = self._new(), time.monotonic()
    yield
    record, self.current = self.current, None
    end = time.monotonic()
    for popen, began in record.pop('children'):   # to the wait that saw it end, or the test's
      ended = min(getattr(popen, '_timing_ended', end), end)
      record['subprocess_s'] += max(0.0, ended - began)
    record['wall_s'] = end - start
    record['test'] = item.nodeid
    with open(self.path, 'a') as f:
      f.write(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in record.items()}) + '\n')


def _mark_exit_times():
  """A subprocess's end, as the first Popen.wait (run, communicate) that sees it, for
  subprocess_s."""
  wait = subprocess.Popen._wait   # pylint: disable=protected-access

  def timed_wait(popen, *args, **kwargs):
    code = wait(popen, *args, **kwargs)
    if code is not None and not hasattr(popen, '_timing_ended'):
      popen._timing_ended = time.monotonic()   # pylint: disable=protected-access
    return code
  subprocess.Popen._wait = timed_wait   # pylint: disable=protected-access


def register(config):
  """tests/conftest.py: the plugin, where GATED_ATTENTION_TEST_TIMES names a directory (not in
  pytest-xdist's controller, which runs no test)."""
  directory = os.environ.get('GATED_ATTENTION_TEST_TIMES')
  if not directory:
    return
  worker = getattr(config, 'workerinput', {}).get('workerid', 'main')
  _mark_exit_times()
  config.pluginmanager.register(_Recorder(directory, worker), 'gated_attention_timing')


def summary(directory: str, top: int = 25) -> str:
  """The slowest modules and tests, each split into compile / subprocess / sleep / the rest."""
  rows = []
  for name in sorted(os.listdir(directory)):
    if name.endswith('.jsonl'):
      with open(os.path.join(directory, name)) as f:
        rows += [json.loads(line) for line in f if line.strip()]
  if not rows:
    return f'no records in {directory}'
  keys = ('wall_s', 'compile_s', 'subprocess_s', 'sleep_s', 'compiles', 'cache_hits',
          'subprocesses')
  modules = collections.defaultdict(lambda: dict.fromkeys(keys + ('tests',), 0))
  for r in rows:
    m = modules[r['test'].split('::')[0]]
    m['tests'] += 1
    for k in keys:
      m[k] += r[k]

  def line(name, r, tests=None):
    rest = max(0.0, r['wall_s'] - r['compile_s'] - r['subprocess_s'] - r['sleep_s'])
    count = f'{tests:5d} ' if tests is not None else ''
    return (f'{r["wall_s"]:8.1f} {count}{r["compile_s"]:8.1f} {r["compiles"]:5d} '
            f'{r["cache_hits"]:5d} {r["subprocess_s"]:8.1f} {r["subprocesses"]:4d} '
            f'{r["sleep_s"]:7.1f} {rest:7.1f}  {name}')
  total = {k: sum(r[k] for r in rows) for k in keys}
  head = ('  wall s {}compile s  jits  hits  subproc s  n  sleep s  rest s')
  out = [f'{len(rows)} tests, {total["wall_s"]:.0f} s summed over workers: compile '
         f'{total["compile_s"]:.0f} s in this process ({total["compiles"]} programs, '
         f'{total["cache_hits"]} from the persistent cache), subprocesses '
         f'{total["subprocess_s"]:.0f} s ({total["subprocesses"]}), sleeps '
         f'{total["sleep_s"]:.0f} s', '', 'Modules:', head.format('tests ')]
  out += [line(n, m, m['tests']) for n, m in
          sorted(modules.items(), key=lambda kv: -kv[1]['wall_s'])[:top]]
  out += ['', 'Tests:', head.format('')]
  out += [line(r['test'], r) for r in sorted(rows, key=lambda r: -r['wall_s'])[:top]]
  return '\n'.join(out)


if __name__ == '__main__':
  print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25))
