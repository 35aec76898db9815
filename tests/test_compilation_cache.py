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
