"""Multi-device checks, run in a fresh process with 8 fake CPU devices (tests/test_sharding.py).

  python tests/sharding_worker.py OUT.json CASE [CASE ...]

CASE is `<dense|moe|moegmm|hybrid>:<rules>` (e.g. moe:fsdp_expert; moegmm: the MoE through the
megablox grouped matmuls, in the Pallas interpreter; hybrid: a Qwen3-Next-like MoE hybrid, Gated
DeltaNet and attention layers, a gated shared expert) or `restore`. XLA_FLAGS must be set before
jax is imported, which is why this is a separate process. Every case's results (losses, gradient
errors against the single-device reference, the shardings that parameters, gradients and
optimizer state really have, restored parameters) go to OUT.json; the test asserts on them.
"""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import xla  # noqa: E402  (imports no JAX)
xla.set_session_flags()                 # the tests' -O0 (tests/xla.py), if not set
os.environ['XLA_FLAGS'] = xla.flags(8)  # ... with 8 fake CPU devices

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from gated_attention.config import scales  # noqa: E402
from gated_attention import sharding  # noqa: E402
from gated_attention.training import train

MESHES = {  # rules preset -> mesh sizes on 8 devices
    'data_parallel': dict(data=-1),
    'fsdp': dict(data=2, fsdp=4),
    'fsdp_tensor': dict(data=2, fsdp=2, tensor=2),
    'fsdp_expert': dict(data=1, fsdp=2, expert=4),
}
B, T, V = 8, 16, 128


def config(kind: str, rules: str = 'data_parallel', mesh=None):
  c = scales.get_config('moe_tiny' if kind in ('moe', 'moegmm', 'hybrid') else 'tiny')
  c.variant = 'g1_elementwise'
  c.model.gate.position = 'g1'  # a gate kernel [embed, heads, head_dim] to shard as well
  c.model.update(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                 vocab_size=V)
  if kind in ('moe', 'moegmm', 'hybrid'):
    c.model.moe.update(num_experts=8, top_k=2, expert_ffn_size=32)
  if kind == 'hybrid':   # two periods of [DeltaNet, attention]; 2 key / 4 value heads of 16
    c.model.update(num_layers=4, layer_types=['linear_attention', 'full_attention'] * 2,
                   rope_fraction=0.25, norm_zero_centered=True, scan_layers=True)
    c.model.deltanet.update(num_key_heads=2, num_value_heads=4, key_head_dim=16,
                            value_head_dim=16, chunk_size=8)
    c.model.moe.update(num_shared_experts=1, shared_expert_gate=True, renormalize=True)
  if kind == 'moegmm':  # megablox kernels (Pallas interpreter); references use ragged_dot
    c.model.moe.grouped_matmul = 'megablox_interpret'
  else:
    c.model.ffn_size = 128
  c.data.seq_len, c.train.batch_size = T, B
  c.mesh.update(data=1, fsdp=1, tensor=1, expert=1, rules=rules)
  c.mesh.update(**(mesh or {}))
  return c


def batch():
  rng = np.random.default_rng(0)
  return {'inputs': rng.integers(0, V, (B, T)).astype(np.int32),
          'targets': rng.integers(0, V, (B, T)).astype(np.int32),
          'loss_mask': (rng.random((B, T)) > 0.1).astype(np.float32)}


def grad_fn(setup):
  def f(params, b):
    with sharding.use_rules(setup.rules):
      return jax.value_and_grad(train.loss_fn, has_aux=True)(params, setup.graphdef, b,
                                                             setup.cfg.train)
  return f


