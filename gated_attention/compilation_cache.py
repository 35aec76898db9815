"""JAX's persistent compilation cache, switched on by `config.compilation_cache` (a directory).

Runs of the same shapes compile the same programs (the training step, the evaluation and
inspection passes); with a shared cache directory the second run, and an analysis of the first,
read the compiled executable from disk instead of compiling it again. Every compile is stored,
however short (a small model's step compiles in seconds on a 2-core CPU, below JAX's default
threshold of one second for some of the programs). The cache is keyed by the program, the
compiler options, the jaxlib version and the devices, so a changed config or a new jaxlib
compiles afresh; it changes no result (a cached executable is the one the compiler produced).

The experiment runner (experiments/run.py) turns it on for its runs; `JAX_COMPILATION_CACHE_DIR`
in the environment does the same for any command.
"""

import os

from gated_attention import storage
from gated_attention.errors import ConfigError

_enabled = ['']
_off = [False]   # a multi-process CPU run: never on


def off_for_multiprocess_cpu() -> bool:
  """Turns the persistent cache off in a multi-process run on CPU devices (cluster/startup.py calls
  it once jax.distributed is up), whether config.compilation_cache or JAX_COMPILATION_CACHE_DIR
  asked for it: there, executables read back from the cache hang the processes in a collective
  (measured with jaxlib 0.10.2 and gloo: the evaluation's inspection pass, every time, with one
  cache per process too; compiled afresh, the same programs run). Why, as far as measured
  (2026-12-07): each process's cache keys differ and JAX writes entries from process 0 only, so
  in a second launch process 0 loads its executables while the others compile theirs; and an
  executable deserialized on the CPU has another fingerprint than the same program freshly
  compiled (jax's `.runtime_executable().fingerprint`, printed in both processes of a two-process
  psum). That mixed launch ran the training and evaluation steps and hung in the inspection
  pass's collectives. Which identifier the CPU collectives match on was not traced; the two
  executables' fingerprints are the one difference measured. Since the keys differ, no setting
  of ours makes every process load (or none): the cache stays off there.
  TPU and GPU pods keep it. Returns whether it did."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or jax.default_backend() != 'cpu':
    return False
  if (jax.config.jax_compilation_cache_dir or _enabled[0]) and jax.process_index() == 0:
    print('Note: the persistent compilation cache is off in this multi-process CPU run (cached '
          'CPU executables hang its collectives); every process compiles afresh.', flush=True)
  jax.config.update('jax_enable_compilation_cache', False)
  _off[0] = True
  return True


def enable(directory: str):
  """Stores and reads compiled programs in `directory` ('': leaves JAX's setting as it is)."""
  if not directory or _off[0]:
    return
  remote = storage.is_remote(directory)    # gs://: JAX reads and writes it through etils epath
  directory = storage.abspath(directory if remote else os.path.expanduser(directory))
  if _enabled[0] == directory:
    return
  if remote:
    storage.check_reachable(directory, write=True)
  try:
    storage.makedirs(directory)
  except OSError as e:
    raise ConfigError(f'config.compilation_cache={directory!r} cannot be created ({e}); give a '
                      "writable directory, or '' for no persistent compilation cache.") from None
  if not remote and not os.access(directory, os.W_OK):
    raise ConfigError(f'config.compilation_cache={directory!r} is not writable; give a writable '
                      "directory, or '' for no persistent compilation cache.")
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  compilation_cache.reset_cache()  # a cache JAX opened before (another directory) is closed
  _enabled[0] = directory
