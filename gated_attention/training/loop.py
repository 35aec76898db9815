"""The training loop: steps, evaluation, metrics, checkpoints, signals, the session's account.

    loop.run(config, workdir)      # main.py --mode=train

One run's parts, public for a driver that steps several runs together (training/seeds.py):
`start_run(config, workdir, setup)` -> a `Run` (session.py: lock, data, state, writers;
`describe_run` says what it is), then per step `due_now(run)` (log / eval / save), `check_pending(run)` (the stability
guard's verdict), `log_evaluate_save(run, ...)`; `save_on_interrupt` on SIGTERM / Ctrl-C (an
`Interrupt` catches them) and `close_run(run)` at the end, whatever happened.

One step: the next batch of the data iterator, already on the devices (prefetch.py reads
`data.device_prefetch` batches ahead in a thread) -> train.Setup.train_step (jit; a non-finite step
changes nothing) -> its loss and finiteness are queued on the device and, at every log, eval or
save point, fed to the stability guard (stability.py: skipped steps, loss spikes, divergence,
each logged to metrics.jsonl) -> every `log_every` steps the metrics, every `eval_every` steps
evaluate.evaluate, and orbax's cadence for checkpoints (only while the guard is calm, the last
step included: a run that ends spiking keeps its last calm checkpoint and says so).
One trainer per run directory: the lock file RUN/trainer.lock (runs/lock.py) is taken before
anything is written and released at the end; its heartbeat is a background thread's.
On a failure (too many non-finite steps in a row, or a divergence) the run halts or rolls back
to the best checkpoint with a lower learning rate. SIGTERM / Ctrl-C save a checkpoint and stop.
The time the loop waits for a batch is logged as `data_wait`: its fraction of the wall time since
the last log (0 when the pipeline keeps up).
"""

import dataclasses
import math
import threading
import time

import jax

from gated_attention import cluster
from gated_attention import compilation_cache
from gated_attention import storage
from gated_attention.analysis import goodput as goodput_lib
from gated_attention.errors import UserError
from gated_attention.runs import rundir as workdir_lib
from gated_attention.training import evaluate as eval_lib
from gated_attention.training import goodput, stability
from gated_attention.training import profile as profile_lib
from gated_attention.training import train as train_lib
from gated_attention.training import interrupt as interrupt_lib
from gated_attention.training.interrupt import Interrupt
from gated_attention.training.reporting import Throughput, device_memory
# A session's start and close (session.py), used here and by drivers of several runs (seeds.py).
from gated_attention.training.session import (Run, check_loop_config, close_run,  # noqa: F401
                                              data_bound, describe_run, start_run)
from gated_attention.training.session import say


class TrainingStopped(UserError):
  """The run stopped on a failure its policy does not recover from (nothing bad was saved)."""


def evaluate(setup, params, data) -> dict:
  """The validation row: loss and perplexity over the held-out batches, and the analysis
  metrics (F-Attn, M-Act, gate score) of `train.inspect_batch_size` rows of the first batch.
  A mixture (data.mixture): loss/<name> and ppl/<name> over each source's held-out batches,
  and as `loss` their mean weighted by the mixture's weights (the loss per token of the
  mixture); the analysis metrics are the first source's."""
  rows = setup.cfg.train.inspect_batch_size
  if not hasattr(data, 'val_sets'):
    return eval_lib.summary(eval_lib.evaluate(setup, params, data.val_batches(),
                                              inspect_rows=rows))
  out, weighted = {}, 0.0
  for source in data.sources:
    result = eval_lib.evaluate(setup, params, data.val_sets()[source.name], inspect_rows=rows)
    if not out:
      out = eval_lib.summary(result)
    out[f'loss/{source.name}'], out[f'ppl/{source.name}'] = result.loss, result.ppl
    weighted += source.weight * result.loss
  out['loss'], out['ppl'] = weighted, math.exp(min(weighted, 50.0))
  return out


def _log_events(run: Run, events):
  for e in events:
    run.writer.write(e.step, e.kind, e.row())
    if e.kind in ('spike', 'diverged'):
      run.progress.write(f'step {e.step}: loss {e.loss:.4f} {e.kind} (level {e.level:.4f}; '
                         f'{e.why})')
    elif e.kind == 'skip':
      run.progress.write(f'step {e.step}: non-finite loss, gradients or update (loss '
                         f'{e.loss}); the step was skipped')


