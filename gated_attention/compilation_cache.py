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
_off = [False]   # a multi-process CPU run whose JAX lacks what for_multiprocess_cpu needs


def for_multiprocess_cpu() -> bool:
  """Makes the persistent cache safe in a multi-process run on CPU devices (cluster/startup.py
  calls it once jax.distributed is up). Returns whether this is such a run.

  Why it needs to (measured with jaxlib 0.10.2 and gloo, 2026-12-07): an executable read back
  from the cache and the same program compiled afresh are not interchangeable in a collective.
  A launch where process 0 loaded its programs from the cache and process 1 compiled them hung
  in the evaluation's inspection pass (tests/pod.py's 2-process run, until train.stop_timeout);
  their `.runtime_executable().fingerprint` differ. Such launches are the rule, not a rare
  race: each process's cache keys differ (the compile options carry the process), and JAX
  writes entries from process 0 only, so in every launch after the first process 0 loads and
  the others compile. So, here:
    - an executable compiled afresh is used in its serialized-and-loaded form, the form a cache
      read gives, in every process: whichever process hits or misses, the programs match (the
      same 2-process launch with process 0 loading and process 1 compiling then ran to its end,
      its losses those of a cold launch: tests/test_compilation_cache.py);
    - every process writes its own entries (its keys are its own, so no two processes write the
      same entry), and a later launch loads in every process: a 2-process launch of
      tests/pod.py took 9.5 s and 10 CPU-seconds instead of 15.7 s and 22.
  Both change JAX's private functions `jax._src.compiler._compile_and_write_cache` and
  `_cache_write`. If a JAX release changes them, the cache is turned off in such runs instead,
  with a note (every process compiles afresh, as before). TPU and GPU pods are left as they are."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or jax.default_backend() != 'cpu':
    return False
  if not _loaded_form_everywhere():
    if (jax.config.jax_compilation_cache_dir or _enabled[0]) and jax.process_index() == 0:
      print('Note: the persistent compilation cache is off in this multi-process CPU run (this '
            'JAX cannot make cached and fresh CPU executables match, and mixed ones hang its '
            'collectives); every process compiles afresh.', flush=True)
    jax.config.update('jax_enable_compilation_cache', False)
    _off[0] = True
  return True


_PATCHED = []
_COMPILE_ARGS = ['backend', 'computation', 'executable_devices', 'compile_options',
                 'host_callbacks', 'module_name', 'cache_key']
_WRITE_ARGS = ['cache_key', 'compile_time_secs', 'module_name', 'backend', 'executable',
               'host_callbacks']


def _loaded_form_everywhere() -> bool:
  """for_multiprocess_cpu's two changes to JAX's compiler (once a process); False where its
  functions are not the ones they were written against."""
  import inspect  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import compilation_cache as jax_cache  # pylint: disable=g-import-not-at-top
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  if _PATCHED:
    return True
  compile_fn = getattr(compiler, '_compile_and_write_cache', None)
  write_fn = getattr(compiler, '_cache_write', None)
  try:
    if (list(inspect.signature(compile_fn).parameters) != _COMPILE_ARGS
        or list(inspect.signature(write_fn).parameters) != _WRITE_ARGS
        or not hasattr(jax_cache, 'put_executable_and_time')):
      return False
  except (TypeError, ValueError):
    return False

  def compile_and_write_cache(backend, computation, executable_devices, compile_options,
                              host_callbacks, module_name, cache_key):
    executable = compile_fn(backend, computation, executable_devices, compile_options,
                            host_callbacks, module_name, cache_key)
    if host_callbacks:       # never cached (JAX's rule), so compiled afresh in every process
      return executable
    return backend.deserialize_executable(backend.serialize_executable(executable),
                                          executable_devices, compile_options)

  def cache_write(cache_key, compile_time_secs, module_name, backend, executable,
                  host_callbacks):
    """JAX's _cache_write without its process-0 rule (its other rules kept)."""
    if host_callbacks or compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:
      return
    try:
      jax_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                        int(compile_time_secs))
    except Exception as e:  # pylint: disable=broad-except  # as JAX's: a warning, not an error
      warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': "
                    f'{type(e).__name__}: {e}')

  compiler._compile_and_write_cache = compile_and_write_cache  # pylint: disable=protected-access
  compiler._cache_write = cache_write  # pylint: disable=protected-access
  _PATCHED.append(True)
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
