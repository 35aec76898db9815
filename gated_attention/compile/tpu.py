"""A TPU slice's devices on any machine, for compiling without running: libtpu loaded
compile-only (quiet, no lockfile, JAX's default backend kept CPU), a topology's name parsed
(`parse_topology`), its devices (`topology_devices`), and what the TPU compiler wrote to libtpu's
log while compiling (`log_sizes` before, `oom_report` after: its memory-usage report of a step
that does not fit). aot.py and aot_long_context.py compile on these devices.

Per-device numbers: v5e/v5p/v6e expose one JAX device per chip; v4's compile-only topology has one
device per TensorCore (two per chip), so its chip figures are halved per device (chips.py).
"""

import atexit
import glob
import os
import shutil
import tempfile

from gated_attention.chips import ALIASES, TPU_CHIPS
from gated_attention.errors import ConfigError, UserError

# libtpu, loaded on a machine without TPUs, otherwise prints warnings about the missing TPU
# metadata and takes /tmp/libtpu_lockfile (then fails while any other JAX process holds it).
_LIBTPU_ENV = {
    'TPU_SKIP_MDS_QUERY': '1',            # no GCE metadata server queries
    'TPU_WORKER_HOSTNAMES': 'localhost',  # silences "could not determine TPU worker hostnames"
    'TPU_HOST_BOUNDS': '1,1,1',           # silences "Failed to find host bounds"
    'ALLOW_MULTIPLE_LIBTPU_LOAD': '1',    # do not fail when another process holds the lockfile
}
_log_dir = None


def prepare_libtpu():
  """Environment for a compile-only libtpu: quiet, no lockfile, logs in a known directory."""
  global _log_dir
  for k, v in _LIBTPU_ENV.items():
    os.environ.setdefault(k, v)
  if _log_dir is None:
    _log_dir = os.environ.get('TPU_LOG_DIR')
    if not _log_dir:
      _log_dir = tempfile.mkdtemp(prefix='tpu_aot_logs_')
      os.environ['TPU_LOG_DIR'] = _log_dir
      atexit.register(shutil.rmtree, _log_dir, ignore_errors=True)
  import jax  # pylint: disable=g-import-not-at-top
  # No public JAX API tells whether backends are initialised (jax.extend.backend.backends()
  # initialises them): the private one is used.
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  # Compiling for a topology needs no TPU backend; keep the default backend CPU so JAX does not
  # also try (and fail) to open local TPUs. Only possible before any backend is initialised.
  if not os.environ.get('JAX_PLATFORMS') and not xla_bridge.backends_are_initialized():
    jax.config.update('jax_platforms', 'cpu')


def parse_topology(topology: str) -> tuple[str, str]:
  """'v5p:4x4x4' -> ('v5p', 'v5p:4x4x4'); 'v5litepod:2x2' -> ('v5e', 'v5e:2x2')."""
  example = 'such as v5p:4x4x4, v5e:4x4, v6e:2x2 or v4:2x2x2 (<generation>:<chip grid>)'
  if not topology:
    raise ConfigError(f'--mode=compile needs --topology, a TPU topology name {example}.')
  if ':' not in topology:
    raise ConfigError(f'--topology={topology!r}: expected a TPU topology name {example}.')
  gen, shape = topology.split(':', 1)
  gen = ALIASES.get(gen.lower(), gen.lower())
  if gen not in TPU_CHIPS:
    raise ConfigError(f'--topology={topology!r}: unknown TPU generation {gen!r}; known: '
                      f'{", ".join(TPU_CHIPS)} (aliases: {", ".join(ALIASES)}).')
  dims = shape.lower().split('x')
  if not all(d.isdigit() and int(d) > 0 for d in dims):
    raise ConfigError(f'--topology={topology!r}: the chip grid {shape!r} is not positive '
                      f'integers joined by x; expected a TPU topology name {example}.')
  return gen, f'{gen}:{shape.lower()}'


def topology_devices(topology: str):
  """(generation, compile-only devices) of a TPU slice, e.g. 64 for v5p:4x4x4."""
  gen, name = parse_topology(topology)
  prepare_libtpu()
  try:
    import libtpu  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise UserError('--mode=compile needs libtpu (compile-only, no TPU required): '
                    'pip install -r requirements-tpu.txt') from e
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    devices = topologies.get_topology_desc(topology_name=name, platform='tpu').devices
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [''])[0][:300]
    raise ConfigError(f'libtpu does not know the topology {name!r}: {first}') from e
  return gen, list(devices)


def log_sizes() -> dict:
  """This process's libtpu WARNING logs -> size. libtpu reads TPU_LOG_DIR when it loads, which
  may have happened before prepare_libtpu (JAX probing for TPUs): look in the default too."""
  dirs = {d for d in (_log_dir, os.path.join(tempfile.gettempdir(), 'tpu_logs')) if d}
  return {p: os.path.getsize(p) for d in dirs
          for p in glob.glob(os.path.join(d, f'*.log.WARNING.*.{os.getpid()}'))}


def oom_report(logs_before: dict) -> str:
  """The memory-usage report libtpu appended to its WARNING log during this compile."""
  for path in log_sizes():
    with open(path, errors='replace') as f:
      f.seek(logs_before.get(path, 0))
      text = f.read()
    i = text.rfind('Ran out of memory in memory space hbm')
    if i >= 0:
      return text[i:]
  return ''
