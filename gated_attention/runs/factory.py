"""The model factory: one config's model on one mesh, without anything of training.

    factory = ModelFactory(config, mesh)              # typed config, graphdef, shardings
    step, params = factory.restore(workdir)           # verified, on the factory's shardings
    params = factory.init_params(seed)                # or a fresh model
    model = factory.merge(params)                     # an nnx Transformer holding them
    stats = factory.inspect_step(params, factory.global_batch(local_batch))

Everything that opens a model goes through it: the analysis, sampling, long-context evaluation,
export and import (runs/), memory and ahead-of-time estimates (compile/), the notebook. The
training setup (training/train.py `Setup`) is a ModelFactory plus the optimizer, its state's
shardings and the jitted training steps; so opening a run for evaluation builds no optimizer,
checks no training batch size and compiles no training step.

What it holds: `model_cfg` (the typed ModelConfig, built at this boundary for the mesh's
platform), `graphdef`, `abstract_params` (ShapeDtypeStructs carrying `param_shardings`), the
`batch_sharding` over the data-parallel mesh axes and its `batch_shards`, the sharding `rules`,
and `document_bos` (the BOS id that starts each document when data.document_mask is on, else
None). The evaluation forward passes (`inspect_step`, `eval_inspect_step`) are jitted with
explicit shardings on first use.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from gated_attention import input_pipeline
from gated_attention import sharding
from gated_attention.model import transformer as model_lib
from gated_attention.errors import CheckpointError
from gated_attention.model.config import ModelConfig
from gated_attention.runs import checkpoint

# XLA:CPU options of the compiled train / eval / inspect steps on CPU meshes (none elsewhere).
# YNNPACK computes the matmuls only, XLA's own loop fusions the elementwise code: YNNPACK's
# elementwise fusions take every broadcast operand (a norm's scale, a row's rsqrt) materialised
# at the activations' shape, one extra pass over [B, T, D] per operand. Training step, float32,
# this option against XLA's default, both compiled in one process and interleaved
# (benchmarks/throughput.py --compare_cpu_options): 0.92-0.97x the step time at issue 14's shape
# a, 0.96x at shape b, the same numbers up to float32 rounding.
CPU_COMPILER_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': 'LIBRARY_FUSION_TYPE_DOT'}


def mesh_platform(mesh) -> str:
  """The platform of a mesh's devices ('cpu', 'gpu', 'tpu'); an AbstractMesh (memory estimates)
  has no devices: JAX's default backend."""
  if isinstance(mesh, jax.sharding.Mesh):
    return mesh.devices.flat[0].platform
  return jax.default_backend()


def document_bos(cfg) -> int | None:
  """The BOS id that starts each document when data.document_mask is on (the data's
  tokenizer's), else None."""
  if not cfg.data.get('document_mask', False):
    return None
  return int(input_pipeline.data_tokenizer(cfg.data).bos_id)


def segment_ids(batch, bos: int | None):
  """The document ids [B, T] of the batch's inputs (document masking), or None."""
  if bos is None:
    return None
  return model_lib.document_ids(batch['inputs'], bos)


def inspect_step(params, batch, *, graphdef, document_bos=None):
  """Per-layer analysis statistics (F-Attn, M-Act, gate scores, sparsity) on one batch."""
  return model_lib.inspect(nnx.merge(graphdef, params), batch['inputs'],
                           segment_ids(batch, document_bos))[1]


def eval_inspect_step(params, batch, *, graphdef, document_bos=None):
  """Summed cross-entropy and token count of the batch, and inspect_step's statistics, from one
  forward pass (the inspect path's explicit attention), for the analysis, which inspects every
  batch."""
  logits_BxTxV, stats = model_lib.inspect(nnx.merge(graphdef, params), batch['inputs'],
                                          segment_ids(batch, document_bos))
  lse_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  target = jnp.take_along_axis(logits_BxTxV, batch['targets'][..., None], -1)[..., 0]
  mask_BxT = batch['loss_mask']
  return {'loss_sum': jnp.sum((lse_BxT - target) * mask_BxT), 'tokens': jnp.sum(mask_BxT)}, stats


