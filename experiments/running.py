"""Running one run of an experiment: train (or resume), analyse, continue at a longer context;
its status in runner.json; a group's seeds as one program; analysing finished runs again.
(experiments/run.py schedules the runs; experiments/processes.py starts each command.)
"""

import json
import os
import re
import shlex
import time

from experiments import processes, rundata, spec
from gated_attention import storage


def run_dir(out: str, run) -> str:
  return storage.join(out, 'runs', run.name)


_CACHE_FLAG = '--config.compilation_cache='


_ANALYZE_FLAG = '--analyze'


def cache_dir(out: str, option: str) -> str:
  """The runs' compilation cache: --compilation-cache, default OUT/xla_cache ('' when 'off');
  with OUT on object storage, a local default (~/.cache/gated_attention/xla_cache): the cache
  is read on every compile."""
  if option == 'off':
    return ''
  if option:
    return storage.abspath(option)
  if storage.is_remote(out):
    return os.path.join(os.path.expanduser('~'), '.cache', 'gated_attention', 'xla_cache')
  return os.path.join(out, 'xla_cache')


def cached(args: list[str], cache: str) -> list[str]:
  """main.py's arguments with the compilation cache switched on (when there is one)."""
  return args + [_CACHE_FLAG + cache] if cache else args


def _train_args(experiment, run, workdir: str, cache: str) -> list[str]:
  """The run's training command: with the compilation cache, and with --analyze (the analysis
  in the training process, from the parameters in memory and the compiled model) unless the
  experiment analyses with overrides of its own (ANALYZE_OVERRIDES: a separate --mode=analyze)."""
  args = cached(run.train_args(experiment.scale, workdir), cache)
  return args if experiment.analyze_overrides else args + [_ANALYZE_FLAG]


def same_command(saved: str | None, now: str) -> bool:
  """Whether a recorded command trains what `now` does: the compilation cache's directory and
  --analyze change no result, so they are left out of the comparison."""
  strip = lambda c: [a for a in shlex.split(c)  # noqa: E731
                     if not a.startswith(_CACHE_FLAG) and a != _ANALYZE_FLAG]
  return saved is not None and strip(saved) == strip(now)


def _analysed_since(workdir: str, since: float) -> bool:
  """Whether the training command that started at `since` analysed the run's final checkpoint
  (main.py --analyze): RUN/analysis/rundata.json written since then, of the latest step."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  path = runs_lib.report_path(workdir)
  try:
    if storage.mtime(path) < since:
      return False
    return json.loads(storage.read_bytes(path)).get('step') == runs_lib.latest_step(workdir)
  except (OSError, ValueError):
    return False


def write_runner(workdir: str, state: dict):
  storage.write(storage.join(workdir, rundata.RUNNER_FILE), json.dumps(state, indent=1))


def ended_spiking(workdir: str) -> int | None:
  """A run that trained to its last step but ended spiking: the training loop saves nothing
  while the loss is not calm, the last step included, so the run ends with its last calm
  checkpoint (docs/faults.md). Returns that checkpoint's step (None if the rows do not reach
  train.steps, or if the last step was saved). Resuming it would replay the same steps into the
  same spike (the data order and the step are deterministic), so the runner analyses that
  checkpoint and says so."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  try:
    steps = runs_lib.read_config(workdir).train.steps
  except ValueError:
    return None
  latest = runs_lib.latest_step(workdir)
  rows = runs_lib.read_metrics(workdir)
  reached = any(r.get('split') == 'train' and r.get('step') == steps for r in rows)
  return latest if reached and latest is not None and latest < steps else None


def _trained(workdir: str, steps: int | None = None) -> bool:
  """Whether the run has a checkpoint at `steps` (None: its saved config's train.steps)."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  if steps is None:
    try:
      steps = runs_lib.read_config(workdir).train.steps
    except ValueError:
      return False
  return (runs_lib.latest_step(workdir) or 0) >= steps


def _steps(run) -> int | None:
  """The run's train.steps in today's experiment file (None: its variant's default, which its
  saved config holds): more steps there train a finished run on from its checkpoint."""
  steps = dict(run.overrides).get('train.steps')
  return None if steps is None else int(steps)


def finished(experiment, run, out: str) -> bool:
  """runner.json says done (or diverged) with the command of today's experiment file (the
  compilation cache's directory aside)."""
  workdir = run_dir(out, run)
  state = rundata.read_runner(workdir)
  command = spec.shell(run.train_args(experiment.scale, workdir), 'python')
  if not (state.get('status') in ('done', 'diverged')
          and same_command(state.get('command'), command)):
    return False
  if (state['status'] == 'done' and state.get('ended_spiking') is None
      and _steps(run) is not None and not _trained(workdir, _steps(run))):
    return False  # more steps than it trained (a runner stopped before main.py trained them)
  if state['status'] == 'done' and experiment.long_context:  # a runner stopped inside the stage
    evaluated = rundata.extended_dir(workdir) if experiment.extend else workdir
    return all(rundata.read_long_context(evaluated, label) is not None
               for label in experiment.long_context)
  return True


