"""The training loop: data, init or resume, steps, evaluation, metrics, checkpoints, signals."""

import json
import math
import os
import signal
import sys
import time

import jax
import numpy as np

import input_pipeline
from gated_attention import aot
from gated_attention import checkpoint as ckpt_lib
from gated_attention import model as model_lib
from gated_attention import sharding
from gated_attention import train as train_lib


class MetricsWriter:
  """metrics.jsonl (one JSON object per line, with "step" and "split") and TensorBoard events.

  Only process 0 writes.
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self.tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))
    except ImportError:  # TensorBoard output is optional
      self.tb = None

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: _jsonable(v) for k, v in metrics.items()})
    self.jsonl.write(json.dumps(row) + '\n')
    self.jsonl.flush()
    if self.tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != 'step':
          self.tb.add_scalar(f'{split}/{k}', v, step)
      self.tb.flush()

  def close(self):
    if self.enabled:
      self.jsonl.close()
      if self.tb is not None:
        self.tb.close()


def _jsonable(v):
  v = np.asarray(v)
  if v.ndim == 0:
    x = v.item()
    return None if isinstance(x, float) and not math.isfinite(x) else x
  return [_jsonable(x) for x in v]


class Progress:
  """A tqdm bar with ETA on a terminal; plain log lines otherwise."""

  def __init__(self, start: int, total: int):
    self.bar = None
    if jax.process_index() == 0 and sys.stdout.isatty():
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, initial=start, unit='step', dynamic_ncols=True)
    self.t0, self.start, self.total = time.time(), start, total

  def update(self, step: int, line: str | None):
    if self.bar is not None:
      self.bar.update(step - self.bar.n)
      if line:
        self.bar.set_postfix_str(line)
    elif line and jax.process_index() == 0:
      done = step - self.start
      eta = (time.time() - self.t0) / max(done, 1) * (self.total - step)
      print(f'step {step}/{self.total} {line} eta {eta:.0f}s', flush=True)

  def write(self, text: str):
    if jax.process_index() != 0:
      return
    if self.bar is not None:
      self.bar.write(text)
    else:
      print(text, flush=True)

  def close(self):
    if self.bar is not None:
      self.bar.close()


def evaluate(setup, params, data) -> dict:
  """Validation loss and perplexity over the held-out batches, plus the analysis metrics
  (mean gate score, per-layer F-Attn and M-Act) of the first rows of the first batch.

  The analysis step materialises attention probabilities [B, H, T, T] for one layer at a time,
  so it sees only `train.inspect_batch_size` sequences (rounded up to one per data shard).
  """
  loss_sum = tokens = 0.0
  batches = data.val_batches()
  with jax.set_mesh(setup.mesh):
    for local in batches:
      out = jax.device_get(setup.eval_step(params, setup.global_batch(local)))
      loss_sum += float(out['loss_sum'])
      tokens += float(out['tokens'])
    shards, local_rows = setup.batch_shards, len(batches[0]['inputs'])
    rows = -(-setup.cfg.train.inspect_batch_size // shards) * shards // jax.process_count()
    rows = min(max(rows, 1), local_rows)
    first = setup.global_batch({k: v[:rows] for k, v in batches[0].items()})
    aux = jax.device_get(setup.inspect_step(params, first))
  loss = loss_sum / max(tokens, 1.0)
  metrics = {'loss': loss, 'ppl': math.exp(min(loss, 50.0))}
  metrics.update(summarize_inspection(aux))
  return metrics


def summarize_inspection(aux) -> dict:
  f_attn_L = np.mean(aux['f_attn_H'], axis=-1)
  m_act_L = np.asarray(aux['m_act']['ffn_residual']['max'])
  out = {'f_attn': f_attn_L, 'f_attn_mean': float(np.mean(f_attn_L)),
         'm_act': m_act_L, 'm_act_mean': float(np.mean(m_act_L))}
  if 'gate' in aux:
    out['gate_score'] = aux['gate']['mean']
    out['gate_score_mean'] = float(np.mean(aux['gate']['mean']))
  return out


class _Interrupt:
  """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and exits cleanly."""

  def __init__(self):
    self.signal = None
    self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

  def _handle(self, signum, _):
    if self.signal is not None:  # a second Ctrl-C: give up immediately
      raise KeyboardInterrupt
    self.signal = signum

  def restore(self):
    for s, h in self._old.items():
      signal.signal(s, h)


def run(config, workdir: str) -> dict:
  """Trains config in workdir (resuming from its latest checkpoint); returns final val metrics."""
  tc = config.train
  if tc.steps <= 0:
    raise ValueError(f'config.train.steps={tc.steps} must be positive.')
  data = input_pipeline.build_data(
      config.data, global_batch_size=tc.batch_size, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  if data.tokenizer.vocab_size > config.model.vocab_size:
    raise ValueError(f'The tokenizer {data.tokenizer.name} has {data.tokenizer.vocab_size} '
                     f'tokens but config.model.vocab_size={config.model.vocab_size}; raise '
                     'config.model.vocab_size to at least the tokenizer size.')
  mesh = sharding.build_mesh(config.mesh)
  setup = train_lib.Setup(config, mesh)
  checkpointer = ckpt_lib.Checkpointer(workdir, config, keep=tc.keep_checkpoints,
                                       every=tc.checkpoint_every)
  writer = MetricsWriter(workdir)
  step = checkpointer.latest_step()
  if step is None:
    step = 0
    params, opt_state = setup.init(config.seed)
  else:
    restored = checkpointer.restore(
        step, {'params': setup.abstract_params, 'opt_state': setup.abstract_opt},
        data.train_iter)
    params, opt_state = restored['params'], restored['opt_state']
  report = model_lib.param_report(config.model)
  flops_per_token = model_lib.train_flops_per_token(config.model, config.data.seq_len)
  chip = aot.chip_spec(jax.devices()[0].device_kind)  # peak FLOP/s for MFU (known TPUs only)
  progress = Progress(step, tc.steps)
  progress.write(
      f'{config.variant} ({config.scale}): {report["total"]:,} parameters '
      f'({report["active"]:,} active), mesh {dict(mesh.shape)}, '
      f'{"resuming at step " + str(step) if step else "starting"} in {workdir}; data: '
      f'{json.dumps(data.describe())}')

  interrupt = _Interrupt()
  tokens_per_step = tc.batch_size * config.data.seq_len
  val_metrics = None
  t_last, steps_since, last_saved = time.time(), 0, step
  try:
    with jax.set_mesh(mesh):
      while step < tc.steps and interrupt.signal is None:
        batch = setup.global_batch(next(data.train_iter))
        params, opt_state, metrics = setup.train_step(params, opt_state, batch)
        step += 1
        steps_since += 1
        if step % tc.log_every == 0 or step == tc.steps:
          metrics = jax.device_get(metrics)
          dt = (time.time() - t_last) / steps_since
          metrics.update(learning_rate=float(train_lib.learning_rate_schedule(tc)(step - 1)),
                         step_time=dt, tokens_per_sec=tokens_per_step / dt,
                         tflops_per_sec_per_device=flops_per_token * tokens_per_step / dt
                         / 1e12 / jax.device_count())
          if chip:
            metrics['mfu'] = (metrics['tflops_per_sec_per_device'] * 1e12
                              / chip['peak_bf16_flops'])
          if not math.isfinite(float(metrics['loss'])):
            raise FloatingPointError(f'Loss is {metrics["loss"]} at step {step}: training '
                                     'diverged (lower --config.train.learning_rate).')
          writer.write(step, 'train', metrics)
          progress.update(step, f'loss {float(metrics["loss"]):.4f}')
          t_last, steps_since = time.time(), 0
        else:
          progress.update(step, None)
        if step % tc.eval_every == 0 or step == tc.steps:
          val_metrics = evaluate(setup, params, data)
          writer.write(step, 'val', val_metrics)
          progress.write(f'step {step}: val loss {val_metrics["loss"]:.4f} '
                         f'ppl {val_metrics["ppl"]:.2f} F-Attn {val_metrics["f_attn_mean"]:.3f}'
                         f' M-Act {val_metrics["m_act_mean"]:.1f}')
          t_last, steps_since = time.time(), 0
        if step % tc.checkpoint_every == 0 or step == tc.steps:
          checkpointer.save(step, {'params': params, 'opt_state': opt_state}, data.train_iter,
                            force=True)
          last_saved = step
    if interrupt.signal is not None:
      if last_saved != step:
        checkpointer.save(step, {'params': params, 'opt_state': opt_state}, data.train_iter,
                          force=True)
      progress.write(f'Interrupted (signal {interrupt.signal}) at step {step}: checkpoint saved;'
                     ' run the same command again to resume.')
  finally:
    interrupt.restore()
    checkpointer.close()
    progress.close()
    writer.close()
  return val_metrics or {}
