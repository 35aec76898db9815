"""Training: the loss, AdamW, the jit-compiled steps (explicit shardings, donation).

A batch's path: main.py -> loop.run -> data.train_iter (numpy, per process) -> Setup.global_batch
(a global array sharded over the data-parallel mesh axes; prefetch.py does this ahead of the
step, in a thread) -> train_step -> loss_fn ->
Transformer.__call__. The loop itself (logging, checkpoints, signals) is in loop.py, evaluation
in evaluate.py.

With data.document_mask every step (train, eval, inspect) numbers the documents of each window
from the BOS tokens of its inputs (model.document_ids) and the attention stays inside them;
`document_bos` is the tokenizer's BOS id, or None (no masking: the default).
"""

import functools
import types

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from gated_attention.config import schema
from gated_attention.errors import ConfigError
from gated_attention.model import attention_kernels
from gated_attention.model import transformer as model_lib
from gated_attention.runs import factory as factory_lib
from gated_attention.runs.factory import segment_ids

NO_DECAY = ('scale', 'bias')  # norms' scales and biases are not weight-decayed

def learning_rate_schedule(tc) -> optax.Schedule:
  """Linear warm-up to the peak, then cosine decay to the minimum at the last step."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=tc.learning_rate, warmup_steps=tc.warmup_steps,
      decay_steps=max(tc.steps, tc.warmup_steps + 1), end_value=tc.min_learning_rate)


@functools.lru_cache(maxsize=16)
def _compiled_schedule(peak: float, warmup: int, steps: int, end: float):
  tc = types.SimpleNamespace(learning_rate=peak, warmup_steps=warmup, steps=steps,
                             min_learning_rate=end)
  return jax.jit(learning_rate_schedule(tc))


def learning_rate_at(tc, step: int) -> float:
  """The schedule's value at `step` (what the optimizer used at step + 1), for the logs: one
  compiled program per schedule and process (the schedule's eager jnp ops compile about ten
  small programs in every process: ~0.4 s per run, or their cache loads). Equal to
  `learning_rate_schedule(tc)(step)` to float32 rounding (the eager ops round between
  operations, a compiled program as the optimizer's step does; tests/test_train.py)."""
  schedule = _compiled_schedule(float(tc.learning_rate), int(tc.warmup_steps), int(tc.steps),
                                float(tc.min_learning_rate))
  return float(schedule(step))


def make_optimizer(tc) -> optax.GradientTransformation:
  def decay_mask(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], 'key', None) not in NO_DECAY, params)
  return optax.chain(
      optax.clip_by_global_norm(tc.grad_clip) if tc.grad_clip > 0 else optax.identity(),
      optax.adamw(learning_rate_schedule(tc), b1=tc.b1, b2=tc.b2, eps=tc.eps,
                  weight_decay=tc.weight_decay, mask=decay_mask))


def _token_losses(h_BxTxD, kernel_DxV, targets_BxT, mask_BxT):
  """Summed cross-entropy and summed squared log-partition (z-loss) of some tokens."""
  logits_BxTxV = model_lib.Transformer.logits(h_BxTxD, kernel_DxV)
  lse_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  target_logit = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], -1)[..., 0]
  return (jnp.sum((lse_BxT - target_logit) * mask_BxT),
          jnp.sum(jnp.square(lse_BxT) * mask_BxT))


def _chunked_token_losses(h_BxTxD, kernel_DxV, targets_BxT, mask_BxT, chunk: int):
  """_token_losses over sequence chunks, each rematerialised in the backward pass, so only one
  chunk's [B, chunk, V] float32 logits are alive at a time (they dominate memory at V=151,936)."""
  B, T = h_BxTxD.shape[:2]
  split = lambda x: jnp.moveaxis(x.reshape(B, T // chunk, chunk, *x.shape[2:]), 1, 0)  # noqa: E731
  step = jax.checkpoint(_token_losses)

  def body(carry, xs):
    h, t, m = xs
    return jax.tree.map(jnp.add, carry, step(h, kernel_DxV, t, m)), None
  zero = jnp.zeros((), jnp.float32)
  (ce_sum, z_sum), _ = jax.lax.scan(
      body, (zero, zero), (split(h_BxTxD), split(targets_BxT), split(mask_BxT)))
  return ce_sum, z_sum


def loss_fn(params, graphdef, batch, tc, pooled=None, document_bos=None):
  """Mean token cross-entropy plus the optional logits z-loss and the FFNs' auxiliary losses.

  Returns (total, (metrics, pooled_stats)): pooled_stats are what gradient accumulation gathers
  over all micro-batches before the real pass (model.py, the FFN interface), or None."""
  model = nnx.merge(graphdef, params)
  h_BxTxD, aux = model(batch['inputs'], pooled=pooled, return_hidden=True,
                       segment_ids_BxT=segment_ids(batch, document_bos))
  args = (h_BxTxD, model.head_kernel(), batch['targets'], batch['loss_mask'])
  chunk = tc.loss_chunk_size
  if chunk and chunk < h_BxTxD.shape[1]:
    ce_sum, z_sum = _chunked_token_losses(*args, chunk)
  else:
    ce_sum, z_sum = _token_losses(*args)
  tokens = jnp.maximum(jnp.sum(batch['loss_mask']), 1.0)
  ce, z_loss = ce_sum / tokens, z_sum / tokens
  ffn_loss, ffn_metrics = model.ffn_loss_and_metrics(aux)
  total = ce + tc.z_loss * z_loss + ffn_loss
  metrics = {'loss': ce, 'z_loss': z_loss, **ffn_metrics, 'total_loss': total}
  return total, (metrics, model.ffn_pooled_stats(aux))


def _microbatches(batch, n):
  return jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)


def _accumulated_grads(grad_fn, params, micro, pooled):
  """Mean gradients and metrics over micro-batches (scanned, summed in float32)."""
  def accumulate(carry, mb):
    (_, (m, _)), g = grad_fn(params, mb, pooled)
    return jax.tree.map(jnp.add, carry, (g, m)), None
  shapes = jax.eval_shape(lambda: grad_fn(params, jax.tree.map(lambda x: x[0], micro), pooled))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), (shapes[1], shapes[0][1][0]))
  (grads, metrics), _ = jax.lax.scan(accumulate, zeros, micro)
  n = jax.tree.leaves(micro)[0].shape[0]
  return jax.tree.map(lambda x: x / n, (grads, metrics))


