"""Several seeds of one config trained as one program: one compile, one data pass per seed.

    seeds.run(config, {0: 'runs/g1_s0', 1: 'runs/g1_s1'})   # main.py --seeds=0,1 --workdir=...

Parameters, optimizer states and batches are stacked on a leading seed axis [S, ...] (its
sharding: None, then the single run's), and one jitted call trains them all
(`config.train.seeds_program`): `jax.vmap` of train.Setup's step ('vmap'), or each seed's own
step side by side in one program ('unrolled': the single run's computation per seed, so its
numbers are bitwise a separate run's; 'auto' picks it on CPU, vmap on accelerators, where one
batched step fills the chip). Everything else is the single run's (loop.py), once per seed: its own config
(config.seed fixes the initialisation, the data order and the dropout), data iterator, run
directory (config.json, metrics.jsonl, checkpoints in the same orbax format), stability guard
and trainer lock; the rows, evaluations and checkpoints are made by loop.py's functions on that
seed's slice (evaluation compiles once: one Setup serves every seed). So each seed's directory
is an ordinary run: `main.py --workdir=<seed dir>` resumes it alone, `--mode=analyze` opens it.

With 'vmap' the numbers equal separate runs up to float32 rounding, not bitwise: XLA's batched
kernels sum in another order. With 'unrolled' they are bitwise equal (tests/test_seeds.py), and on
the 2-core CPU its step of 3 sink-task seeds ran at 0.98x the speed of 3 single steps (141.8 ms
against 139.2 ms; vmap's 161.5 ms, 0.86x, in the same process). The vmap figures: Measured (benchmarks/seeds.py, 2-core CPU): after 12-20 steps the parameters
differ by at most 2.4e-7 (absolute), the per-step losses by at most 3e-7 (relative), validation
loss / F-Attn / M-Act by 3e-8 / 2e-8 / 7e-7. Training amplifies rounding: on the sink task
(lr 1e-2, 300 steps, 3 seeds) the per-step losses drift apart by up to 0.017 and the final
F-Attn of one seed was 0.112 batched against 0.013 alone, so a long batched seed is another
sample of the same run, not a replica of its separate run. Speed there: one batched step of 3
seeds took 0.85x the speed of 3 single steps (0.356 s against 0.301 s, round-robin), so the
gain on a CPU is only the compiles and process starts saved.

A seed whose guard reports a failure (a divergence, too many non-finite steps in a row) leaves
the batch at that step, keeping its last calm checkpoint; the others go on. At the end the run
raises TrainingStopped naming it: resumed alone (`main.py --workdir=<seed dir>`), its own
failure policy (halt or rollback) applies. All seeds must start at the same step with the same
learning-rate scale (a rollback of a single run changes it); otherwise they are refused, naming
each seed's step.
"""

import copy
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from gated_attention import sharding
from gated_attention.errors import ConfigError
from gated_attention.training import loop
from gated_attention.training import train as train_lib
from gated_attention.training.reporting import Progress, Throughput


PROGRAMS = ('auto', 'unrolled', 'vmap')


def resolve_program(program: str, mesh) -> str:
  """config.train.seeds_program on this mesh: 'auto' is 'unrolled' on CPU, else 'vmap'."""
  if program not in PROGRAMS:
    raise ConfigError(f'config.train.seeds_program={program!r} is not one of {PROGRAMS} '
                      "('unrolled': bitwise a separate run per seed; 'vmap': one batched step).")
  if program != 'auto':
    return program
  return 'unrolled' if mesh.devices.flat[0].platform == 'cpu' else 'vmap'


def _stacked(s: NamedSharding) -> NamedSharding:
  """The sharding of [S, ...]: the seed axis replicated, the rest as `s`."""
  return NamedSharding(s.mesh, P(None, *s.spec))