BATCH_KEYS = ('seeds_command', 'seeds_seconds', 'seeds_runs', 'seeds_exit')  # runner.json


def execute(experiment, run, out: str, cache: str = '') -> dict:
  """Trains (or resumes) and analyses one run unless runner.json says it is done; `cache`: the
  persistent compilation cache's directory ('': none)."""
  workdir = run_dir(out, run)
  train_args = _train_args(experiment, run, workdir, cache)
  analyze_args = cached(experiment.analyze_args(workdir), cache)
  state = rundata.read_runner(workdir)
  if finished(experiment, run, out):
    return state  # finished (a diverged run diverges again: rerun it by deleting runner.json)
  if processes.STOPPING.is_set():
    raise processes.Stopped()
  storage.makedirs(workdir)
  state = {'run': run.name, 'group': run.group, 'variant': run.variant, 'seed': run.seed,
           'command': spec.shell(train_args, 'python'),
           'analyze_command': spec.shell(analyze_args, 'python'),
           'train_seconds': state.get('train_seconds', 0.0), 'attempts': state.get('attempts', 0),
           'status': 'training', 'git_commit': processes.git_commit(),
           **{k: state[k] for k in BATCH_KEYS if k in state}}
  write_runner(workdir, state)
  started = time.time()
  if not _trained(workdir, _steps(run)):
    rc, seconds = processes.call(train_args, storage.join(workdir, 'train.log'))
    state.update(train_seconds=state['train_seconds'] + seconds, attempts=state['attempts'] + 1)
    calm_step = None if rc else ended_spiking(workdir)
    if calm_step is not None:
      state['ended_spiking'] = calm_step
      processes.log(f'{run.name}: ended spiking; analysing its last calm checkpoint, step '
                    f'{calm_step}')
    elif rc or not _trained(workdir, _steps(run)):
      log = storage.join(workdir, 'train.log')
      state['status'] = processes.failure(log, rc) if rc else 'interrupted'
      write_runner(workdir, state)
      return state
  if state.get('ended_spiking') is None and _analysed_since(workdir, started):
    rc = 0   # analysed by the training command (--analyze): its seconds are in train_seconds
    state.update(analyze_seconds=0.0, analyzed_in_training=True, status='done')
  else:
    rc, seconds = processes.call(analyze_args, storage.join(workdir, 'analyze.log'))
    state.update(analyze_seconds=seconds, analyzed_in_training=False,
                 status='done' if rc == 0 else f'analysis failed (exit {rc})')
  if rc == 0 and experiment.long_context:
    state['status'] = 'long context'  # until the stage ends: a runner stopped inside resumes it
    write_runner(workdir, state)
    state['status'] = _long_context(experiment, workdir, state, cache)
  state['finished'] = processes.now()
  write_runner(workdir, state)
  return state


def reanalyze(experiment, runs, out: str, cache: str = '') -> list[dict]:
  """Runs the analysis again on each finished run (training nothing); its runner.json keeps
  its status, with the new analyze_seconds and `reanalyzed` (when, at which commit)."""
  states = []
  for run in runs:
    workdir = run_dir(out, run)
    state = rundata.read_runner(workdir)
    if state.get('status') != 'done':
      processes.log(f'{run.name}: {state.get("status", "not started")}, not analysed again')
      states.append(state or {'run': run.name, 'status': 'missing'})
      continue
    rc, seconds = processes.call(cached(experiment.analyze_args(workdir), cache),
                        storage.join(workdir, 'analyze.log'))
    if rc:
      state['status'] = f'analysis failed (exit {rc})'
    state.update(analyze_seconds=seconds,
                 reanalyzed=f'{processes.now()} at {processes.git_commit()}')
    write_runner(workdir, state)
    processes.log(f'{run.name}: analysed again '
                  f'({seconds:.0f} s{", exit " + str(rc) if rc else ""})')
    states.append(state)
  return states


