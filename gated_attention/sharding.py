"""Device meshes, and logical axis names -> mesh axes by one table of rules per preset.

The mesh has four axes, outermost first: ('data', 'fsdp', 'tensor', 'expert'), sized by
config.mesh.{data,fsdp,tensor,expert} (one of them may be -1: all remaining devices). With
config.mesh.dcn_data > 1 the data axis is split into dcn_data outer groups across slices (TPU
multi-slice) or hosts (process groups), the slow network (DCN); the other axes stay inside a
group, on the fast one (ICI / NVLink). See `device_array`.

Every parameter carries `logical_axes` metadata (layers.param); key activations are constrained
with `constrain(x, axes)`. A preset's rules map each logical name to a mesh axis, a tuple of
them, or None (replicated); names a preset does not list are replicated. The table (`RULES`):

  logical name    data_parallel    fsdp          fsdp_tensor    fsdp_expert
  batch           data,fsdp,expert data,fsdp,exp data,fsdp,exp  data,fsdp,expert
  embed           -                fsdp          fsdp           fsdp,expert
  vocab           -                -             tensor         -
  heads/kv_heads  -                -             tensor         -
  mlp/expert_mlp  -                -             tensor         -
  gate_out        -                -             tensor         -
  act_heads       -                -             tensor         -
  expert          -                -             -              expert
  layers/seq/head_dim: never sharded.

'batch' is the leading dimension of activations and batches: every preset splits it over all
data-parallel axes (the expert axis doubles as a data axis outside the MoE layers). A mesh axis is
used at most once per array (first come), so an activation [batch, seq, embed] under 'fsdp' is
split over batch only, and an expert kernel [expert, embed, expert_mlp] under 'fsdp_expert' puts
'expert' on the expert dimension and 'fsdp' on embed. A mesh axis that does not divide a
dimension is dropped for that dimension (it stays replicated there), so small models run on any
mesh.

Where GSPMD alone would gather whole activations, the model steps in: the embedding lookup reads a
table made whole along 'embed' (layers.Embed), MoE routing runs per data shard
(`per_batch_shard`: GSPMD gathers `top_k`'s input whole) and the dropless MoE dispatch is a
shard_map with per-shard sorting and expert parallelism over the 'expert' axes (moe_parallel.py).
"""

import contextlib
import contextvars
import logging
import math

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from gated_attention.errors import ConfigError

MESH_AXES = ('data', 'fsdp', 'tensor', 'expert')
BATCH = ('data', 'fsdp', 'expert')