def init_params(kind):
  """One set of parameters (numpy), built eagerly on one device without any mesh."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  with jax.default_device(jax.devices()[0]):
    model = model_lib.Transformer(ModelConfig.from_config(config(kind).model),
                                  rngs=nnx.Rngs(params=jax.random.key(0)))
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))


def reference(kind, params):
  """Loss and gradients on one device, with no mesh and no sharding rules at all."""
  c = config(kind)
  setup = train.Setup(c, sharding.build_mesh(c.mesh, jax.devices()[:1]))
  f = jax.jit(lambda p, b: jax.value_and_grad(train.loss_fn, has_aux=True)(p, setup.graphdef, b,
                                                                          c.train))
  (loss, (metrics, _)), grads = f(params, batch())
  return float(loss), {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}, grads


def leaf_report(tree):
  """{path: [spec, global shape, shard shape of device 0]} for every array leaf."""
  out = {}
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    key = '/'.join(str(getattr(p, 'key', getattr(p, 'idx', p))) for p in path)
    spec = x.sharding.spec if isinstance(x.sharding, NamedSharding) else None
    out[key] = [str(spec), list(x.shape), list(x.addressable_shards[0].data.shape)]
  return out


def run_case(kind, rules, params, ref):
  c = config(kind, rules, MESHES[rules])
  mesh = sharding.build_mesh(c.mesh)
  setup = train.Setup(c, mesh)
  t0 = time.time()
  with jax.set_mesh(mesh):
    p = jax.device_put(params, setup.param_shardings)
    b = setup.global_batch(batch())
    f = jax.jit(grad_fn(setup), in_shardings=(setup.param_shardings, setup.batch_sharding),
                out_shardings=((NamedSharding(mesh, P()), NamedSharding(mesh, P())),
                               setup.param_shardings))
    (loss, (metrics, _)), grads = f(p, b)
  ref_loss, ref_metrics, ref_grads = ref
  errs = jax.tree.map(lambda g, r: float(np.max(np.abs(np.asarray(g) - np.asarray(r)))
                                         / (np.max(np.abs(np.asarray(r))) + 1e-30)),
                      grads, ref_grads)
  opt_specs = {}
  for path, s in jax.tree_util.tree_leaves_with_path(setup.abstract_opt):
    key = '/'.join(str(getattr(q, 'key', getattr(q, 'idx', getattr(q, 'name', q)))) for q in path)
    opt_specs[key] = str(s.sharding.spec)
  return {
      'mesh': dict(mesh.shape), 'seconds': time.time() - t0,
      'loss': float(loss), 'ref_loss': ref_loss,
      'metrics': {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0},
      'ref_metrics': ref_metrics,
      'max_rel_grad_err': max(jax.tree.leaves(errs)),
      'grad_errs': {'/'.join(str(getattr(q, 'key', q)) for q in path): e
                    for path, e in jax.tree_util.tree_leaves_with_path(errs)},
      'params': leaf_report(p), 'grads': leaf_report(grads), 'opt_specs': opt_specs,
      'batch': leaf_report(b),
  }


def restore_case():
  """Save sharded (8 devices, FSDP) with the project's Checkpointer; restore onto 4 and 1."""
  from gated_attention import input_pipeline  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  out = {}
  c8 = config('moe', 'fsdp_expert', dict(data=1, fsdp=2, expert=4))
  s8 = train.Setup(c8, sharding.build_mesh(c8.mesh))
  params = jax.device_put(init_params('moe'), s8.param_shardings)
  opt = s8.optimizer.init(params)  # eagerly: the moments follow the parameters' shardings
  opt = jax.tree.map(lambda x: x + (0.5 if np.issubdtype(x.dtype, np.floating) else 3), opt)
  data = input_pipeline.build_data(c8.data, global_batch_size=B, seed=0)
  workdir = tempfile.mkdtemp()
  ck = ckpt_lib.Checkpointer(workdir, keep=2)
  ck.save(1, {'params': params, 'opt_state': opt}, data.train_iter)
  ck.close()
  expected = jax.tree.map(np.asarray, {'params': params, 'opt_state': opt})
  out['saved'] = leaf_report(params)
  for n, mesh_sizes, rules in ((4, dict(data=1, fsdp=4), 'fsdp'),
                               (1, dict(data=1), 'data_parallel')):
    c = config('moe', rules, mesh_sizes)
    s = train.Setup(c, sharding.build_mesh(c.mesh, jax.devices()[:n]))
    ck = ckpt_lib.Checkpointer(workdir, read_only=True)
    data = input_pipeline.build_data(c.data, global_batch_size=B, seed=0)
    got = ck.restore_step(ck.latest_step(), {'params': s.abstract_params,
                                             'opt_state': s.abstract_opt}, data.train_iter).state
    ck.close()
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), b)), got, expected)
    out[str(n)] = {
        'equal': all(jax.tree.leaves(same)),
        'devices': sorted({d.id for x in jax.tree.leaves(got) for d in x.sharding.device_set}),
        'shardings_match': all(jax.tree.leaves(jax.tree.map(
            lambda x, a: x.sharding.is_equivalent_to(a.sharding, x.ndim), got,
            {'params': s.abstract_params, 'opt_state': s.abstract_opt}))),
        'params': leaf_report(got['params']),
    }
  return out


def main():
  out_path, cases = sys.argv[1], sys.argv[2:]
  assert jax.device_count() == 8, jax.devices()
  results, refs, params = {}, {}, {}
  for case in cases:
    t0 = time.time()
    if case == 'restore':
      results[case] = restore_case()
    else:
      kind, rules = case.split(':')
      ref_kind = 'moe' if kind == 'moegmm' else kind   # hybrid: its own reference
      if ref_kind not in refs:
        params[ref_kind] = init_params(ref_kind)
        refs[ref_kind] = reference(ref_kind, params[ref_kind])
      results[case] = run_case(kind, rules, params[ref_kind], refs[ref_kind])
    results[case]['wall_seconds'] = time.time() - t0
    print(f'{case}: {time.time() - t0:.1f}s', file=sys.stderr, flush=True)
  with open(out_path, 'w') as f:
    json.dump(results, f, indent=1)


if __name__ == '__main__':
  main()