def check_pending(run: Run):
  """Feeds the queued steps to the guard; returns the first failure event, or None."""
  if not run.pending:
    return None
  values = jax.device_get([(m['loss'], m['finite']) for _, m in run.pending])
  steps = [s for s, _ in run.pending]
  run.pending.clear()
  for step, (loss, finite) in zip(steps, values):
    events = run.guard.observe(step, float(loss), bool(finite))
    _log_events(run, events)
    failure = next((e for e in events if e.kind == 'failure'), None)
    if failure is not None:
      return failure
  return None


def _recover(run: Run, failure: stability.Event):
  """Rolls back to the best checkpoint before the failure, or raises TrainingStopped."""
  tc, ckpt = run.config.train, run.checkpointer
  best = ckpt.best_step(before=failure.step)
  if tc.on_failure == 'rollback' and run.rollbacks < tc.max_rollbacks and best is not None:
    ckpt.wait()
    restored = ckpt.restore_step(best, run.abstract_state, run.data.train_iter)
    # Each rollback lowers the rate in force (not the one saved with the checkpoint rolled back
    # to, which repeated rollbacks to one checkpoint would scale only once).
    rollbacks, lr_scale = run.rollbacks + 1, run.lr_scale * tc.rollback_lr_factor
    run.adopt(restored)
    run.rollbacks, run.lr_scale = rollbacks, lr_scale
    run.writer.write(failure.step, 'rollback', {'to_step': best, 'lr_scale': run.lr_scale,
                                                'why': failure.why})
    run.progress.write(f'step {failure.step}: {failure.why}; rolled back to checkpoint {best} '
                       f'with the learning rate x{run.lr_scale:g} (rollback {run.rollbacks} of '
                       f'{tc.max_rollbacks}).')
    return
  good = (f'the best checkpoint is step {best}' if best is not None
          else 'no checkpoint was saved before it')
  raise TrainingStopped(
      f'Training stopped at step {failure.step}: {failure.why} (loss {failure.loss}). Nothing '
      f'from the failing steps was saved; {good} (in {ckpt.directory}). Lower '
      '--config.train.learning_rate (or raise warmup_steps / grad_clip) and resume with the '
      'same command, or set --config.train.on_failure=rollback to go back to the best '
      'checkpoint with a lower learning rate automatically.')


def _step(run: Run, batch, interrupt: Interrupt | None = None) -> dict:
  setup = run.setup
  step = interrupt.step if interrupt is not None and interrupt.agreeing else (
      lambda s, *a: s.train_step(*a))
  try:
    run.params, run.opt_state, metrics = step(setup, run.params, run.opt_state, batch,
                                              float(run.lr_scale))
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e) and 'out of memory' not in str(e).lower():
      raise
    c = run.config
    raise UserError(
        f'The training step does not fit in memory ({str(e).splitlines()[0][:200]}): batch '
        f'{c.train.batch_size} x {c.data.seq_len} tokens of a {c.scale} model on mesh '
        f'{dict(setup.mesh.shape)}. Lower --config.train.batch_size or data.seq_len, raise '
        '--config.train.grad_accum, set --config.model.remat=full, or use more devices; '
        'python main.py --mode=memory estimates what fits.') from None
  run.step += 1
  run.pending.append((run.step, metrics))
  return metrics


def _log_train(run: Run, metrics, throughput: Throughput):
  tc = run.config.train
  metrics = jax.device_get(metrics)
  metrics.update(learning_rate=train_lib.learning_rate_at(tc, run.step - 1)
                 * run.lr_scale, loss_level=run.guard.level,
                 skipped_total=run.guard.totals['skipped'],
                 spikes_total=run.guard.totals['spikes'], **throughput.metrics(),
                 **_accounting(run))
  run.writer.write(run.step, 'train', metrics)
  run.progress.update(run.step, f'loss {float(metrics["loss"]):.4f} '
                      f'data_wait {100 * metrics["data_wait"]:.1f}%')
  throughput.reset()


def _read_validation(run: Run):
  """The validation batches read (once: the data keeps them) within a bound where the data is
  on object storage: REQUEST_S without a batch read is a stalled storage (session.data_bound)."""
  bound = data_bound(run.config, 'validation data')
  if bound is None:
    return
  progress = threading.Event()
  run.data.on_val_batch = progress.set
  try:
    read = run.data.val_sets if hasattr(run.data, 'val_sets') else run.data.val_batches
    storage.waits.call(read, *bound, progress=progress)
  finally:
    run.data.on_val_batch = None