RULES = {
    'data_parallel': {
        'batch': BATCH,
    },
    'fsdp': {
        'batch': BATCH,
        'embed': 'fsdp',
    },
    'fsdp_tensor': {
        'batch': BATCH,
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
        'batch': BATCH,
        'embed': ('fsdp', 'expert'),
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


def current_rules() -> dict | None:
  return _RULES.get()


def get_rules(name: str) -> dict:
  if name not in RULES:
    raise ConfigError(f'config.mesh.rules={name!r} is not one of {", ".join(RULES)}.')
  return RULES[name]


def mesh_axes_of(name, rules: dict) -> tuple[str, ...]:
  """The mesh axes a logical name maps to (a tuple, possibly empty)."""
  target = rules.get(name) if name is not None else None
  return (target,) if isinstance(target, str) else tuple(target or ())


def logical_to_spec(axes, rules: dict, shape=None, mesh_shape=None) -> P:
  """PartitionSpec for logical `axes`; a mesh axis is used at most once per spec.

  With `shape` and `mesh_shape` (axis name -> size), mesh axes that do not divide their
  dimension are dropped (from the last one mapped to that dimension backwards).
  """
  used, spec = set(), []
  for i, name in enumerate(axes):
    targets = tuple(t for t in mesh_axes_of(name, rules) if t not in used)
    if shape is not None and mesh_shape is not None:
      targets = tuple(t for t in targets if t in mesh_shape)
      while targets and shape[i] % math.prod(mesh_shape[t] for t in targets):
        targets = targets[:-1]
    used.update(targets)
    spec.append(targets[0] if len(targets) == 1 else (targets or None))
  return P(*spec)


def constrain(x: jax.Array, axes) -> jax.Array:
  """with_sharding_constraint by logical names, when rules and a mesh are active."""
  rules = _RULES.get()
  if rules is None:
    return x
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(
      x, logical_to_spec(axes, rules, x.shape, dict(mesh.shape)))


def spec_size(spec: P, mesh_shape) -> int:
  """Number of shards a PartitionSpec splits an array into on a mesh (axis name -> size)."""
  n = 1
  for entry in spec:
    for a in ((entry,) if isinstance(entry, str) else tuple(entry or ())):
      n *= mesh_shape[a]
  return n


# ----------------------------------------------------------------------------------------------
# Meshes.


def mesh_shape(mesh_cfg, num_devices: int) -> dict:
  """{axis: size} for `num_devices` devices; resolves the one -1 and checks the product."""
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  named = dict(zip(MESH_AXES, sizes))
  if sizes.count(-1) > 1:
    raise ConfigError(f'config.mesh: at most one of {MESH_AXES} may be -1, got {named}.')
  known = 1
  for s in sizes:
    if s != -1:
      if s < 1:
        raise ConfigError(f'config.mesh sizes must be >= 1 or -1, got {named}.')
      known *= s
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f'config.mesh {named}: {num_devices} devices are not divisible by the '
                       f'fixed axes product {known}.')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(f'config.mesh {named} needs {math.prod(sizes)} devices, but '
                     f'{num_devices} are available; set one axis to -1 to use all of them.')
  dcn = int(mesh_cfg.get('dcn_data', 1) or 1)
  if dcn < 1 or sizes[0] % dcn:
    raise ConfigError(f'config.mesh.dcn_data={dcn} must be >= 1 and divide the data axis '
                     f'(mesh.data resolves to {sizes[0]}); the data axis is split into '
                     'dcn_data groups across slices or hosts.')
  return dict(zip(MESH_AXES, sizes))


def _granules(devices, dcn: int):
  """Devices grouped by slice (TPU multi-slice) or else by process, in sorted key order."""
  slices = {getattr(d, 'slice_index', None) for d in devices}
  attr = 'slice_index' if len(slices) > 1 and None not in slices else 'process_index'
  groups = {}
  for d in devices:
    groups.setdefault(getattr(d, attr, 0), []).append(d)
  return attr, [groups[k] for k in sorted(groups)]


def _ici_mesh(shape, devices):
  """One group's devices laid out for `shape`: topology-aware on TPU (as jax.make_mesh, splitting
  physical axes only if it must), in id order elsewhere."""
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  for split in (False, True):
    try:
      return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=split)
    except (ValueError, NotImplementedError, AssertionError, KeyError, AttributeError):
      continue
  return np.asarray(devices, dtype=object).reshape(shape)


