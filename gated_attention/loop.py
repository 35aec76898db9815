"""The training loop: data, init or resume, steps, evaluation, metrics, checkpoints, signals.

    loop.run(config, workdir)      # main.py --mode=train

One step: the next batch of the data iterator -> train.Setup.train_step (jit) -> every
`log_every` steps the metrics (metrics.jsonl, TensorBoard, the progress line), every
`eval_every` steps evaluate.evaluate on the held-out batches, and orbax's cadence for
checkpoints (checkpoint.Checkpointer). SIGTERM / Ctrl-C save a checkpoint and stop.
"""

import dataclasses
import json
import math
import os
import signal
import sys
import time

import jax
import numpy as np

import input_pipeline
from gated_attention import checkpoint as ckpt_lib
from gated_attention import chips
from gated_attention import evaluate as eval_lib
from gated_attention import model as model_lib
from gated_attention import sharding
from gated_attention import train as train_lib
from gated_attention.errors import ConfigError


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


def evaluate(setup, params, data) -> dict:
  """The validation row: loss and perplexity over the held-out batches, and the analysis
  metrics (F-Attn, M-Act, gate score) of `train.inspect_batch_size` rows of the first batch."""
  result = eval_lib.evaluate(setup, params, data.val_batches(),
                             inspect_rows=setup.cfg.train.inspect_batch_size)
  return eval_lib.summary(result)


def check_loop_config(config):
  tc = config.train
  for name in ('steps', 'log_every', 'eval_every', 'checkpoint_every'):
    if tc[name] <= 0:
      raise ConfigError(f'config.train.{name}={tc[name]} must be positive.')


@dataclasses.dataclass
class _Run:
  """What one training run holds while it trains."""
  config: object
  workdir: str
  data: object
  setup: train_lib.Setup
  checkpointer: ckpt_lib.Checkpointer
  writer: MetricsWriter
  step: int = 0
  params: object = None
  opt_state: object = None

  def save(self):
    self.checkpointer.save(self.step, {'params': self.params, 'opt_state': self.opt_state},
                           self.data.train_iter)


def _start(config, workdir: str) -> _Run:
  """Data, mesh, compiled steps; the state from scratch or from the latest checkpoint."""
  tc = config.train
  check_loop_config(config)
  data = input_pipeline.build_data(
      config.data, global_batch_size=tc.batch_size, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  if data.tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(f'The tokenizer {data.tokenizer.name} has {data.tokenizer.vocab_size} '
                      f'tokens but config.model.vocab_size={config.model.vocab_size}; raise '
                      'config.model.vocab_size to at least the tokenizer size.')
  setup = train_lib.Setup(config, sharding.build_mesh(config.mesh))
  ckpt_lib.check_or_write_config(workdir, config)
  run = _Run(config, workdir, data, setup,
             ckpt_lib.Checkpointer(workdir, every=tc.checkpoint_every,
                                   keep=tc.keep_checkpoints),
             MetricsWriter(workdir))
  step = run.checkpointer.latest_step()
  if step is None:
    run.params, run.opt_state = setup.init(config.seed)
  else:
    restored = run.checkpointer.restore(
        step, {'params': setup.abstract_params, 'opt_state': setup.abstract_opt},
        data.train_iter)
    run.step, run.params, run.opt_state = step, restored['params'], restored['opt_state']
  return run


class _Throughput:
  """Step time, tokens/s, achieved TFLOP/s per device and (on known TPU chips) MFU."""

  def __init__(self, config, model_cfg):
    self.tokens_per_step = config.train.batch_size * config.data.seq_len
    self.flops_per_token = model_lib.train_flops_per_token(model_cfg, config.data.seq_len)
    self.chip = chips.chip_spec(jax.devices()[0].device_kind)
    self.t_last, self.steps = time.time(), 0

  def tick(self):
    self.steps += 1

  def reset(self):
    self.t_last, self.steps = time.time(), 0

  def metrics(self) -> dict:
    dt = (time.time() - self.t_last) / max(self.steps, 1)
    tflops = self.flops_per_token * self.tokens_per_step / dt / 1e12 / jax.device_count()
    out = dict(step_time=dt, tokens_per_sec=self.tokens_per_step / dt,
               tflops_per_sec_per_device=tflops)
    if self.chip:
      out['mfu'] = tflops * 1e12 / self.chip['peak_bf16_flops']
    return out


def _log_train(run: _Run, metrics, throughput: _Throughput, progress: Progress):
  tc = run.config.train
  metrics = jax.device_get(metrics)
  metrics.update(learning_rate=float(train_lib.learning_rate_schedule(tc)(run.step - 1)),
                 **throughput.metrics())
  if not math.isfinite(float(metrics['loss'])):
    raise FloatingPointError(f'Loss is {metrics["loss"]} at step {run.step}: training '
                             'diverged (lower --config.train.learning_rate).')
  run.writer.write(run.step, 'train', metrics)
  progress.update(run.step, f'loss {float(metrics["loss"]):.4f}')
  throughput.reset()


def _evaluate_and_log(run: _Run, progress: Progress) -> dict:
  val = evaluate(run.setup, run.params, run.data)
  run.writer.write(run.step, 'val', val)
  progress.write(f'step {run.step}: val loss {val["loss"]:.4f} ppl {val["ppl"]:.2f} '
                 f'F-Attn {val["f_attn_mean"]:.3f} M-Act {val["m_act_mean"]:.1f}')
  return val


def _describe(run: _Run) -> str:
  config = run.config
  report = model_lib.param_report(run.setup.model_cfg)
  return (f'{config.variant} ({config.scale}): {report["total"]:,} parameters '
          f'({report["active"]:,} active), mesh {dict(run.setup.mesh.shape)}, '
          f'{"resuming at step " + str(run.step) if run.step else "starting"} in {run.workdir}; '
          f'data: {json.dumps(run.data.describe())}')


def _train(run: _Run, interrupt: _Interrupt, progress: Progress) -> dict:
  """Steps until the end or a signal; returns the last validation row."""
  tc, setup = run.config.train, run.setup
  throughput = _Throughput(run.config, setup.model_cfg)
  val, last_saved = None, run.step
  with jax.set_mesh(setup.mesh):
    while run.step < tc.steps and interrupt.signal is None:
      batch = setup.global_batch(next(run.data.train_iter))
      run.params, run.opt_state, metrics = setup.train_step(run.params, run.opt_state, batch)
      run.step += 1
      throughput.tick()
      last = run.step == tc.steps
      if run.step % tc.log_every == 0 or last:
        _log_train(run, metrics, throughput, progress)
      else:
        progress.update(run.step, None)
      if run.step % tc.eval_every == 0 or last:
        val = _evaluate_and_log(run, progress)
        throughput.reset()
      if run.checkpointer.should_save(run.step) or last:
        run.save()
        last_saved = run.step
    if interrupt.signal is not None:
      if last_saved != run.step:
        run.save()
      progress.write(f'Interrupted (signal {interrupt.signal}) at step {run.step}: checkpoint '
                     'saved; run the same command again to resume.')
  return val


def run(config, workdir: str) -> dict:
  """Trains config in workdir (resuming from its latest checkpoint); returns final val metrics."""
  state = _start(config, workdir)
  progress = Progress(state.step, config.train.steps)
  progress.write(_describe(state))
  interrupt = _Interrupt()
  try:
    val = _train(state, interrupt, progress)
  finally:
    interrupt.restore()
    state.checkpointer.close()
    progress.close()
    state.writer.close()
  return val or {}
