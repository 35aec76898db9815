"""Data- and expert-parallel dropless MoE dispatch (shard_map), used whenever sharding rules and a
multi-device mesh are active.

Why: the single-device dropless path (moe.py) sorts all N*K (token, expert) assignments of the
call. Under GSPMD that sort is global: every device would gather every token of the global batch
(at the paper's scale, 4M tokens x 2048 channels per step). Here each data-parallel shard sorts only
its own tokens, so the MoE layer scales like the rest of the model.

Layout inside the shard_map (mesh axes from the rules: B = the 'batch' axes, X = the 'expert'
axes, T = the 'expert_mlp' axes):
  tokens      [N/|B|, D]  local tokens of this data shard
  kernels     [E/|X|, D, F/|T|]  this device's experts (the 'embed' dimension is all-gathered on
              entry, as FSDP does for every weight)
Expert parallelism (X non-empty; the presets put X inside B, i.e. the expert axis also splits
tokens): the tokens of the devices along X are all-gathered; each device sorts the assignments
that go to *its* experts first (the others form a tail that `ragged_dot` leaves at zero), runs
its experts as grouped matmuls (grouped_matmul.sorted_swiglu, the single-device path's dispatch
too), and the partial outputs are summed and
scattered back to the tokens' owners with one reduce-scatter over X (`psum_scatter`). Tensor
parallelism over F (T non-empty) adds a psum over T. Nothing is dropped, every shape is static,
and the result equals the single-device computation (up to float summation order).

The token all-gather over X moves as many bytes as an all-to-all of the K assignments when
K ~ |X| (the paper: K=8), and unlike a capacity-bounded all-to-all it needs no capacity factor to
stay dropless. The price is memory: the sorted assignment buffers ([rows, D] and [rows, F]) have
|X| times the local rows (a static shape must hold the worst case, every gathered assignment
going to this device's experts); `ragged_dot` leaves the rows past the groups at zero, and its
grouped kernels (TPU megablox, GPU) skip them, so compute stays ~ the local share. --mode=memory
charges these buffers; with large micro-batches the plain 'fsdp' preset (all experts gathered
per layer, tokens local) can need less memory than 'fsdp_expert'.
The capacity dispatch (moe.dispatch='capacity') is not routed here: it keeps its global k-major
priority and is partitioned by GSPMD (correct, but it gathers the assignment ranking).
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from gated_attention.model import grouped_matmul
from gated_attention import sharding


def _tuple(entry) -> tuple:
  return (entry,) if isinstance(entry, str) else tuple(entry or ())


def active() -> bool:
  """Whether sharding rules and a mesh of more than one device are in effect."""
  if sharding.current_rules() is None:
    return False
  mesh = jax.sharding.get_abstract_mesh()
  return not mesh.empty and mesh.size > 1


def dropless(x_NxD, weights_NxK, experts_NxK, wi_gate_ExDxF, wi_up_ExDxF, wo_ExFxD, *,
             num_experts: int, dtype, impl: str = 'ragged_dot') -> jax.Array:
  """sum_k w_k SwiGLU_{e_k}(x) for every token, sharded as described in the module doc."""
  rules = sharding.current_rules()
  mesh = jax.sharding.get_abstract_mesh()
  shape = dict(mesh.shape)
  N, D = x_NxD.shape
  E, F = num_experts, wi_gate_ExDxF.shape[-1]

  batch = _tuple(sharding.logical_to_spec(('batch',), rules, (N,), shape)[0])
  wi_spec = sharding.logical_to_spec(('expert', None, 'expert_mlp'), rules, (E, D, F), shape)
  expert_axes, f_axes = _tuple(wi_spec[0]), _tuple(wi_spec[2])
  wo_spec = P(wi_spec[0], wi_spec[2], None)
  gather_axes = tuple(a for a in expert_axes if a in batch)   # tokens split AND experts split
  replicated_expert_axes = tuple(a for a in expert_axes if a not in batch)
  tok = P(batch or None, None)
  e_local = E // sharding.spec_size(P(wi_spec[0]), shape)

  def body(x, w, e, wg, wu, wo):
    if gather_axes:
      x, w, e = (jax.lax.all_gather(a, gather_axes, axis=0, tiled=True) for a in (x, w, e))
    first = jax.lax.axis_index(expert_axes) * e_local if expert_axes else 0
    y = grouped_matmul.sorted_swiglu(x, w, e, wg, wu, wo, impl=impl, first_expert=first,
                                     all_experts=not expert_axes)
    if gather_axes:
      y = jax.lax.psum_scatter(y, gather_axes, scatter_dimension=0, tiled=True)
    if replicated_expert_axes or f_axes:
      y = jax.lax.psum(y, replicated_expert_axes + f_axes)
    return y

  # Pallas (megablox) calls cannot declare how their outputs vary over the manual mesh axes, so
  # the varying-manual-axes check is off for them (tests/test_sharding.py compares the sharded
  # loss and gradients with one device for every preset, for both impls).
  fn = jax.shard_map(body, mesh=mesh, in_specs=(tok, tok, tok, wi_spec, wi_spec, wo_spec),
                     out_specs=tok, check_vma=impl == 'ragged_dot')
  return fn(x_NxD, weights_NxK, experts_NxK, wi_gate_ExDxF.astype(dtype),
            wi_up_ExDxF.astype(dtype), wo_ExFxD.astype(dtype))
