"""Per-device memory of a training run, for a config and a mesh, without the devices.

  python main.py --config=configs/baseline.py:moe_15a2b --mode=memory \
      --config.memory.num_devices=64 --config.memory.device_memory_gib=95

`report(config)` lays the config's mesh (config.mesh, one axis may be -1) over
config.memory.num_devices devices (0: the devices present) as a `jax.sharding.AbstractMesh`,
builds `train.Setup` on it (the very shardings training uses) and adds up, per device:

  params           float32 parameters, sharded by the rules (exact: shapes x shardings)
  opt_state        AdamW moments, sharded like the parameters (exact)
  grads            float32 gradients, sharded like the parameters; with grad_accum > 1 a second
                   buffer (the scanned accumulator) is counted too
  activations      what the backward pass keeps: the residuals the forward pass saves (measured
                   with jax's `saved_residuals` on `jax.eval_shape`-style tracing of the loss on
                   one device's micro-batch, so it follows config.model.remat exactly), plus, with
                   remat, one layer's full set of intermediates while that layer is recomputed
  fsdp_transient   weights whole along the FSDP axes while one layer runs (forward and
                   backward, in the compute dtype) and that layer's float32 gradient before it is
                   reduce-scattered; 0 when nothing is FSDP-sharded

Activations are reported for the configured remat policy and for 'none' and 'full'. Per-device
activations use the per-device micro-batch (batch_size / grad_accum / data-parallel shards);
tensor-parallel splitting of activations (heads, mlp, vocab under 'fsdp_tensor') is credited
where a residual has such a dimension, and expert parallelism's token all-gather (moe_parallel)
is charged to the MoE residuals. Not counted: XLA's temporaries beyond these, fragmentation, the
compiled program, communication buffers; keep ~10-20% headroom. For a compiler-exact figure on
a TPU topology use --mode=compile.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from gated_attention import sharding
from gated_attention.config import schema
from gated_attention.training import fit
from gated_attention.errors import UserError

GIB = 2 ** 30


def _bytes(x, shape=None) -> int:
  return int(math.prod(x.shape if shape is None else shape)) * jnp.dtype(x.dtype).itemsize


def _sharded_bytes(tree) -> int:
  """Per-device bytes of a tree of ShapeDtypeStructs that carry NamedShardings."""
  return sum(_bytes(x, x.sharding.shard_shape(x.shape)) for x in jax.tree.leaves(tree))


def _entry(n: float) -> dict:
  return {'bytes': int(n), 'gib': round(n / GIB, 3)}


def _saved(config, model_cfg, num_layers: int, remat: str, batch: int) -> list:
  """[(aval, what)] the loss's forward pass saves for the backward, on `batch` sequences
  (the parameters and the batch themselves excluded)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  # JAX has no public API that returns the saved residuals (jax.ad_checkpoint only prints them).
  from jax._src import ad_checkpoint  # pylint: disable=g-import-not-at-top
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.training import train  # pylint: disable=g-import-not-at-top

  if model_cfg.is_hybrid:   # `num_layers` counts stacked units: periods of the layer pattern
    period = model_cfg.layer_period
    model_cfg = dataclasses.replace(model_cfg, num_layers=num_layers * len(period),
                                    layer_types=period * num_layers, remat=remat)
  else:
    model_cfg = dataclasses.replace(model_cfg, num_layers=num_layers, remat=remat)
  graphdef, state = nnx.split(model_lib.abstract_model(model_cfg))
  params = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), nnx.to_pure_dict(state))
  T = config.data.seq_len
  tokens = jax.ShapeDtypeStruct((batch, T), jnp.int32)
  mask = jax.ShapeDtypeStruct((batch, T), jnp.float32)

  def loss(p, inputs, targets, loss_mask):
    b = {'inputs': inputs, 'targets': targets, 'loss_mask': loss_mask}
    return train.loss_fn(p, graphdef, b, config.train)[0]

  saved = ad_checkpoint.saved_residuals(loss, params, tokens, tokens, mask)
  return [(a, w.split(' from ')[0]) for a, w in saved if not w.startswith('from the argument')]


