"""Logical axis names -> mesh axes, by one table of rules per preset.

Every parameter carries `logical_axes` metadata (layers.param); key activations are constrained
with `constrain(x, axes)`. Rules map each logical name to a mesh axis (or a tuple of them, or
None: replicated). With no rules active (`use_rules`), `constrain` does nothing, so the model runs
unchanged on one device.
"""

import contextlib
import contextvars

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
