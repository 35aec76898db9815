"""JAX-side test helpers shared by the test files (tests/reference.py stays numpy-only)."""

import jax
from flax import nnx


def perturb(module, seed, scale=0.1):
  """Adds noise to every parameter (so ones/zeros-initialised ones are generic)."""
  state = nnx.state(module, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  nnx.update(module, jax.tree_util.tree_unflatten(treedef, leaves))


def model_config(model_section):
  """The typed ModelConfig of a config's `model` section (a ConfigDict)."""
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  return ModelConfig.from_config(model_section)