def _residual_bytes(config, model_cfg, num_layers, remat, credit) -> tuple[float, float, list]:
  """(bytes independent of the batch, bytes per sequence, largest rows at 2 sequences), per
  device. Residuals whose shape changes with the batch are activations (credited for tensor and
  expert parallelism); the others are weight copies (e.g. compute-dtype casts), counted sharded
  like the parameters."""
  one = _saved(config, model_cfg, num_layers, remat, 1)
  two = _saved(config, model_cfg, num_layers, remat, 2)
  if len(one) != len(two):
    raise RuntimeError('memory: the traced programs for 1 and 2 sequences differ.')
  fixed = per_seq = 0.0
  rows = []
  for (a1, _), (a2, what) in zip(one, two):
    if tuple(a1.shape) == tuple(a2.shape):
      n = credit(a2.shape, _bytes(a2), activation=False)
      fixed += n
    else:
      n1, n = credit(a1.shape, _bytes(a1)), credit(a2.shape, _bytes(a2))
      per_seq += n - n1
      fixed += 2 * n1 - n
    rows.append((n, tuple(a2.shape), str(a2.dtype), what))
  rows.sort(key=lambda r: -r[0])
  return fixed, per_seq, rows[:5]


class _Activations:
  """Saved residuals and the recompute peak as exact bilinear functions of the per-device
  micro-batch and the layer count (traced at 1 and 2 of each: the layers are a scan). A hybrid's
  scan runs over periods of its layer pattern (transformer.LayerPeriod): it is traced at 1 and 2
  periods, and 'saved_per_layer' and 'recompute_one_layer' are one period's."""

  def __init__(self, config, model_cfg, remat: str, credit):
    self.remat = remat
    L = (model_cfg.num_layers // len(model_cfg.layer_period) if model_cfg.is_hybrid
         else model_cfg.num_layers)
    f1, s1, _ = _residual_bytes(config, model_cfg, 1, remat, credit)
    f2, s2, self.largest = _residual_bytes(config, model_cfg, 2, remat, credit)
    self.fixed = f1 + (L - 1) * (f2 - f1)
    self.per_seq = s1 + (L - 1) * (s2 - s1)
    self.layer_fixed, self.layer_per_seq = f2 - f1, s2 - s1
    self.re_fixed = self.re_per_seq = 0.0
    if remat != 'none':  # the layer being differentiated holds all its intermediates
      g1, t1, _ = _residual_bytes(config, model_cfg, 1, 'none', credit)
      g2, t2, _ = _residual_bytes(config, model_cfg, 2, 'none', credit)
      self.re_fixed, self.re_per_seq = g2 - g1, t2 - t1

  def peak(self, batch: int) -> float:
    return self.fixed + self.re_fixed + batch * (self.per_seq + self.re_per_seq)

  def summary(self, batch: int) -> dict:
    return {
        'remat': self.remat,
        'saved': _entry(self.fixed + batch * self.per_seq),
        'saved_per_layer': _entry(self.layer_fixed + batch * self.layer_per_seq),
        'recompute_one_layer': _entry(self.re_fixed + batch * self.re_per_seq),
        'peak': _entry(self.peak(batch)),
        'per_sequence': _entry(self.per_seq + self.re_per_seq),
        'largest_residuals_2_layers_2_sequences': [
            {'bytes': int(b), 'gib': round(b / GIB, 3), 'shape': list(sh), 'dtype': d, 'what': w}
            for b, sh, d, w in self.largest],
    }


