"""Logical axis names -> mesh axes, by one table of rules per preset.

Every parameter carries `logical_axes` metadata (layers.param); key activations are constrained
with `constrain(x, axes)`. Rules map each logical name to a mesh axis (or a tuple of them, or
None: replicated). With no rules active (`use_rules`), `constrain` does nothing, so the model runs
unchanged on one device.
"""

import contextlib
import contextvars
import math

import jax
from jax.sharding import PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'tensor', 'expert')

# Logical name -> mesh axes. 'layers' is the scan axis of stacked blocks (never sharded).
RULES = {
    'data_parallel': {
        'batch': ('data', 'fsdp', 'expert'),
    },
    'fsdp': {
        'batch': ('data', 'fsdp', 'expert'),
        'embed': 'fsdp',
        'vocab': None,
    },
    'fsdp_tensor': {
        'batch': ('data', 'fsdp', 'expert'),
        'embed': 'fsdp',
        'vocab': 'tensor',
        'heads': 'tensor',
        'kv_heads': 'tensor',
        'mlp': 'tensor',
        'expert_mlp': 'tensor',
        'gate_out': 'tensor',
        'act_heads': 'tensor',
    },
    'fsdp_expert': {
        'batch': ('data', 'fsdp', 'expert'),
        'embed': 'fsdp',
        'expert': 'expert',
    },
}

_RULES = contextvars.ContextVar('sharding_rules', default=None)


@contextlib.contextmanager
def use_rules(rules: dict | None):
  token = _RULES.set(rules)
  try:
    yield
  finally:
    _RULES.reset(token)


def get_rules(name: str) -> dict:
  if name not in RULES:
    raise ValueError(f'config.mesh.rules={name!r} is not one of {", ".join(RULES)}.')
  return RULES[name]


def logical_to_spec(axes, rules: dict) -> P:
  """PartitionSpec for logical `axes`; a mesh axis is used at most once per spec."""
  used, spec = set(), []
  for name in axes:
    target = rules.get(name)
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    targets = tuple(t for t in targets if t not in used)
    used.update(targets)
    spec.append(targets[0] if len(targets) == 1 else (targets or None))
  return P(*spec)


def constrain(x: jax.Array, axes) -> jax.Array:
  """with_sharding_constraint by logical names, when rules and a mesh are active."""
  rules = _RULES.get()
  if rules is None or jax.sharding.get_abstract_mesh().empty:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, rules))


def build_mesh(mesh_cfg, devices=None) -> jax.sharding.Mesh:
  """Mesh over (data, fsdp, tensor, expert); one size may be -1 (all remaining devices)."""
  devices = jax.devices() if devices is None else devices
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f'config.mesh: at most one of {MESH_AXES} may be -1, got {sizes}.')
  known = 1
  for s in sizes:
    if s != -1:
      if s < 1:
        raise ValueError(f'config.mesh sizes must be >= 1 or -1, got {dict(zip(MESH_AXES, sizes))}.')
      known *= s
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f'config.mesh {dict(zip(MESH_AXES, sizes))}: {len(devices)} devices are '
                       f'not divisible by the fixed axes product {known}.')
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f'config.mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} '
                     f'devices, but {len(devices)} are available; set one axis to -1 to use '
                     'all of them.')
  return jax.make_mesh(tuple(sizes), MESH_AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 4)


def param_specs(abstract_state, rules: dict):
  """PartitionSpecs for a model state (nnx.State of Variables carrying `logical_axes`).

  Stacked block parameters have one more dimension than their logical axes: the leading
  'layers' axis, which is never sharded.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  def spec(v):
    axes = tuple(v.get_metadata().get('logical_axes', ()))
    axes = ('layers',) * (v.value.ndim - len(axes)) + axes
    return logical_to_spec(axes, rules)

  return jax.tree.map(spec, abstract_state, is_leaf=lambda v: isinstance(v, nnx.Variable))