class Stacked:
  """The jitted functions over the seed axis of one Setup: the vmapped training step, and
  stacking / slicing of parameters, optimizer states and batches (explicit shardings)."""

  def __init__(self, setup: train_lib.Setup, program: str | None = None):
    """`program`: 'vmap' or 'unrolled' (None: config.train.seeds_program; see the module)."""
    self.setup = setup
    self.program = program = resolve_program(
        program or setup.cfg.train.get('seeds_program', 'auto'), setup.mesh)
    params_sh = jax.tree.map(_stacked, setup.param_shardings)
    opt_sh = jax.tree.map(_stacked, setup.opt_shardings)
    batch_sh = _stacked(setup.batch_sharding)
    step = setup.train_step_fn
    stack = lambda trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)  # noqa: E731
    take = lambda tree, i: jax.tree.map(lambda x: x[i], tree)  # noqa: E731

    def train_step(params_S, opt_state_S, batch_S, lr_scale: float):
      if program == 'vmap':
        return jax.vmap(lambda p, o, b: step(p, o, b, lr_scale))(params_S, opt_state_S, batch_S)
      num_seeds = jax.tree.leaves(params_S)[0].shape[0]
      outs = [step(take(params_S, i), take(opt_state_S, i), take(batch_S, i), lr_scale)
              for i in range(num_seeds)]
      return tuple(stack([o[j] for o in outs]) for j in range(3))

    self.train_step = setup.jit(train_step, in_shardings=(params_sh, opt_sh, batch_sh),
                                out_shardings=(params_sh, opt_sh, setup.replicated),
                                static_argnums=(3,), donate_argnums=(0, 1))
    self.stack_state = jax.jit(stack, out_shardings=(params_sh, opt_sh))
    self.stack_batch = jax.jit(stack, out_shardings=batch_sh)
    self.take_params = jax.jit(take, out_shardings=setup.param_shardings)
    self.take_opt = jax.jit(take, out_shardings=setup.opt_shardings)

  def stack(self, runs) -> tuple:
    """(params [S, ...], opt_state [S, ...]) of `runs`, in their order."""
    with jax.set_mesh(self.setup.mesh):
      return self.stack_state([(r.params, r.opt_state) for r in runs])

  def take(self, params_S, opt_state_S, i: int, opt: bool = True) -> tuple:
    """Seed i's (params, opt_state or None), on the single run's shardings."""
    i = jnp.int32(i)
    with jax.set_mesh(self.setup.mesh):
      return (self.take_params(params_S, i),
              self.take_opt(opt_state_S, i) if opt else None)


def seed_configs(config, seeds) -> dict:
  """{seed: a copy of config with that seed}; refuses repeated seeds and several processes."""
  seeds = [int(s) for s in seeds]
  if not seeds or len(set(seeds)) != len(seeds):
    raise ConfigError(f'Seeds {seeds}: give one or more distinct seeds (e.g. --seeds=0,1,2).')
  if jax.process_count() > 1:
    raise ConfigError(f'--seeds trains several seeds in one program on one process; this job '
                      f'has {jax.process_count()} processes. Train each seed as its own run '
                      '(--config.seed=S, one --workdir each), or run --seeds on one host.')
  out = {}
  for s in seeds:
    c = copy.deepcopy(config)
    c.seed = s
    out[s] = c
  return out


def _check_aligned(runs):
  """All seeds at one step and one learning-rate scale, or a ConfigError naming them."""
  steps = {r.config.seed: r.step for r in runs}
  scales = {r.config.seed: r.lr_scale for r in runs}
  if len(set(steps.values())) > 1 or len(set(scales.values())) > 1:
    where = ', '.join(f'seed {s}: step {steps[s]}, lr scale {scales[s]:g} ({r.workdir})'
                      for s, r in zip(steps, runs))
    raise ConfigError(
        f'The seeds cannot be trained together: they resume at different steps or learning-rate '
        f'scales ({where}). Resume each one alone (python main.py --workdir=<its directory>), '
        'or start the batch in new directories.')


def _feed_guards(runs, pending) -> dict:
  """Gives each seed its queued (step, loss, finite) values; {seed index: failure event} for
  the seeds whose guard reports a failure (loop.check_pending logs every event)."""
  if not pending:
    return {}
  values = jax.device_get([(m['loss'], m['finite']) for _, m in pending])
  failures = {}
  for i, run in enumerate(runs):
    run.pending = [(s, {'loss': loss[i], 'finite': finite[i]})
                   for (s, _), (loss, finite) in zip(pending, values)]
    failure = loop.check_pending(run)
    if failure is not None:
      failures[i] = failure
  pending.clear()
  return failures


def _leave(run, failure) -> str:
  """Seed `run` stops at a failure; the message of its TrainingStopped."""
  latest = run.checkpointer.latest_step()
  kept = (f'its last calm checkpoint is step {latest}' if latest is not None
          else 'no checkpoint of it was saved')
  text = (f'seed {run.config.seed} stopped at step {failure.step}: {failure.why} (loss '
          f'{failure.loss}); nothing from the failing steps was saved, {kept} (in {run.workdir}). '
          f'Continue it alone with python main.py --workdir={run.workdir} (its '
          f'train.on_failure={run.config.train.on_failure} applies there), after lowering '
          '--config.train.learning_rate if it diverges again.')
  run.progress.write(text)
  return text