def train_step(params, opt_state, batch, lr_scale: float, *, graphdef, tc, pools_stats,
               optimizer, document_bos=None):
  """One optimizer step over `tc.grad_accum` micro-batches, its updates scaled by `lr_scale`
  (a static float: 1 unless a rollback lowered the learning rate, and then one recompile).
  A step whose loss, gradients or updates are not finite changes nothing: parameters and
  optimizer state come back as they went in, and metrics['finite'] is False (the loop counts
  it; stability.py)."""
  n = tc.grad_accum
  grad_fn = jax.value_and_grad(
      lambda p, b, pooled=None: loss_fn(p, graphdef, b, tc, pooled, document_bos), has_aux=True)
  if n == 1:
    (_, (metrics, _)), grads = grad_fn(params, batch)
  else:
    micro = _microbatches(batch, n)
    pooled = None
    if pools_stats:
      # Statistics that must cover the whole global batch (the MoE's global load-balancing
      # loss): one forward pass over all micro-batches gathers them first (one extra forward).
      def stats_of(_, mb):
        return None, loss_fn(params, graphdef, mb, tc, None, document_bos)[1][1]
      pooled = jax.lax.stop_gradient(jnp.mean(jax.lax.scan(stats_of, None, micro)[1], 0))
    grads, metrics = _accumulated_grads(grad_fn, params, micro, pooled)
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  if lr_scale != 1.0:
    updates = jax.tree.map(lambda u: u * jnp.asarray(lr_scale, u.dtype), updates)
  new_params = optax.apply_updates(params, updates)
  grad_norm, update_norm = optax.tree.norm(grads), optax.tree.norm(updates)
  finite = (jnp.isfinite(metrics['loss']) & jnp.isfinite(grad_norm)
            & jnp.isfinite(update_norm))
  keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
  params = jax.tree.map(keep, new_params, params)
  opt_state = jax.tree.map(keep, new_opt_state, opt_state)
  metrics.update(grad_norm=grad_norm, update_norm=update_norm,
                 param_norm=optax.tree.norm(params), finite=finite)
  return params, opt_state, metrics


def _with_flags(step, params, opt_state, batch, flags_N, lr_scale: float):
  """`step`, its metrics with the stop flags of the N mesh devices (replicated: gathered)."""
  params, opt_state, metrics = step(params, opt_state, batch, lr_scale)
  return params, opt_state, {**metrics, 'stop_flags': flags_N}


def eval_step(params, batch, *, graphdef, tc, document_bos=None):
  """Summed cross-entropy and token count (so batches can be pooled exactly)."""
  _, (m, _) = loss_fn(params, graphdef, batch, tc, document_bos=document_bos)
  tokens = jnp.sum(batch['loss_mask'])
  return {'loss_sum': m['loss'] * tokens, 'tokens': tokens}