def _credit_fn(config, mesh_shape: dict, rules: dict):
  """Per-device share of a residual traced on one device's micro-batch: tensor-parallel
  dimensions divide an activation, expert parallelism's gathered tokens multiply MoE rows, and a
  weight copy is split like the parameters ('embed' axes)."""
  m = config.model
  tensor_dims = []
  deltanet = (('heads', m.deltanet.num_value_heads), ('kv_heads', m.deltanet.num_key_heads)
              ) if 'linear_attention' in tuple(m.get('layer_types', ())) else ()
  for name, size in (('heads', m.num_heads), ('kv_heads', m.num_kv_heads), ('mlp', m.ffn_size),
                     ('expert_mlp', m.moe.expert_ffn_size), ('vocab', m.vocab_size)) + deltanet:
    n = math.prod(mesh_shape[a] for a in sharding.mesh_axes_of(name, rules))
    if n > 1 and size and size % n == 0:
      tensor_dims.append((size, n))
  ep = math.prod(mesh_shape[a] for a in sharding.mesh_axes_of('expert', rules)
                 if a in sharding.mesh_axes_of('batch', rules))
  weight_split = math.prod(mesh_shape[a] for a in sharding.mesh_axes_of('embed', rules))
  T, K = config.data.seq_len, max(m.moe.top_k, 1)

  def credit(shape, nbytes, activation=True):
    if not activation:
      return nbytes / weight_split
    for size, n in tensor_dims:
      if size in shape[1:]:
        nbytes /= n
        break
    if m.moe.num_experts and ep > 1 and any(d % (T * K) == 0 for d in shape[:2]):
      nbytes *= ep   # [(layers,) token x expert assignments, ...]: gathered over the expert axis
    return nbytes
  return credit


def _device_memory_bytes(config) -> tuple[float | None, str]:
  gib = float(config.memory.get('device_memory_gib', 0) or 0)
  if gib > 0:
    return gib * GIB, 'config.memory.device_memory_gib'
  try:
    d = jax.devices()[0]
    if d.platform != 'cpu':
      limit = (d.memory_stats() or {}).get('bytes_limit')
      if limit:
        return float(limit), f'{d.device_kind} memory_stats bytes_limit'
  except Exception:  # pylint: disable=broad-except
    pass
  return None, 'unknown: set --config.memory.device_memory_gib'


def _fsdp_transient(setup, mesh_shape) -> int:
  """One layer's weights made whole along their 'embed' (FSDP) dimension, in the compute dtype
  for the forward and backward, plus that layer's float32 gradient before it is
  reduce-scattered; 0 when nothing is FSDP-sharded."""
  layer_whole, gathered = _layer_gathered(setup, mesh_shape)
  return layer_whole * (2 * setup.model_cfg.compute_dtype.itemsize + 4) if gathered else 0