def _train(stacked: Stacked, runs, interrupt, close) -> tuple[dict, list[str]]:
  """Steps all seeds until the end or a signal; ({seed: last validation row}, the messages of
  the seeds that stopped on a failure, which leave `runs` and are `close`d at once)."""
  setup, tc = stacked.setup, runs[0].config.train
  params_S, opt_S = stacked.stack(runs)
  for r in runs:                                   # the stacked copy is the state now
    r.params = r.opt_state = None
  throughputs = [Throughput(r.config, setup.model_cfg) for r in runs]
  lr_scale, last_saved = float(runs[0].lr_scale), runs[0].step
  vals, stopped, pending = {}, [], []
  with jax.set_mesh(setup.mesh):
    while runs and runs[0].step < tc.steps and not interrupt.stop_now():
      batches = []
      for r, t in zip(runs, throughputs):
        r.checkpointer.check_for_errors()
        start = time.perf_counter()
        batches.append(next(r.data.train_iter))
        t.tick(data_wait=time.perf_counter() - start)
      params_S, opt_S, metrics_S = stacked.train_step(params_S, opt_S,
                                                      stacked.stack_batch(batches), lr_scale)
      for r in runs:
        r.step += 1
      pending.append((runs[0].step, metrics_S))
      due = loop.due_now(runs[0])
      if not any(due):
        for r in runs:
          r.progress.update(r.step, None)
        continue
      failures = _feed_guards(runs, pending)
      host = jax.device_get(metrics_S) if due[0] else None
      for i, r in enumerate(runs):
        if i in failures:
          continue
        if due[1] or due[2]:
          r.params, r.opt_state = stacked.take(params_S, opt_S, i, opt=due[2])
        metrics = {k: v[i] for k, v in host.items()} if host is not None else None
        val, saved = loop.log_evaluate_save(r, metrics, throughputs[i], due)
        if val is not None:
          vals[r.config.seed] = val
        last_saved = r.step if saved else last_saved
        r.params = r.opt_state = None
      if failures:
        stopped += [_leave(runs[i], f) for i, f in failures.items()]
        keep = [i for i in range(len(runs)) if i not in failures]
        for i in failures:
          close(runs[i])
        runs[:] = [runs[i] for i in keep]
        throughputs = [throughputs[i] for i in keep]
        if runs:  # the others go on, restacked (one compile for the smaller batch)
          states = [stacked.take(params_S, opt_S, i) for i in keep]
          params_S, opt_S = stacked.stack_state(states)
      for t in throughputs if due[1] else ():    # the evaluations of all seeds are not steps
        t.reset()
    if interrupt.stopped and runs:
      failures = _feed_guards(runs, pending)
      for i, r in enumerate(runs):
        if i in failures:
          stopped.append(_leave(r, failures[i]))
          continue
        if last_saved != r.step:
          r.params, r.opt_state = stacked.take(params_S, opt_S, i)
        loop.save_on_interrupt(r, interrupt.describe(), last_saved == r.step)
  return vals, stopped


def run(config, workdirs: dict) -> dict:
  """Trains config once per seed of `workdirs` ({seed: run directory}) as one program, each
  resuming from its latest checkpoint; returns {seed: final validation row}. Raises
  loop.TrainingStopped after the others finish if a seed stopped on a failure."""
  configs = seed_configs(config, list(workdirs))
  first = configs[next(iter(configs))]
  loop.check_loop_config(first)
  setup = train_lib.Setup(first, sharding.build_mesh(first.mesh))
  runs, closed = [], set()

  def close(r):
    if id(r) not in closed:
      closed.add(id(r))
      loop.close_run(r)

  try:
    for s, c in configs.items():
      runs.append(loop.start_run(c, workdirs[s], setup))
    _check_aligned(runs)
    for r in runs:
      r.progress.close()
      r.progress = Progress(r.step, r.config.train.steps, prefix=f'[seed {r.config.seed}] ')
      r.progress.write(loop.describe_run(r))
    interrupt = loop.Interrupt(first.train.stop_timeout)
    try:
      vals, stopped = _train(Stacked(setup), list(runs), interrupt, close)
    finally:
      interrupt.restore()
  finally:
    errors = []
    for r in runs:
      try:
        close(r)
      except Exception as e:  # pylint: disable=broad-except  # close the others, then raise
        errors.append(e)
    if errors:
      raise errors[0]
  if stopped:
    raise loop.TrainingStopped(
        f'{len(stopped)} of {len(runs)} seeds stopped on a failure; the others trained to the '
        'end. ' + ' '.join(stopped))
  return {s: vals.get(s, {}) for s in configs}