class ModelFactory:
  """The model of `cfg` on `mesh`: its typed config, structure and shardings, a verified
  restore, and the evaluation forward passes."""

  def __init__(self, cfg, mesh, cpu_compiler_options=None):
    """`cpu_compiler_options`: XLA options of the compiled steps on a CPU mesh (None:
    CPU_COMPILER_OPTIONS; {}: XLA's defaults, for benchmarks/throughput.py's comparison)."""
    self.cfg, self.mesh = cfg, mesh
    self.cpu_compiler_options = (CPU_COMPILER_OPTIONS if cpu_compiler_options is None
                                 else cpu_compiler_options)
    self.rules = sharding.get_rules(cfg.mesh.rules)
    self.model_cfg = ModelConfig.from_config(cfg.model, platform=mesh_platform(mesh))
    self.document_bos = document_bos(cfg)
    self.graphdef, abstract_state = nnx.split(model_lib.abstract_model(self.model_cfg))
    specs = nnx.to_pure_dict(sharding.param_specs(abstract_state, self.rules, mesh.shape))
    self.param_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    self.abstract_params = jax.tree.map(
        lambda v, sh: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh),
        nnx.to_pure_dict(abstract_state), self.param_shardings)
    self.replicated = NamedSharding(mesh, P())
    batch_axes = sharding.logical_to_spec(('batch',), self.rules)
    self.batch_sharding = NamedSharding(mesh, P(batch_axes[0], None))
    self.batch_shards = sharding.spec_size(self.batch_sharding.spec, mesh.shape)

  @staticmethod
  def same_model(cfg_a, cfg_b) -> bool:
    """Whether two configs make the same factory (model, mesh and its rules, and the data
    settings that reach the model: the document mask's BOS): one built for either serves
    the other."""
    return all(cfg_a[k].to_dict() == cfg_b[k].to_dict() for k in ('model', 'mesh', 'data'))

  # --- compiling -----------------------------------------------------------------------------

  def with_rules(self, f):
    """`f` traced under this factory's logical sharding rules."""
    @functools.wraps(f)
    def wrapped(*args, **kwargs):
      with sharding.use_rules(self.rules):
        return f(*args, **kwargs)
    return wrapped

  def jit(self, f, **kwargs):
    """jax.jit of `f` under the sharding rules, with the CPU compiler options on a CPU mesh."""
    options = self.cpu_compiler_options if self.model_cfg.platform == 'cpu' else None
    return jax.jit(self.with_rules(f), compiler_options=options, **kwargs)

  def _eval_jit(self, f):
    return self.jit(functools.partial(f, graphdef=self.graphdef, document_bos=self.document_bos),
                    in_shardings=(self.param_shardings, self.batch_sharding),
                    out_shardings=self.replicated)

  @functools.cached_property
  def inspect_step(self):
    """jit of `inspect_step`: (params, global batch) -> the per-layer statistics."""
    return self._eval_jit(inspect_step)

  @functools.cached_property
  def eval_inspect_step(self):
    """jit of `eval_inspect_step`: (params, global batch) -> (loss sums, statistics)."""
    return self._eval_jit(eval_inspect_step)

  # --- parameters ----------------------------------------------------------------------------

  def fresh_params(self, key) -> dict:
    """A new model's parameters from `key` (a pure dict; traced inside the callers' jit)."""
    return nnx.to_pure_dict(nnx.state(model_lib.Transformer(self.model_cfg, rngs=nnx.Rngs(key))))

  def init_params(self, seed: int) -> dict:
    """Freshly initialised parameters (a pure dict on `param_shardings`)."""
    with jax.set_mesh(self.mesh):
      return jax.jit(self.with_rules(self.fresh_params), out_shardings=self.param_shardings)(
          jax.random.key(seed))

  def restore(self, workdir: str, step: int | None = None, *, warn=print) -> tuple[int, dict]:
    """(step, parameters) of checkpoint `step` of the run in `workdir`, verified like
    training's restore (finite values, the saved checksums), read-only: nothing in the run
    directory changes. Without `step`, the newest checkpoint that verifies (a bad newer one is
    skipped with a warning through `warn`)."""
    ckpt = checkpoint.Checkpointer(workdir, read_only=True)
    try:
      if step is None:
        return ckpt.restore_latest_params(self.abstract_params, warn=warn)
      steps = ckpt.all_steps()
      if step not in steps:
        raise CheckpointError(f'{workdir!r} has no checkpoint at step {step}; it has '
                              f'{steps or "none"}.')
      return step, ckpt.restore_params(step, self.abstract_params, warn=warn)
    finally:
      ckpt.close()

  def merge(self, params):
    """An nnx Transformer holding `params`."""
    return nnx.merge(self.graphdef, params)

  def global_batch(self, batch: dict, whole: bool = False) -> dict:
    """Numpy batch -> global jax arrays sharded over the data-parallel axes. `batch`: this
    process's rows, or with `whole` the whole global batch (the same in every process), of which
    each device gets its rows, wherever the mesh puts it."""
    return {k: jax.make_array_from_process_local_data(
        self.batch_sharding, v, v.shape if whole else None) for k, v in batch.items()}