def _layer_gathered(setup, mesh_shape) -> tuple[int, bool]:
  """(elements of one layer's weights made whole along 'embed' on a device, whether any
  weight is FSDP-sharded)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  _, state = nnx.split(model_lib.abstract_model(setup.model_cfg))
  layer_whole, gathered = 0, False
  for path, v in jax.tree_util.tree_leaves_with_path(
      state, is_leaf=lambda v: isinstance(v, nnx.Variable)):
    if getattr(path[0], 'key', None) != 'blocks':
      continue
    axes = sharding.param_logical_axes(v)
    spec = sharding.logical_to_spec(axes, setup.rules, sharding.value_shape(v), mesh_shape)
    kept = math.prod(sharding.spec_size(P(e), mesh_shape)
                     for name, e in zip(axes, spec) if name != 'embed')
    gathered |= any(sharding.spec_size(P(e), mesh_shape) > 1
                    for name, e in zip(axes, spec) if name == 'embed')
    layer_whole += math.prod(sharding.value_shape(v)[1:]) // kept   # one layer of the stack
  return layer_whole, gathered


def _fit(out, config, setup, device_bytes, state_total, configured, micro_batch):
  """Whether it fits, the headroom, the largest micro-batch that fits and a grad_accum."""
  total = state_total + configured.peak(micro_batch)
  out['fits'] = bool(total <= device_bytes)
  out['headroom'] = _entry(device_bytes - total)
  free = device_bytes - state_total - configured.fixed - configured.re_fixed
  per_seq = configured.per_seq + configured.re_per_seq
  fit_batch = int(free // per_seq) if per_seq > 0 and free > 0 else 0
  out['max_micro_batch_per_device_that_fits'] = fit_batch
  per_device_batch = config.train.batch_size // setup.batch_shards
  out['suggested_grad_accum'] = None
  if fit_batch >= 1:
    out['suggested_grad_accum'] = next(
        (a for a in range(1, per_device_batch + 1)
         if per_device_batch % a == 0 and per_device_batch // a <= fit_batch), None)
  else:
    out['note'] = ('The parameters, optimizer state and gradients alone leave no room for one '
                   'sequence: use more devices or more FSDP sharding.')


def _attention_note(config, model_cfg) -> str:
  """Which attention core the activations were traced with, and what it keeps."""
  from gated_attention.model import attention_kernels  # pylint: disable=g-import-not-at-top
  m = model_cfg
  impl = attention_kernels.choose(
      m.attention_impl, m.platform or jax.default_backend(), m.compute_dtype,
      config.data.seq_len, m.head_dim, m.attention_block_q, m.attention_block_kv,
      bool(config.data.get('document_mask', False)))
  return (f'Activations are traced on this machine, attention as {impl!r} '
          f'(model.attention_impl={m.attention_impl!r}): xla keeps the scores [batch, heads, T, '
          'T] for the backward pass, chunked the causal half of them; blockwise, splash and cuDNN '
          'flash attention keep O(T) per head.')


class _Plan:
  """What the estimate needs, built once for a config: the abstract mesh and setup, the sharded
  state and the activations' bilinear model; `total(grad_accum)` is cheap, so --fit_grad_accum
  tries many grad_accums on one plan."""

  def __init__(self, config):
    from gated_attention.training import train  # pylint: disable=g-import-not-at-top
    self.config = config
    self.num_devices = int(config.memory.get('num_devices', 0) or 0) or jax.device_count()
    mesh = sharding.abstract_mesh(config.mesh, self.num_devices)
    self.mesh_shape = dict(mesh.shape)
    self.setup = train.Setup(config, mesh)
    self.params = _sharded_bytes(self.setup.abstract_params)
    self.opt = _sharded_bytes(self.setup.abstract_opt)
    self.fsdp_transient = _fsdp_transient(self.setup, self.mesh_shape)
    self.credit = _credit_fn(config, self.mesh_shape, self.setup.rules)
    self.configured = _Activations(config, self.setup.model_cfg, config.model.remat, self.credit)
    self.device_bytes, self.device_source = _device_memory_bytes(config)

  def micro_batch(self, grad_accum: int) -> int:
    return self.config.train.batch_size // grad_accum // self.setup.batch_shards

  def grads(self, grad_accum: int) -> int:
    return self.params * (2 if grad_accum > 1 else 1)

  def state_total(self, grad_accum: int) -> float:
    return self.params + self.opt + self.grads(grad_accum) + self.fsdp_transient

  def total(self, grad_accum: int) -> float:
    return self.state_total(grad_accum) + self.configured.peak(self.micro_batch(grad_accum))


def report(config, plan: _Plan | None = None) -> dict:
  """Per-device bytes (and GiB) of parameters, optimizer state, gradients and activations."""
  plan = plan or _Plan(config)
  setup, mesh_shape, configured = plan.setup, plan.mesh_shape, plan.configured
  tc = config.train
  micro_batch = plan.micro_batch(tc.grad_accum)
  params, opt, grads = plan.params, plan.opt, plan.grads(tc.grad_accum)
  fsdp_transient = plan.fsdp_transient
  remat = config.model.remat
  acts = {'configured': configured.summary(micro_batch)}
  for other in ('none', 'full'):
    if other != remat:
      acts[other] = _Activations(config, setup.model_cfg, other, plan.credit).summary(micro_batch)
  state_total = plan.state_total(tc.grad_accum)
  device_bytes, source = plan.device_bytes, plan.device_source
  out = {
      'config': f'{config.variant}:{config.scale}',
      'devices': plan.num_devices,
      'mesh': mesh_shape,
      'dcn_data': int(config.mesh.get('dcn_data', 1) or 1),
      'rules': config.mesh.rules,
      'batch': {'global_batch': tc.batch_size, 'seq_len': config.data.seq_len,
                'grad_accum': tc.grad_accum,
                'data_parallel_axes': list(sharding.mesh_axes_of('batch', setup.rules)),
                'data_parallel_shards': setup.batch_shards, 'micro_batch_per_device': micro_batch},
      'params_total': int(sum(x.size for x in jax.tree.leaves(setup.abstract_params))),
      'per_device': {
          'params': _entry(params), 'opt_state': _entry(opt), 'grads': _entry(grads),
          'fsdp_transient': _entry(fsdp_transient),
          'activations': acts['configured']['peak'],
          'total': _entry(state_total + configured.peak(micro_batch)),
      },
      'activations': acts,
      'device_memory': None if device_bytes is None else _entry(device_bytes),
      'device_memory_source': source,
      'notes': [
          _attention_note(config, setup.model_cfg),
          'Not counted: other XLA temporaries, fragmentation, program and communication '
          'buffers; keep 10-20% headroom. --mode=compile gives the TPU compiler\'s figure.'],
  }
  if device_bytes is not None:
    _fit(out, config, setup, device_bytes, state_total, configured, micro_batch)
  return out


def fit_grad_accum(config, log=print) -> dict:
  """The estimate at config.train.grad_accum x 1, 2, 4, ... (training/fit.py: while every device
  keeps at least one sequence per micro-batch) against the device memory
  (config.memory.device_memory_gib, or the device's own), one line per attempt; returns the
  report of the first that fits, with `fit_grad_accum` listing the attempts. Raises UserError
  (one paragraph) when the device memory is unknown or none fits."""
  if schema.is_auto(config.train.grad_accum):   # train.grad_accum=auto: the walk from 1
    config = fit.with_grad_accum(config, 1)
  plan = _Plan(config)
  if plan.device_bytes is None:
    raise UserError('--fit_grad_accum needs the memory of a device to fit: set '
                    '--config.memory.device_memory_gib (e.g. 95 for a TPU v5p chip, 16 for v5e, '
                    '32 for v6e; gated_attention/chips.py), or run where the device reports it.')
  tc, cap = config.train, plan.device_bytes

  def attempt(ga):
    total = plan.total(ga)
    return {'fits': bool(total <= cap),
            'message': f'{total / GIB:.2f} GiB of {cap / GIB:.2f} GiB per device (estimate)'}

  shards = plan.setup.batch_shards
  found, tried = fit.walk(fit.candidates(tc.batch_size, shards, tc.grad_accum), attempt,
                          tc.batch_size / shards, log)
  where = (f'for {config.variant}:{config.scale} on {plan.num_devices} devices of '
           f'{cap / GIB:.2f} GiB (global batch {tc.batch_size}, sequence {config.data.seq_len}, '
           f'{shards} data-parallel shards; the estimate, no compiler)')
  if found is None:
    raise UserError(fit.none_fits(tried, where))
  log(f'Smallest grad_accum that fits {where}: {found.grad_accum}.')
  out = report(fit.with_grad_accum(config, found.grad_accum), plan)
  out['fit_grad_accum'] = {'grad_accum': found.grad_accum,
                           'attempts': [{'grad_accum': a.grad_accum, 'fits': a.fits,
                                         'message': a.message} for a in tried]}
  return out


def long_context_report(config) -> dict:
  """Per-device bytes of --mode=long_context's evaluation (inference/long_context.py) at the
  largest of long_context.lengths, long_context.batch_size sequences and chunks of
  long_context.chunk tokens, on config.memory.num_devices devices (an estimate; --mode=compile
  --plan=long_context compiles the step for a TPU topology):

    params          the run's float32 parameters, sharded by config.mesh as the evaluation loads
                    them (runs/factory.py)
    kv_cache        [layers, batch, cache length, kv heads, head_dim] x 2 (keys, values) in the
                    compute dtype (a hybrid: its attention layers'; its Gated DeltaNet layers add
                    their conv and recurrent states, which do not grow with the length),
                    on EVERY device (the evaluation's jit replicates it), and twice:
                    the scoring step takes the cache and returns a new one (not donated)
    chunk           one layer's attention of a chunk against the whole cache: float32 scores and
                    probabilities and the probabilities in the compute dtype [batch, heads, chunk,
                    cache length]; the chunk's float32 logits and log-probabilities [batch,
                    chunk, vocab]; one layer's weights made whole (FSDP)
    ruler_prefill   RULER's generation (generate._prefill) keeps every chunk's float32 logits
                    and concatenates them: 2 x [batch, prompt, vocab], on top of the above

  With a sliding window (long_context.window / sinks, model/kv_cache.py) every sequence streams
  token by token: the cache has sinks + window slots whatever the length, one query a step
  (scores [batch, heads, 1, slots]), one step's float32 logits [batch, vocab], and the prompts'
  last logits only (no prefill concatenation).
  """
  # pylint: disable=g-import-not-at-top
  from gated_attention.inference import long_context
  from gated_attention.model import kv_cache
  from gated_attention.runs import factory as factory_lib, rundir
  # pylint: enable=g-import-not-at-top
  config = rundir.for_generation(config.copy_and_resolve_references())
  opts = config.long_context
  lengths = long_context.evaluated_lengths(opts, config.data.seq_len)
  S, B, L = long_context.cache_length(lengths), int(opts.batch_size), max(lengths)
  C = min(int(opts.chunk), S)
  window = kv_cache.Window.from_settings(
      int(opts.get('window', 0)), int(opts.get('sinks', 0)),
      names=('--config.long_context.window', '--config.long_context.sinks'))
  if window is not None:          # streaming: one query a step against sinks + window slots
    window = window.clamped(S)
    S, C = window.capacity, 1
  num_devices = int(config.memory.get('num_devices', 0) or 0) or jax.device_count()
  mesh = sharding.abstract_mesh(config.mesh, num_devices)
  factory = factory_lib.ModelFactory(config, mesh)
  m = factory.model_cfg
  item = jnp.dtype(m.compute_dtype).itemsize
  params = _sharded_bytes(factory.abstract_params)
  cache = 2 * m.num_attention_layers * B * S * m.num_kv_heads * m.head_dim * item
  if m.is_hybrid:   # a Gated DeltaNet layer's conv and float32 recurrent states (deltanet.py)
    dn = m.deltanet
    cache += (m.num_layers - m.num_attention_layers) * B * (
        dn.num_value_heads * dn.key_head_dim * dn.value_head_dim * 4
        + (dn.conv_kernel - 1) * (2 * dn.num_key_heads * dn.key_head_dim
                                  + dn.num_value_heads * dn.value_head_dim) * item)
  scores = B * m.num_heads * C * S * (4 + 4 + item)
  logits = 2 * B * C * m.vocab_size * 4
  layer_whole, gathered = _layer_gathered(factory, dict(mesh.shape))
  weights = layer_whole * item if gathered else 0
  scoring = params + 2 * cache + scores + logits + weights
  prefill = 2 * B * L * m.vocab_size * 4 if window is None else B * m.vocab_size * 4
  device_bytes, source = _device_memory_bytes(config)
  out = {
      'config': f'{config.variant}:{config.scale}', 'plan': 'long_context',
      'devices': num_devices, 'mesh': dict(mesh.shape), 'rules': config.mesh.rules,
      'evaluation': {'lengths': lengths, 'cache_length': S, 'batch': B, 'chunk': C,
                     **({} if window is None else {'window': window.window,
                                                   'sinks': window.sinks})},
      'per_device': {
          'params': _entry(params), 'kv_cache': _entry(cache),
          'kv_cache_in_and_out': _entry(2 * cache), 'attention_scores_one_layer': _entry(scores),
          'chunk_logits': _entry(logits), 'layer_weights_gathered': _entry(weights),
          'scoring_total': _entry(scoring),
          'ruler_prefill_logits': _entry(prefill),
          'ruler_total': _entry(scoring + prefill),
      },
      'device_memory': None if device_bytes is None else _entry(device_bytes),
      'device_memory_source': source,
      'notes': [
          'An estimate: XLA\'s other temporaries and fusion are not modelled; --mode=compile '
          '--plan=long_context --topology=... gives the TPU compiler\'s figure.',
          'The cache is replicated: more devices shrink only the parameters; a smaller '
          'long_context.batch_size (or chunk) is what shrinks the rest.'],
  }
  if device_bytes is not None:
    out['fits'] = bool(scoring <= device_bytes)
    out['ruler_fits'] = bool(scoring + prefill <= device_bytes)
  return out
