"""Ahead-of-time compilation of --mode=long_context's evaluation for a TPU topology
(`--mode=compile --plan=long_context`): the scoring step of the longest evaluated length through
its KV cache, compiled on a slice's compile-only devices (tpu.py), and its per-device memory
against HBM, with RULER's prefill logits added (aot.py compiles the training step the same way
and reads the compiler's memory and out-of-memory reports for both).
"""

import math
import time

from gated_attention.chips import CHIPS
from gated_attention.compile import aot
from gated_attention.compile import tpu


def long_context_step(config, devices):
  """(Generator, abstract arguments) of --mode=long_context's scoring step on `devices`: one
  chunk of `long_context.chunk` tokens of `long_context.batch_size` sequences through the KV
  cache of the largest length (+ the margin), as Generator.token_nll / token_scores run it. The
  shardings are the evaluation's: the parameters per config.mesh (runs/factory.py), the cache
  and the tokens replicated (the evaluation makes them outside jit, and the compiled step gives
  the cache back replicated: every device holds the whole batch's cache)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from gated_attention.inference import generate, long_context
  from gated_attention.model import kv_cache
  from gated_attention.runs import factory as factory_lib, rundir
  # pylint: enable=g-import-not-at-top
  config = rundir.for_generation(config.copy_and_resolve_references())
  opts = config.long_context
  lengths = long_context.evaluated_lengths(opts, config.data.seq_len)
  window = kv_cache.Window.from_settings(   # a sliding window: the streamed step, its ring
      int(opts.get('window', 0)), int(opts.get('sinks', 0)),
      names=('--config.long_context.window', '--config.long_context.sinks'))
  mesh = sharding.build_mesh(config.mesh, devices)
  factory = factory_lib.ModelFactory(config, mesh)
  gen = generate.Generator(factory.merge(factory.abstract_params),
                           max_len=long_context.cache_length(lengths), chunk=opts.chunk,
                           window=window)
  m, B = factory.model_cfg, int(opts.batch_size)
  C = gen.chunk if window is not None else min(gen.chunk, gen.max_len)
  replicated = NamedSharding(mesh, P())
  # generate.init_cache's shapes (a hybrid's: its attention layers' KV caches and its Gated
  # DeltaNet layers' states), replicated
  kv = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                    jax.eval_shape(lambda: generate.init_cache(m, B, gen.cache_len)))
  tokens = jax.ShapeDtypeStruct((B, C), jnp.int32, sharding=replicated)
  start = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=replicated)
  return gen, factory, (gen.state, tokens, tokens, start, kv), lengths


def long_context_report(config, topology: str) -> dict:
  """Compiles --mode=long_context's scoring step (long_context_step) for a TPU topology: the
  per-device memory of the evaluation against HBM. RULER's generation prefills through the same
  cache, and `generate._prefill` keeps every chunk's float32 logits and concatenates them into
  [batch, prompt, vocab] (twice that while it concatenates): `ruler_prefill_logits_bytes`,
  added to the compiled figure in `ruler_total_bytes` (analytic, not compiled)."""
  gen_name, devices = tpu.topology_devices(topology)
  gen, factory, args, lengths = long_context_step(config, devices)
  from gated_attention.inference import generate  # pylint: disable=g-import-not-at-top
  m, opts = factory.model_cfg, config.long_context
  B, S = int(opts.batch_size), gen.cache_len
  per_device = {k: v / len({getattr(d, 'core_on_chip', 0) for d in devices})
                for k, v in CHIPS[gen_name].items()}
  import jax  # pylint: disable=g-import-not-at-top
  cache_bytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(args[4]))
  params_bytes = aot.shard_bytes(factory.abstract_params)
  logits_bytes = (2 * B * max(lengths) * m.vocab_size * 4   # the chunks' and their concatenation
                  if gen.window is None else B * m.vocab_size * 4)   # streamed: the last only
  out = {
      'config': f'{config.variant}:{config.scale}', 'plan': 'long_context',
      'topology': f'{gen_name}:{topology.split(":", 1)[1]}', 'chip': gen_name,
      'devices': len(devices), 'mesh': dict(factory.mesh.shape), 'rules': config.mesh.rules,
      'evaluation': {'lengths': lengths, 'cache_length': S, 'batch': B, 'chunk': gen.chunk,
                     'rope_base': m.rope_base, 'rope_scaling': dict(config.model.rope_scaling),
                     **({} if gen.window is None else {'window': gen.window.window,
                                                       'sinks': gen.window.sinks})},
      'params_bytes_per_device': params_bytes,
      'kv_cache_bytes_per_device': cache_bytes,
      'ruler_prefill_logits_bytes': logits_bytes,
  }
  t0 = time.time()   # no mesh context or rules: the evaluation's jit has none
  step = (generate.Generator._chunk_scores if gen.window is None  # pylint: disable=protected-access
          else generate.Generator._stream_scores)                  # pylint: disable=protected-access
  lowered = step.lower(gen, *args)
  t1, logs_before = time.time(), tpu.log_sizes()
  try:
    compiled, error = lowered.compile(), None
  except Exception as e:  # pylint: disable=broad-except
    compiled, error = None, str(e)
  out['compile_seconds'] = {'lower': round(t1 - t0, 2), 'compile': round(time.time() - t1, 2)}
  where = (f'at length {max(lengths)} (cache {S}), batch {B}, chunk {gen.chunk} on {topology}: '
           f'the KV cache is {aot.gib(cache_bytes)} GiB on every device (replicated; the step '
           f'holds it twice: in and out), the parameters {aot.gib(params_bytes)} GiB')
  if compiled is None:
    if 'RESOURCE_EXHAUSTED' not in error and 'memory' not in error.lower():
      raise RuntimeError(f'Compiling the long-context step of {out["config"]} for {topology} '
                         f'failed: {error}')
    details = aot.oom_details(error, config, len(devices), logs_before)
    out['fits'] = False
    out['memory'] = dict(details, hbm_bytes_per_device=per_device['hbm_bytes'])
    req = details.get('required_bytes')
    out['message'] = (f'Does NOT fit: the scoring step needs {aot.gib(req) if req else "?"} GiB '
                      f'per device {where}. Lower --config.long_context.batch_size (the cache '
                      'grows with it; more devices do not split it).')
    return out
  out['memory'] = aot.memory_analysis(compiled, per_device, params_bytes)
  total = out['memory']['total_bytes']
  out['fits'] = total <= per_device['hbm_bytes']
  out['ruler_total_bytes'] = total + logits_bytes
  out['ruler_fits'] = out['ruler_total_bytes'] <= per_device['hbm_bytes']
  out['message'] = (
      f'{"Fits" if out["fits"] else "Does NOT fit"}: the scoring step (loss by position, '
      f'retrieval) needs {aot.gib(total)} GiB of {aot.gib(per_device["hbm_bytes"])} GiB per device '
      f'{where}. RULER\'s generation also holds the prompt\'s float32 logits, twice while '
      f'generate._prefill concatenates them ({aot.gib(logits_bytes)} GiB): '
      f'{aot.gib(total + logits_bytes)} GiB, '
      f'{"fits" if out["ruler_fits"] else "does NOT fit"}.')
  return out
