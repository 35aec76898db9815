"""config.compilation_cache (gated_attention/compilation_cache.py): JAX's persistent cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from gated_attention import compilation_cache
from gated_attention.errors import ConfigError

_NAMES = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs',
          'jax_persistent_cache_min_entry_size_bytes')


@pytest.fixture
def restore_jax():
  old = {name: getattr(jax.config, name) for name in _NAMES}
  yield
  for name, value in old.items():
    jax.config.update(name, value)
  jax_cache.reset_cache()
  compilation_cache._enabled[0] = ''


def test_programs_are_stored_and_read_back(tmp_path, restore_jax):
  del restore_jax
  compilation_cache.enable(str(tmp_path / 'cache'))
  x = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
  f = lambda a: jnp.tanh(a @ a.T) * 3.0  # noqa: E731
  first = np.asarray(jax.jit(f)(x))
  entries = sorted(p.name for p in (tmp_path / 'cache').iterdir())
  assert entries
  jax.clear_caches()                           # the in-memory cache: the next call reads the disk
  again = np.asarray(jax.jit(f)(x))
  assert sorted(p.name for p in (tmp_path / 'cache').iterdir()) == entries
  np.testing.assert_array_equal(first, again)
  np.testing.assert_allclose(first, np.tanh(x.astype(np.float64) @ x.T) * 3.0, rtol=1e-5,
                             atol=1e-5)


def test_off_leaves_jax_as_it_is(restore_jax):
  del restore_jax
  before = jax.config.jax_compilation_cache_dir
  compilation_cache.enable('')
  assert jax.config.jax_compilation_cache_dir == before


def test_an_unusable_directory_is_named(tmp_path, restore_jax):
  del restore_jax
  (tmp_path / 'file').write_text('x')
  with pytest.raises(ConfigError, match=r"config.compilation_cache=.*file/cache.* cannot be "
                     r"created.*writable directory, or ''"):
    compilation_cache.enable(str(tmp_path / 'file' / 'cache'))


def _launch(tmp_path, caches, name: str, bound: float = 240) -> dict:
  """A 2-process tests/pod.py run of 20 steps, process i with the cache directory caches[i]:
  {step: train loss}."""
  import os  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  from tests.pod import Pod  # pylint: disable=g-import-not-at-top
  env = {**os.environ, 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0'}
  (tmp_path / name).mkdir()
  pod = Pod(str(tmp_path / name / 'run'), 2, 2, env, 20, logs_dir=str(tmp_path / name),
            env_of={i: {'JAX_COMPILATION_CACHE_DIR': str(c)} for i, c in enumerate(caches)})
  codes = pod.run(bound=bound)
  assert [c for c, _ in codes] == [0, 0], pod.tails()
  rows = rundir.read_metrics(str(tmp_path / name / 'run'))
  return {r['step']: r['loss'] for r in rows if r['split'] == 'train'}


def _entries(cache) -> list[str]:
  return sorted(p.name for p in cache.iterdir() if p.name.endswith('-cache'))


def _programs(cache) -> list[str]:
  return sorted(name.rsplit('-', 2)[0] for name in _entries(cache))


@pytest.mark.slow   # ~50 s: three 2-process launches
def test_a_multiprocess_cpu_run_reads_the_cache_in_any_mix(tmp_path):
  """compilation_cache.for_multiprocess_cpu, with a cache directory per process so that a test can
  choose who loads: a cold 2-process CPU launch stores every process's programs (process 1's
  too: JAX writes from process 0 only); the next launch loads them in both (nothing is
  written); and a launch where process 0 loads every program while process 1 compiles them all
  (an empty directory) runs to its end. That last one is every launch after the first under
  JAX's rule, and it hung in the evaluation's inspection pass until train.stop_timeout. The
  three launches' losses are the same."""
  first, second, empty = tmp_path / 'p0', tmp_path / 'p1', tmp_path / 'empty'
  cold = _launch(tmp_path, [first, second], 'cold')
  stored = _entries(first), _entries(second)
  assert stored[0] and len(stored[0]) == len(stored[1]), stored
  warm = _launch(tmp_path, [first, second], 'warm')
  assert (_entries(first), _entries(second)) == stored    # read, not compiled
  mixed = _launch(tmp_path, [first, empty], 'mixed', bound=150)
  # process 1 compiled every program (the keys name the directory: JAX keys XLA's own caches in it)
  assert _programs(empty) == _programs(second), (_entries(empty), stored[1])
  assert cold == warm == mixed and sorted(cold) == list(range(1, 21)), (cold, warm, mixed)