def batchable(experiment, runs, out: str) -> bool:
  """Whether the runs of one group can train as one program: several, none finished, all at
  the same latest checkpoint (none, or one step) short of their steps."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  if len(runs) < 2 or any(finished(experiment, r, out) for r in runs):
    return False
  dirs = [run_dir(out, r) for r in runs]
  return (not any(_trained(d, _steps(r)) for d, r in zip(dirs, runs))
          and len({runs_lib.latest_step(d) for d in dirs}) == 1)


def train_seeds(experiment, runs, out: str, cache: str = '') -> int:
  """Trains the seeds of one group as one program (main.py --seeds); records the command, its
  wall time and each seed's share of it (train_seconds) in each runner.json; the exit code."""
  group = runs[0].group
  template = storage.join(out, 'runs', f'{group}_s{{seed}}')
  assert all(template.replace('{seed}', str(r.seed)) == run_dir(out, r) for r in runs)
  args = cached(spec.seeds_train_args(runs, experiment.scale, template), cache)
  states = {}
  for r in runs:
    workdir = run_dir(out, r)
    storage.makedirs(workdir)
    states[r.name] = dict(rundata.read_runner(workdir), run=r.name, status='training',
                          seeds_command=spec.shell(args, 'python'),
                          seeds_runs=[x.name for x in runs])
    write_runner(workdir, states[r.name])
  rc, seconds = processes.call(args, storage.join(out, 'runs', f'{group}.seeds.log'))
  for r in runs:
    state = states[r.name]
    state.update(train_seconds=state.get('train_seconds', 0.0) + seconds / len(runs),
                 attempts=state.get('attempts', 0) + 1,
                 seeds_seconds=state.get('seeds_seconds', 0.0) + seconds, seeds_exit=rc)
    write_runner(run_dir(out, r), state)
  return rc


def units(experiment, runs, out: str, batch_seeds: bool) -> list[list]:
  """`runs` as units of work: a group's seeds together where `batchable`, else one run each."""
  groups = {}
  for r in runs:
    groups.setdefault(r.group, []).append(r)
  units = []
  for members in groups.values():
    if batch_seeds and batchable(experiment, members, out):
      units.append(members)
    else:
      units += [[r] for r in members]
  return units


def _long_context(experiment, workdir: str, state: dict, cache: str = '') -> str:
  """Continues the run at a longer context (EXTEND, in <run>/extended/, resuming) and evaluates
  it for each LONG_CONTEXT label not yet done; updates `state`; returns the status."""
  evaluated = workdir
  if experiment.extend:
    evaluated = rundata.extended_dir(workdir)
    set_aside_stale_extension(workdir, evaluated)
    args = cached(experiment.extend_args(workdir, evaluated), cache)
    state['extend_command'] = spec.shell(args, 'python')
    if not _trained(evaluated):
      rc, seconds = processes.call(args, storage.join(workdir, 'extend.log'))
      state['extend_seconds'] = state.get('extend_seconds', 0.0) + seconds
      if rc or not _trained(evaluated):
        return 'extension ' + (processes.failure(storage.join(workdir, 'extend.log'), rc) if rc else
                               'interrupted')
  for label in experiment.long_context:
    if rundata.read_long_context(evaluated, label) is not None:
      continue
    rc, seconds = processes.call(cached(experiment.long_context_args(evaluated, label), cache),
                        storage.join(workdir, 'long_context.log'))
    state['long_context_seconds'] = state.get('long_context_seconds', 0.0) + seconds
    if rc:
      return f'long-context evaluation {label!r} failed (exit {rc})'
  return 'done'


_INITIALISED = re.compile(r'^Initialised from .* \(step (\d+)\)', re.M)  # training/loop.py


def set_aside_stale_extension(workdir: str, extended: str):
  """An extension (<run>/extended) started from the run's checkpoint at the step its extend.log
  names; once the run has trained further (more train.steps in the experiment file) it continues
  an older model, so it is moved aside to extended.from_step_<step>, kept, not deleted, and the
  run is extended again from its latest checkpoint."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  log = storage.join(workdir, 'extend.log')
  if not storage.isdir(extended) or not storage.isfile(log):
    return
  started = [int(m) for m in _INITIALISED.findall(storage.read_text(log))]
  latest = runs_lib.latest_step(workdir)
  if not started or latest is None or started[-1] == latest:
    return
  aside = f'{extended}.from_step_{started[-1]}'
  storage.move_tree(extended, aside)
  storage.write(storage.join(aside, 'extend.log'), storage.read_bytes(log))
  storage.remove(log)
  processes.log(f'{storage.basename(workdir)}: its extension started from step {started[-1]}, the '
                f'run is now at step {latest}: moved to {aside}, extending again')