def _evaluate_and_log(run: Run) -> dict:
  _read_validation(run)
  val = evaluate(run.setup, run.params, run.data)
  val.update(device_memory())       # peak bytes in use, where the backend reports them
  run.writer.write(run.step, 'val', val)
  per_source = ''.join(f' {k[5:]} {v:.4f}' for k, v in val.items() if k.startswith('loss/'))
  run.progress.write(f'step {run.step}: val loss {val["loss"]:.4f}{per_source} ppl '
                     f'{val["ppl"]:.2f} F-Attn {val["f_attn_mean"]:.3f} M-Act '
                     f'{val["m_act_mean"]:.1f}')
  return val


def _accounting(run: Run) -> dict:
  """A mixture's per-source counts at the last batch the loop took ({} for one source)."""
  if not getattr(run.data, 'sources', None):
    return {}
  return run.data.accounting(run.data.train_iter.get_state())


def mixture_summary(run: Run) -> str | None:
  """The end-of-run line of a mixture: each source's tokens trained on, their share against
  the weight, and the epochs it has begun (None for one source)."""
  counts = _accounting(run)
  if not counts:
    return None
  parts = [f'{s.name} {counts["tokens/" + s.name]:,} ({100 * counts["share/" + s.name]:.2f}% '
           f'for weight {100 * s.weight:.2f}%, epoch {counts["epochs/" + s.name]})'
           for s in run.data.sources]
  return f'Tokens trained on per source up to step {run.step}: ' + '; '.join(parts) + '.'


def _say_not_saved(run: Run):
  """The last step is not saved when the loss is not calm (a spike or a skipped step within
  spike_window steps): the run ends with its last calm checkpoint."""
  since = run.guard.since_trouble
  latest = run.checkpointer.latest_step()
  kept = (f'the run ends with its last calm checkpoint, step {latest}' if latest is not None
          else 'no checkpoint was saved in this run')
  run.progress.write(
      f'step {run.step}: not saved: the loss is not calm (the last spike or skipped step was '
      f'{since} step(s) ago, fewer than spike_window={run.config.train.spike_window}); {kept} '
      f'(in {run.checkpointer.directory}). metrics.jsonl has the spikes; lower '
      '--config.train.learning_rate (or raise warmup_steps / grad_clip) and resume.')


def due_now(run: Run) -> list[bool]:
  """Whether the step just taken is a [log, eval, save] point (the last step is all three)."""
  tc, last = run.config.train, run.step == run.config.train.steps
  return [run.step % tc.log_every == 0 or last, run.step % tc.eval_every == 0 or last,
          run.checkpointer.should_save(run.step) or last]


def log_evaluate_save(run: Run, metrics, throughput: Throughput, due: list[bool]):
  """The train row, the validation row and the checkpoint of the step just taken, as `due`
  says (after the guard saw it); returns the validation row or None, and whether it saved."""
  val, saved = None, False
  if due[0]:
    _log_train(run, metrics, throughput)
  else:
    run.progress.update(run.step, None)
  run.account.lap('steps')
  if due[1]:
    val = _evaluate_and_log(run)
    throughput.reset()
    run.account.lap('eval')
  if due[2] and run.guard.calm:                    # never a state taken while spiking
    run.save()
    saved = True
    run.account.lap('checkpoint')
  elif due[2] and run.step == run.config.train.steps:
    _say_not_saved(run)
  return val, saved


def save_on_interrupt(run: Run, what, saved: bool):
  """A signal stopped the loop (`what`: 'signal 15', or Interrupt.describe()): the state is
  saved unless it just was or is not calm (every process decides alike: the guard's state is
  the same everywhere)."""
  run.account.lap('steps')
  if not saved and check_pending(run) is None and run.guard.calm:
    run.save()
    saved = True
  run.account.lap('checkpoint')
  what = what if isinstance(what, str) else f'signal {what}'
  hosts = ' on every host' if jax.process_count() > 1 else ''
  if run.step == 0:
    run.progress.write(f'Interrupted ({what}) before the first step: nothing to save; run the '
                       f'same command again{hosts} to start.')
  elif saved:
    run.progress.write(f'Interrupted ({what}) at step {run.step}: checkpoint saved; run the same '
                       f'command again{hosts} to resume.')
  else:
    latest = run.checkpointer.latest_step()
    run.progress.write(f'Interrupted ({what}) at step {run.step}: not saved (the loss is not '
                       'calm); run the same command again' + hosts + ' to resume from '
                       + (f'step {latest}.' if latest is not None else 'the start.'))