def check_train_config(cfg, batch_shards: int, mesh_shape: dict):
  """Train settings that cannot work on this mesh, named (before anything compiles)."""
  tc = cfg.train
  if schema.is_auto(tc.grad_accum):
    raise ConfigError('config.train.grad_accum=\'auto\' is chosen by --mode=train of one run, on '
                      'its devices (training/grad_accum.py); here give a number: '
                      '--config.train.grad_accum=N (--mode=memory or --mode=compile with '
                      '--fit_grad_accum finds one).')
  if tc.batch_size < 1:
    raise ConfigError(f'config.train.batch_size={tc.batch_size} must be at least 1 (sequences '
                      'per step, over all devices).')
  if tc.grad_accum < 1 or tc.batch_size % tc.grad_accum:
    raise ConfigError(f'config.train.batch_size={tc.batch_size} must be divisible by '
                      f'config.train.grad_accum={tc.grad_accum} (>= 1).')
  for name, size in (('batch_size', tc.batch_size),
                     ('batch_size / grad_accum', tc.batch_size // tc.grad_accum)):
    if size % batch_shards:
      fits = [g for g in range(1, tc.batch_size + 1)
              if tc.batch_size % g == 0 and (tc.batch_size // g) % batch_shards == 0]
      fix = (f'--config.train.grad_accum={" or ".join(map(str, fits[:4]))} would divide it'
             if fits else 'no grad_accum divides it: give the data-parallel mesh axes '
             '(mesh.data, mesh.fsdp) sizes that divide it, or (a new run) another batch_size')
      raise ConfigError(f'config.train.{name}={size} must be divisible by the {batch_shards} '
                        f'data-parallel shards of mesh {mesh_shape}: {fix}.')
  m = cfg.model
  attention_kernels.check(m.attention_impl, cfg.data.seq_len, m.attention_block_q,
                          m.attention_block_kv)
  chunk = tc.loss_chunk_size
  if chunk < 0 or (chunk and cfg.data.seq_len % chunk):
    raise ConfigError(f'config.train.loss_chunk_size={chunk} must be 0 (off) or divide '
                      f'config.data.seq_len={cfg.data.seq_len}.')


class Setup(factory_lib.ModelFactory):
  """The model factory (runs/factory.py: typed config, graphdef, parameter and batch shardings)
  plus what training adds: the optimizer and its state's shardings (`abstract_opt`), and the
  jitted `init_fn`, `train_step` and `eval_step` (the factory's `inspect_step` and
  `eval_inspect_step` compile on first use)."""

  def __init__(self, cfg, mesh, cpu_compiler_options=None):
    """`cpu_compiler_options`: XLA options of the steps on a CPU mesh (None:
    CPU_COMPILER_OPTIONS; {}: XLA's defaults, for benchmarks/throughput.py's comparison)."""
    super().__init__(cfg, mesh, cpu_compiler_options)
    self.optimizer = make_optimizer(cfg.train)
    abstract_opt = jax.eval_shape(self.optimizer.init, self.abstract_params)
    self.opt_shardings = optax.tree_map_params(
        self.optimizer, lambda _, sh: sh, abstract_opt, self.param_shardings,
        transform_non_params=lambda _: self.replicated)
    self.abstract_opt = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        abstract_opt, self.opt_shardings)
    check_train_config(cfg, self.batch_shards, dict(mesh.shape))
    self._compile_steps()

  def _compile_steps(self):
    tc, replicated, bos = self.cfg.train, self.replicated, self.document_bos
    self.init_fn = jax.jit(self.with_rules(self._init), out_shardings=(self.param_shardings,
                                                                        self.opt_shardings))
    # The step before jit: (params, opt_state, batch, lr_scale) -> (params, opt_state, metrics);
    # training/seeds.py maps it over a leading seed axis.
    self.train_step_fn = functools.partial(train_step, graphdef=self.graphdef, tc=tc,
                                           pools_stats=self.model_cfg.pools_ffn_stats,
                                           optimizer=self.optimizer, document_bos=bos)
    self.train_step = self.jit(
        self.train_step_fn,
        in_shardings=(self.param_shardings, self.opt_shardings, self.batch_sharding),
        out_shardings=(self.param_shardings, self.opt_shardings, replicated),
        static_argnums=(3,), donate_argnums=(0, 1))
    self.eval_step = self.jit(
        functools.partial(eval_step, graphdef=self.graphdef, tc=tc, document_bos=bos),
        in_shardings=(self.param_shardings, self.batch_sharding), out_shardings=replicated)
    # Multi-process runs: the step that also carries each device's stop flag (its process's
    # signal, 0: none) to every device, so that every process reads the same flags after the
    # same step (training/interrupt.py). Inside the step's own program: a program of its own
    # could run beside the step on a CPU, and two programs' collectives interleaved differently
    # on two processes deadlock them. Compiled only where used.
    self.flags_sharding = NamedSharding(self.mesh, P(tuple(self.mesh.axis_names)))
    self.train_step_with_flags = self.jit(
        functools.partial(_with_flags, self.train_step_fn),
        in_shardings=(self.param_shardings, self.opt_shardings, self.batch_sharding,
                      self.flags_sharding),
        out_shardings=(self.param_shardings, self.opt_shardings, replicated),
        static_argnums=(4,), donate_argnums=(0, 1))

  def _init(self, key):
    params = self.fresh_params(key)
    return params, self.optimizer.init(params)

  def init(self, seed: int):
    with jax.set_mesh(self.mesh):
      return self.init_fn(jax.random.key(seed))

  def init_opt_state(self, params):
    """A fresh optimizer state for `params` (a warm start from other weights)."""
    with jax.set_mesh(self.mesh):
      return jax.jit(self.optimizer.init, out_shardings=self.opt_shardings)(params)
