"""One persistent XLA compilation cache for the whole test session, in this process and in every
subprocess a test starts (they inherit the environment).

Many tests build the same tiny model's programs (the training step, the evaluation pass) in
separate `Setup`s, subprocesses or `main.py` commands; with the cache each distinct program
compiles once per session and is read from disk after that. A cached executable is the one the
compiler produced (gated_attention/compilation_cache.py), so no result changes; tests that
exercise the cache itself (tests/test_compilation_cache.py, tests/test_faults.py) point JAX at
their own directory and restore this one afterwards. A `JAX_COMPILATION_CACHE_DIR` set by the
caller is used as it is and kept; otherwise the session's directory is removed at its end.
"""

import os
import shutil
import tempfile

_SETTINGS = {'JAX_COMPILATION_CACHE_DIR': None,
             'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
             'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}
_made = []


def pytest_configure(config):
  del config
  if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    _made.append(tempfile.mkdtemp(prefix='gated_attention_test_xla_cache_'))
    os.environ['JAX_COMPILATION_CACHE_DIR'] = _made[0]
  for name, value in _SETTINGS.items():
    if value is not None:
      os.environ.setdefault(name, value)
  import jax  # pylint: disable=g-import-not-at-top  (after the environment: JAX reads it once)
  jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
  jax.config.update('jax_persistent_cache_min_compile_time_secs',
                    float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))
  jax.config.update('jax_persistent_cache_min_entry_size_bytes',
                    int(os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES']))


def pytest_unconfigure(config):
  del config
  for directory in _made:
    shutil.rmtree(directory, ignore_errors=True)