def _train(run: Run, interrupt: Interrupt) -> dict:
  """Steps until the end or a signal; returns the last validation row. The session's account
  gets a lap at each boundary between its causes (goodput.py)."""
  tc, setup, account = run.config.train, run.setup, run.account
  throughput = Throughput(run.config, setup.model_cfg)
  profiler = profile_lib.Profiler(tc, run.workdir, run.step, say=run.progress.write)
  val, last_saved = None, run.step
  account.lap('startup')
  with jax.set_mesh(setup.mesh):
    try:
      while run.step < tc.steps and not interrupt.stop_now():
        run.checkpointer.check_for_errors()        # a failed async save stops at the next step
        profiler.before(run.step + 1)
        start = time.perf_counter()
        batch = next(run.data.train_iter)          # global arrays, on the devices (prefetch.py)
        throughput.tick(data_wait=time.perf_counter() - start)
        account.lap('data_wait')
        with profiler.annotate(run.step + 1):
          metrics = _step(run, batch, interrupt)
        if run.step == profiler.last:
          account.lap('steps')
          profiler.after(run.step, (run.params, run.opt_state))
          account.lap('profile')
        due = due_now(run)
        if any(due):
          failure = check_pending(run)
          if failure is not None:
            account.lap('steps')
            _recover(run, failure)
            account.lap('restore')
            throughput.reset()
            continue
        new_val, saved = log_evaluate_save(run, metrics, throughput, due)
        val = new_val if new_val is not None else val
        last_saved = run.step if saved else last_saved
        if any(due):
          account.publish(run.step)
      if interrupt.stopped:
        save_on_interrupt(run, interrupt.describe(), last_saved == run.step)
    finally:
      account.lap('steps')
      profiler.close(run.step)
      account.lap('profile')
  return val


@dataclasses.dataclass(frozen=True)
class Finished:
  """A run that has trained to its last step and saved it, as `run`'s `on_finish` gets it: the
  final checkpoint's parameters still in memory, with the model factory and data they were
  trained with."""
  workdir: str
  step: int
  params: object
  factory: train_lib.Setup
  data: object


def run(config, workdir: str, on_finish=None) -> dict:
  """Trains config in workdir (resuming from its latest checkpoint); returns final val metrics.
  `on_finish(Finished)`, if given, runs once the last step is trained and saved and the run's
  files are closed (not after an interrupted run, nor one whose last step was not calm)."""
  compilation_cache.enable(config.get('compilation_cache', ''))
  # Several processes: the signals are this loop's from the start, so that one received while
  # the run starts (restores, builds its data) stops every process too, after its first steps
  # (otherwise jax.distributed's preemption notifier takes SIGTERM and training goes on). One
  # process: a Ctrl-C while it starts stops it at once (main.py), as it always did.
  early = Interrupt(config.train.stop_timeout) if jax.process_count() > 1 else None
  account = goodput.Account()                      # this session's time, from the process start
  try:
    state = start_run(config, workdir, account=account)
  except BaseException:
    if early is not None:
      early.restore()
    raise
  state.progress.write(describe_run(state))
  cluster.liveness.hint = lambda: _resume_hint(state)
  interrupt = early or Interrupt(config.train.stop_timeout)
  try:
    try:
      account.begin(workdir, state.step)
      val = _train(state, interrupt)
      summary = mixture_summary(state)
      if summary:
        state.progress.write(summary)
    except BaseException as e:   # the first error is the one reported; closing must not hide it
      interrupt.failing(e)
      close_run(state, raise_errors=False)
      account.finish(state.step, 'failed', raise_errors=False)
      raise
    try:
      close_run(state)
      memory = device_memory()
      if account.finish(state.step, 'interrupted' if interrupt.stopped else 'finished',
                        **memory):
        say(goodput_lib.describe(goodput.summary(workdir)))
    except BaseException as e:
      interrupt.failing(e)
      raise
    if memory:
      say(f'Device memory: peak {memory["memory_peak_gib"]:.2f} GiB in use on one device'
           + (f' of {memory["memory_limit_gib"]:.2f} GiB' if 'memory_limit_gib' in memory
              else '') + '.')
  finally:
    # Where main.py owns the process, the handlers stay until it exits (interrupt.py); a
    # library caller (a notebook, the tests) gets its own back, and full storage bounds.
    interrupt.restore()
    cluster.liveness.hint = None
    if not interrupt_lib.owned():
      storage.waits.closed()
  if (on_finish is not None and not interrupt.stopped
      and state.step == config.train.steps == workdir_lib.latest_step(workdir)):
    on_finish(Finished(workdir, state.step, state.params, state.setup, state.data))
  return val or {}


def _resume_hint(run: Run) -> str:
  """What running the command again does, as far as this process knows without asking the
  storage (cluster/liveness.py prints it from another thread when a process is lost)."""
  step = run.checkpointer.last_committed_step()
  return (f'it resumes from step {step}' if step is not None
          else 'it resumes from its latest checkpoint')