def device_array(mesh_cfg, devices) -> np.ndarray:
  """The devices as an array of shape (data, fsdp, tensor, expert).

  dcn_data == 1: `create_device_mesh` (topology-aware on TPU), as jax.make_mesh does.
  dcn_data > 1: the data axis is split into dcn_data outer groups; every other axis stays inside
  a group. When the devices span exactly dcn_data slices (TPU multi-slice) or, without slices,
  exactly dcn_data processes, this is jax's `create_hybrid_device_mesh`. Otherwise the devices,
  sorted by (slice, process, id), are cut into dcn_data contiguous groups: a group is whole
  processes when dcn_data divides the process count (e.g. 2 groups of 4 GPU hosts), or a part
  of one process when the process count divides dcn_data (e.g. one CPU process in a test).
  """
  devices = list(devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  sizes = tuple(shape[a] for a in MESH_AXES)
  dcn = int(mesh_cfg.get('dcn_data', 1) or 1)
  attr, granules = _granules(devices, dcn)
  if dcn == 1:
    if len(granules) > 1 and attr == 'slice_index':
      logging.warning('The %d devices span %d slices but config.mesh.dcn_data=1: the data axis '
                      'should cross slices; set --config.mesh.dcn_data=%d.', len(devices),
                      len(granules), len(granules))
    return _ici_mesh(sizes, devices)
  ici = (sizes[0] // dcn,) + sizes[1:]
  dcn_shape = (dcn, 1, 1, 1)
  if len(granules) == dcn and len({len(g) for g in granules}) == 1:
    from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
    for split in (False, True):
      try:
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn_shape, devices, process_is_granule=attr == 'process_index',
            allow_split_physical_axes=split)
      except (ValueError, NotImplementedError, AssertionError) as e:
        error = e
    raise error
  if attr == 'slice_index':
    raise ConfigError(f'config.mesh.dcn_data={dcn}, but the devices span {len(granules)} slices;'
                     f' set --config.mesh.dcn_data={len(granules)}.')
  n_proc = len(granules)
  if n_proc % dcn and dcn % n_proc:
    raise ConfigError(f'config.mesh.dcn_data={dcn} must divide the process count {n_proc} or be '
                     'a multiple of it (each data-parallel group is whole processes, or a part '
                     'of one).')
  ordered = sorted(devices, key=lambda d: (getattr(d, 'process_index', 0), d.id))
  per_group = len(ordered) // dcn
  groups = [_ici_mesh(ici, ordered[i * per_group:(i + 1) * per_group]) for i in range(dcn)]
  return np.concatenate(groups, axis=0)


def build_mesh(mesh_cfg, devices=None) -> jax.sharding.Mesh:
  """Mesh over (data, fsdp, tensor, expert); one size may be -1 (all remaining devices)."""
  devices = jax.devices() if devices is None else devices
  return jax.sharding.Mesh(device_array(mesh_cfg, devices), MESH_AXES,
                           axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def abstract_mesh(mesh_cfg, num_devices: int) -> jax.sharding.AbstractMesh:
  """A mesh of the configured shape over `num_devices` devices that need not exist."""
  shape = mesh_shape(mesh_cfg, num_devices)
  return jax.sharding.AbstractMesh(tuple(shape[a] for a in MESH_AXES), MESH_AXES,
                                   axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


# ----------------------------------------------------------------------------------------------
# Parameters.


def value_shape(v) -> tuple:
  """The shape of a Variable's value (an array or a ShapeDtypeStruct)."""
  get = getattr(v, 'get_value', None)
  return tuple((get() if get is not None else v.value).shape)



def param_logical_axes(v) -> tuple:
  """A Variable's logical axes, with a leading 'layers' for each stacked (scanned) dimension."""
  axes = tuple(v.get_metadata().get('logical_axes', ()))
  ndim = len(value_shape(v))
  if len(axes) > ndim:
    raise ValueError(f'logical_axes {axes} has more names than the parameter has dims '
                     f'{value_shape(v)}.')
  return ('layers',) * (ndim - len(axes)) + axes


def param_specs(abstract_state, rules: dict, mesh_shape=None):
  """PartitionSpecs for a model state (nnx.State of Variables carrying `logical_axes`).

  Stacked block parameters have one more dimension than their logical axes: the leading
  'layers' axis, which is never sharded. With `mesh_shape` (axis name -> size), mesh axes that
  do not divide a dimension are dropped there.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top
  mesh_shape = dict(mesh_shape) if mesh_shape is not None else None

  def spec(v):
    return logical_to_spec(param_logical_axes(v), rules, value_shape(v), mesh_shape)

  return jax.tree.map(spec, abstract_state, is_leaf=lambda v: isinstance(v, nnx.Variable))


def per_batch_shard(fn, *args, check_vma: bool = True):
  """fn(*args) run separately on each data-parallel shard (shard_map over the 'batch' axes).

  For per-token functions that GSPMD would not split by batch (e.g. `jax.lax.top_k`, which it
  gathers whole), and kernels it cannot partition (Pallas: pass check_vma=False). Every array in
  `args` and in the output has the batch (token) dimension first; non-array args are passed
  through. Without rules or a multi-device mesh: fn(*args).
  """
  rules = _RULES.get()
  mesh = jax.sharding.get_abstract_mesh()
  if rules is None or mesh.empty or mesh.size == 1:
    return fn(*args)
  arrays = [i for i, a in enumerate(args) if isinstance(a, (jax.Array, np.ndarray))]
  n = args[arrays[0]].shape[0]
  batch = logical_to_spec(('batch',), rules, (n,), dict(mesh.shape))[0]
  spec = P(batch)

  def body(*arrs):
    full = list(args)
    for i, a in zip(arrays, arrs):
      full[i] = a
    return fn(*full)

  return jax.shard_map(body, mesh=mesh, in_specs=tuple(spec for _ in arrays),
                       out_specs=spec, check_vma=check_vma)(*(args[i] for i in arrays))
