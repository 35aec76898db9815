"""Runs an experiment file: trains every run, analyses it, writes the table and the figures.
(One file, one concern: the runner's schedule of runs and their status, each function a step of it;
the results are report.py's.)

  python -m experiments.run experiments/sink_synthetic.py             # all runs, one at a time
  python -m experiments.run experiments/sink_synthetic.py --jobs 2    # two side by side
  python -m experiments.run experiments/sink_synthetic.py --results docs/results.md
  python -m experiments.run experiments/sink_synthetic.py --print-commands   # one line per run
  python -m experiments.run experiments/sink_synthetic.py --report-only      # table of what is done
  python -m experiments.run experiments/sink_synthetic.py --reanalyze        # analyses again

Each run trains with `python main.py --config=configs/<variant>.py:<scale> --workdir=<out>/runs/
<run> --config.seed=S --config.<key>=<value> ... --analyze`: the same process then analyses the
final checkpoint (what `main.py --mode=analyze` writes, from the parameters in memory and the
compiled model); a separate `main.py --mode=analyze` runs where that did not happen (a run trained
before, one that ended spiking, an experiment with ANALYZE_OVERRIDES). Logs go to
<run>/train.log (and <run>/analyze.log), the status, commands and wall times to <run>/runner.json.
With `--batch-seeds`, the seeds of a group (one variant and grid point) that are all untrained,
or all stopped at the same step, train as one program first (`main.py --seeds=0,1,2 --workdir=<out>/runs/<group>_s{seed}`,
training/seeds.py; log <out>/runs/<group>.seeds.log), then each is analysed as above: its
runner.json keeps its own single-run command (what resuming it alone runs), the batched command,
and its share of the batched wall time as train_seconds. A seed the batch did not finish (a
failure) trains on alone with its single-run command. On CPU the batched program is
config.train.seeds_program='auto' = 'unrolled' (each seed's own step side by side in one
program), whose numbers are bitwise those of the separate runs (the 4-run sink probe, 2 variants x
2 seeds x 300 steps: every metrics.jsonl row equal); it is off by default because on the 2-core
CPU it saves nothing once the fork server and the compilation cache are in (the probe: 89 s
batched, 84.5 s one run at a time). With 'vmap' (accelerators' default) a seed equals its
separate run only to float32 rounding, which the sink task's lr 1e-2 amplifies over 300 steps
(final F-Attn 0.11 vs 0.01 for one seed).
Experiments with LONG_CONTEXT then continue the run at a longer context (EXTEND, in
<run>/extended/, log extend.log) and run `main.py --mode=long_context` once per label (log
long_context.log); their tables and long_context.png follow the main table.
The runs share JAX's persistent compilation cache (`--config.compilation_cache`, default
<out>/xla_cache; `--compilation-cache DIR` shares one between experiments, `off` turns it off):
runs of the same shapes, and their analyses, compile each program once. Each main.py command
runs in a process forked from a server that has imported JAX and the project once (Python's
multiprocessing fork server; a fresh interpreter where there is none), so a command costs its
work, not the imports.
A run whose runner.json says done (with the same command) is skipped, so running the experiment
again resumes it; a half-trained run resumes from its latest checkpoint. Raising train.steps in
the file trains finished runs on from their checkpoints (an extension of the older model is moved
aside to <run>/extended.from_step_N, kept, and redone). SIGTERM to the runner (a scheduler's time
limit, `kill`) is passed on to the commands it is running: a training saves a checkpoint and stops,
nothing new starts, the runner exits 143, and the same command resumes. The output directory
(default experiments/out/<name>/) gets results.md (the table: mean ± std over seeds),
summary.json and the figures f_attn_layers.png, m_act_layers.png, loss_curves.png.
`--results FILE` also writes the experiment's section into FILE (the command, the git commit,
the wall time, the table, the figures copied to docs/figures/<name>/).

With SLURM (or any scheduler with job arrays), one array task per run:

  python -m experiments.run experiments/sink_synthetic.py --print-commands > runs.txt
  sbatch --array=1-$(wc -l < runs.txt) --cpus-per-task=2 --time=00:30:00 \\
      --wrap 'eval "$(sed -n ${SLURM_ARRAY_TASK_ID}p runs.txt)"'
  # when all have finished (the same --out, on a shared filesystem):
  python -m experiments.run experiments/sink_synthetic.py --report-only --results docs/results.md

Each printed line is `python -m experiments.run EXPERIMENT --out OUT --only RUN` (it trains,
analyses and records the wall time of that run, and skips it if done); `--print-commands=main`
prints the bare `main.py` train && analyze commands instead.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

from experiments import report, spec
from gated_attention import storage

_PRINT_LOCK = threading.Lock()


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m experiments.run',
                              description='Train, analyse and tabulate the runs of an experiment.')
  p.add_argument('experiment', help='an experiment file, e.g. experiments/sink_synthetic.py')
  p.add_argument('--out', help='output directory (default: experiments/out/<name>)')
  p.add_argument('--jobs', type=int, default=1, help='runs trained side by side (default 1)')
  p.add_argument('--only', default='', help='comma-separated run names: run only these')
  p.add_argument('--print-commands', nargs='?', const='runner', choices=('runner', 'main'),
                 help='print one shell command per run (see the module docstring) and exit')
  p.add_argument('--python', default='python', help='the interpreter in printed commands')
  p.add_argument('--report-only', action='store_true', help='train nothing; tabulate what is done')
  p.add_argument('--reanalyze', action='store_true',
                 help='train nothing; run --mode=analyze again on every finished run (after the '
                 'analysis gained a statistic), then tabulate')
  p.add_argument('--results', help='also write this experiment\'s section into this markdown file')
  p.add_argument('--compilation-cache', default='',
                 help="JAX's persistent compilation cache of the runs (--config.compilation_cache):"
                 " runs of the same shapes compile once (default: OUT/xla_cache; 'off': none)")
  p.add_argument('--batch-seeds', action='store_true',
                 help='train a group\'s seeds as one program (main.py --seeds; see above)')
  args = p.parse_args(argv)
  if args.jobs < 1:
    p.error('--jobs must be at least 1')
  return args


def _workdir(out: str, run) -> str:
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


def _cached(args: list[str], cache: str) -> list[str]:
  """main.py's arguments with the compilation cache switched on (when there is one)."""
  return args + [_CACHE_FLAG + cache] if cache else args


def _train_args(experiment, run, workdir: str, cache: str) -> list[str]:
  """The run's training command: with the compilation cache, and with --analyze (the analysis
  in the training process, from the parameters in memory and the compiled model) unless the
  experiment analyses with overrides of its own (ANALYZE_OVERRIDES: a separate --mode=analyze)."""
  args = _cached(run.train_args(experiment.scale, workdir), cache)
  return args if experiment.analyze_overrides else args + [_ANALYZE_FLAG]


def _same_command(saved: str | None, now: str) -> bool:
  """Whether a recorded command trains what `now` does: the compilation cache's directory and
  --analyze change no result, so they are left out of the comparison."""
  strip = lambda c: [a for a in shlex.split(c)  # noqa: E731
                     if not a.startswith(_CACHE_FLAG) and a != _ANALYZE_FLAG]
  return saved is not None and strip(saved) == strip(now)


def _analysed_since(workdir: str, since: float) -> bool:
  """Whether the training command that started at `since` analysed the run's final checkpoint
  (main.py --analyze): RUN/analysis/report.json written since then, of the latest step."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  path = runs_lib.report_path(workdir)
  try:
    if storage.mtime(path) < since:
      return False
    return json.loads(storage.read_bytes(path)).get('step') == runs_lib.latest_step(workdir)
  except (OSError, ValueError):
    return False


def _write_runner(workdir: str, state: dict):
  storage.write(storage.join(workdir, report.RUNNER_FILE), json.dumps(state, indent=1))


def _log(message: str):
  with _PRINT_LOCK:
    print(message, flush=True)


# The modules every main.py command imports (JAX, Flax, orbax, grain, matplotlib: ~2-3 s per
# process on a 2-core CPU), imported once by a fork server that starts each command. Not
# gated_attention.cli: it defines the --config.* override flags from sys.argv when imported, so
# each command imports it itself.
_PRELOAD = ['gated_attention.modes.train', 'gated_attention.modes.analyze',
            'gated_attention.modes.long_context', 'gated_attention.training.loop',
            'gated_attention.analysis.plots', 'tensorboardX']
_FORKSERVER = []


def _forkserver():
  """A multiprocessing context whose processes fork from a server that has imported _PRELOAD
  (single-threaded: nothing is initialised, no devices, no compiled programs); None where the
  platform has no fork server."""
  if not _FORKSERVER:
    import multiprocessing  # pylint: disable=g-import-not-at-top
    try:
      ctx = multiprocessing.get_context('forkserver')
      ctx.set_forkserver_preload(_PRELOAD)
    except ValueError:
      ctx = None
    _FORKSERVER.append(ctx)
  return _FORKSERVER[0]


def _main_py(args: list[str], log_path: str):
  """In a forked process: `python args...` (main.py's command line), output to log_path."""
  import atexit  # pylint: disable=g-import-not-at-top
  fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  os.dup2(fd, 1)
  os.dup2(fd, 2)
  os.chdir(spec.REPO)
  sys.argv = list(args)
  from gated_attention import cli  # pylint: disable=g-import-not-at-top
  try:
    cli.run()
  finally:  # multiprocessing ends the process with os._exit: the exit handlers run here
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()


class _Stopped(Exception):
  """The runner got SIGTERM: no further command starts."""


_CHILDREN = {}        # id -> the running commands' processes (Popen or multiprocessing.Process)
_CHILDREN_LOCK = threading.RLock()  # the handler may run while the main thread holds it
_STOPPING = threading.Event()


def _on_sigterm(signum, frame):  # pylint: disable=unused-argument
  """SIGTERM to the runner (a scheduler's time limit, `kill`): the commands it started are
  forked from a server, not in its process group, so it passes the signal on (a training saves a
  checkpoint and stops, training/loop.py), waits for them and starts nothing more."""
  _STOPPING.set()
  with _CHILDREN_LOCK:
    children = list(_CHILDREN.values())
  for child in children:
    try:
      child.terminate()
    except (OSError, ValueError, AttributeError):
      pass


def _call(args: list[str], log_path: str) -> tuple[int, float]:
  """Runs `python args...` (a main.py command) in the repository root, output to log_path;
  (exit code, seconds). The process forks from the preloaded server (as if started afresh,
  without the imports), or is a new interpreter where there is none. Raises _Stopped once the
  runner got SIGTERM."""
  with _local_log(log_path) as local:
    return _call_logged(args, local)


@contextlib.contextmanager
def _local_log(log_path: str):
  """A local file to append a command's output to: `log_path` itself, or for a log on object
  storage (no append there) a local copy of it, uploaded whole when the command ends."""
  if not storage.is_remote(log_path):
    yield log_path
    return
  fd, local = tempfile.mkstemp(prefix='gated_attention_runner_', suffix='.log')
  try:
    with os.fdopen(fd, 'wb') as f:
      if storage.isfile(log_path):
        f.write(storage.read_bytes(log_path))
    yield local
  finally:
    try:
      with open(local, 'rb') as f:
        storage.write(log_path, f.read())
    finally:
      os.remove(local)


def _call_logged(args: list[str], log_path: str) -> tuple[int, float]:
  t0 = time.time()
  with open(log_path, 'a') as log:
    log.write(f'\n$ {spec.shell(args)}\n')
    log.flush()
    ctx = _forkserver() if args and args[0] == 'main.py' else None
    with _CHILDREN_LOCK:
      if _STOPPING.is_set():
        raise _Stopped()
      if ctx is None:
        child = subprocess.Popen([sys.executable] + args, cwd=spec.REPO, stdout=log,
                                 stderr=subprocess.STDOUT,
                                 env=dict(os.environ, PYTHONUNBUFFERED='1'))
      else:
        child = ctx.Process(target=_main_py, args=(args, log_path))
        child.start()
      _CHILDREN[id(child)] = child
    try:
      if ctx is None:
        return child.wait(), time.time() - t0
      child.join()
    finally:
      with _CHILDREN_LOCK:
        _CHILDREN.pop(id(child), None)
  rc = child.exitcode
  return (rc if rc >= 0 else 128 - rc), time.time() - t0


def _failure(log_path: str, rc: int) -> str:
  text = storage.read_text(log_path)
  stopped = 'Training stopped at step' in text or 'training diverged' in text
  return 'diverged' if stopped else f'failed (exit {rc})'


def _ended_spiking(workdir: str) -> int | None:
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


def _finished(experiment, run, out: str) -> bool:
  """runner.json says done (or diverged) with the command of today's experiment file (the
  compilation cache's directory aside)."""
  workdir = _workdir(out, run)
  state = report.read_runner(workdir)
  command = spec.shell(run.train_args(experiment.scale, workdir), 'python')
  if not (state.get('status') in ('done', 'diverged')
          and _same_command(state.get('command'), command)):
    return False
  if (state['status'] == 'done' and state.get('ended_spiking') is None
      and _steps(run) is not None and not _trained(workdir, _steps(run))):
    return False  # more steps than it trained (a runner stopped before main.py trained them)
  if state['status'] == 'done' and experiment.long_context:  # a runner stopped inside the stage
    evaluated = report.extended_dir(workdir) if experiment.extend else workdir
    return all(report.read_long_context(evaluated, label) is not None
               for label in experiment.long_context)
  return True


BATCH_KEYS = ('seeds_command', 'seeds_seconds', 'seeds_runs', 'seeds_exit')  # runner.json


def execute(experiment, run, out: str, cache: str = '') -> dict:
  """Trains (or resumes) and analyses one run unless runner.json says it is done; `cache`: the
  persistent compilation cache's directory ('': none)."""
  workdir = _workdir(out, run)
  train_args = _train_args(experiment, run, workdir, cache)
  analyze_args = _cached(experiment.analyze_args(workdir), cache)
  state = report.read_runner(workdir)
  if _finished(experiment, run, out):
    return state  # finished (a diverged run diverges again: rerun it by deleting runner.json)
  if _STOPPING.is_set():
    raise _Stopped()
  storage.makedirs(workdir)
  state = {'run': run.name, 'group': run.group, 'variant': run.variant, 'seed': run.seed,
           'command': spec.shell(train_args, 'python'),
           'analyze_command': spec.shell(analyze_args, 'python'),
           'train_seconds': state.get('train_seconds', 0.0), 'attempts': state.get('attempts', 0),
           'status': 'training', 'git_commit': git_commit(),
           **{k: state[k] for k in BATCH_KEYS if k in state}}
  _write_runner(workdir, state)
  started = time.time()
  if not _trained(workdir, _steps(run)):
    rc, seconds = _call(train_args, storage.join(workdir, 'train.log'))
    state.update(train_seconds=state['train_seconds'] + seconds, attempts=state['attempts'] + 1)
    calm_step = None if rc else _ended_spiking(workdir)
    if calm_step is not None:
      state['ended_spiking'] = calm_step
      _log(f'{run.name}: ended spiking; analysing its last calm checkpoint, step {calm_step}')
    elif rc or not _trained(workdir, _steps(run)):
      state['status'] = _failure(storage.join(workdir, 'train.log'), rc) if rc else 'interrupted'
      _write_runner(workdir, state)
      return state
  if state.get('ended_spiking') is None and _analysed_since(workdir, started):
    rc = 0   # analysed by the training command (--analyze): its seconds are in train_seconds
    state.update(analyze_seconds=0.0, analyzed_in_training=True, status='done')
  else:
    rc, seconds = _call(analyze_args, storage.join(workdir, 'analyze.log'))
    state.update(analyze_seconds=seconds, analyzed_in_training=False,
                 status='done' if rc == 0 else f'analysis failed (exit {rc})')
  if rc == 0 and experiment.long_context:
    state['status'] = 'long context'  # until the stage ends: a runner stopped inside resumes it
    _write_runner(workdir, state)
    state['status'] = _long_context(experiment, workdir, state, cache)
  state['finished'] = _now()
  _write_runner(workdir, state)
  return state


def reanalyze(experiment, runs, out: str, cache: str = '') -> list[dict]:
  """Runs the analysis again on each finished run (training nothing); its runner.json keeps
  its status, with the new analyze_seconds and `reanalyzed` (when, at which commit)."""
  states = []
  for run in runs:
    workdir = _workdir(out, run)
    state = report.read_runner(workdir)
    if state.get('status') != 'done':
      _log(f'{run.name}: {state.get("status", "not started")}, not analysed again')
      states.append(state or {'run': run.name, 'status': 'missing'})
      continue
    rc, seconds = _call(_cached(experiment.analyze_args(workdir), cache),
                        storage.join(workdir, 'analyze.log'))
    if rc:
      state['status'] = f'analysis failed (exit {rc})'
    state.update(analyze_seconds=seconds, reanalyzed=f'{_now()} at {git_commit()}')
    _write_runner(workdir, state)
    _log(f'{run.name}: analysed again ({seconds:.0f} s{", exit " + str(rc) if rc else ""})')
    states.append(state)
  return states


def batchable(experiment, runs, out: str) -> bool:
  """Whether the runs of one group can train as one program: several, none finished, all at
  the same latest checkpoint (none, or one step) short of their steps."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top
  if len(runs) < 2 or any(_finished(experiment, r, out) for r in runs):
    return False
  dirs = [_workdir(out, r) for r in runs]
  return (not any(_trained(d, _steps(r)) for d, r in zip(dirs, runs))
          and len({runs_lib.latest_step(d) for d in dirs}) == 1)


def train_seeds(experiment, runs, out: str, cache: str = '') -> int:
  """Trains the seeds of one group as one program (main.py --seeds); records the command, its
  wall time and each seed's share of it (train_seconds) in each runner.json; the exit code."""
  group = runs[0].group
  template = storage.join(out, 'runs', f'{group}_s{{seed}}')
  assert all(template.replace('{seed}', str(r.seed)) == _workdir(out, r) for r in runs)
  args = _cached(spec.seeds_train_args(runs, experiment.scale, template), cache)
  states = {}
  for r in runs:
    workdir = _workdir(out, r)
    storage.makedirs(workdir)
    states[r.name] = dict(report.read_runner(workdir), run=r.name, status='training',
                          seeds_command=spec.shell(args, 'python'),
                          seeds_runs=[x.name for x in runs])
    _write_runner(workdir, states[r.name])
  rc, seconds = _call(args, storage.join(out, 'runs', f'{group}.seeds.log'))
  for r in runs:
    state = states[r.name]
    state.update(train_seconds=state.get('train_seconds', 0.0) + seconds / len(runs),
                 attempts=state.get('attempts', 0) + 1,
                 seeds_seconds=state.get('seeds_seconds', 0.0) + seconds, seeds_exit=rc)
    _write_runner(_workdir(out, r), state)
  return rc


def _units(experiment, runs, out: str, batch_seeds: bool) -> list[list]:
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
    evaluated = report.extended_dir(workdir)
    _set_aside_stale_extension(workdir, evaluated)
    args = _cached(experiment.extend_args(workdir, evaluated), cache)
    state['extend_command'] = spec.shell(args, 'python')
    if not _trained(evaluated):
      rc, seconds = _call(args, storage.join(workdir, 'extend.log'))
      state['extend_seconds'] = state.get('extend_seconds', 0.0) + seconds
      if rc or not _trained(evaluated):
        return 'extension ' + (_failure(storage.join(workdir, 'extend.log'), rc) if rc else
                               'interrupted')
  for label in experiment.long_context:
    if report.read_long_context(evaluated, label) is not None:
      continue
    rc, seconds = _call(_cached(experiment.long_context_args(evaluated, label), cache),
                        storage.join(workdir, 'long_context.log'))
    state['long_context_seconds'] = state.get('long_context_seconds', 0.0) + seconds
    if rc:
      return f'long-context evaluation {label!r} failed (exit {rc})'
  return 'done'


_INITIALISED = re.compile(r'^Initialised from .* \(step (\d+)\)', re.M)  # training/loop.py


def _set_aside_stale_extension(workdir: str, extended: str):
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
  _log(f'{storage.basename(workdir)}: its extension started from step {started[-1]}, the run is '
       f'now at step {latest}: moved to {aside}, extending again')


def _now() -> str:
  return datetime.datetime.now().isoformat(timespec='seconds')


def git_commit() -> str:
  """The checkout's commit, marked when the working tree has uncommitted changes.

  docs/ is left out: the runner writes results.md and the figures there itself.
  """
  def git(*a):
    return subprocess.run(['git', *a], cwd=spec.REPO, capture_output=True, text=True).stdout
  commit = git('rev-parse', '--short', 'HEAD').strip() or 'unknown'
  changed = git('status', '--porcelain', '--', '.', ':(exclude)docs').strip()
  return commit + (' (with uncommitted changes)' if changed else '')


def print_commands(experiment, runs, out: str, args):
  cache = cache_dir(out, args.compilation_cache)
  for run in runs:
    if args.print_commands == 'main':
      workdir = _workdir(out, run)
      steps = [run.train_args(experiment.scale, workdir), experiment.analyze_args(workdir)]
      evaluated = report.extended_dir(workdir) if experiment.extend else workdir
      if experiment.extend:
        steps.append(experiment.extend_args(workdir, evaluated))
      steps += [experiment.long_context_args(evaluated, label)
                for label in experiment.long_context]
      line = ' && '.join(spec.shell(_cached(a, cache), args.python) for a in steps)
    else:
      option = ['--compilation-cache', args.compilation_cache] if args.compilation_cache else []
      line = spec.shell(['-m', 'experiments.run', experiment.path, '--out', out, '--only',
                         run.name] + option, args.python)
    print(f'cd {spec.REPO} && {line}')


def run_all(experiment, runs, out: str, jobs: int, batch_seeds: bool = False,
            cache: str = '') -> list[dict]:
  """Executes `runs` with `jobs` units side by side (a unit: one run, or the seeds of a group
  trained as one program, then analysed one by one); prints one line per finished run, and the
  wall time against the training arithmetic of the runs trained now."""
  done = [0]

  def one(run, t0, batched=False):
    before = report.read_runner(_workdir(out, run))
    trained_before = before.get('status') in ('done', 'diverged')
    state = execute(experiment, run, out, cache)
    if not trained_before and state['status'] == 'done':
      if batched:   # its rows time the seeds' shared step: not a single run's arithmetic
        arithmetic[1] += 1
      elif before.get('attempts'):  # resumed: only its last steps trained now
        arithmetic[2] += 1
      else:
        arithmetic[0] += report.step_arithmetic(report.read(run, _workdir(out, run)).rows)
    done[0] += 1
    _log(f'[{done[0]}/{len(runs)}] {run.name}: {state["status"]} ({(time.time() - t0) / 60:.1f} '
         f'min now, {state.get("train_seconds", 0) / 60:.1f} min training in all)')
    return state

  def unit(members):
    t0 = time.time()
    try:
      if len(members) > 1:
        rc = train_seeds(experiment, members, out, cache)
        _log(f'{members[0].group}: seeds {", ".join(str(r.seed) for r in members)} trained as '
             f'one program ({"done" if rc == 0 else f"exit {rc}"}, '
             f'{(time.time() - t0) / 60:.1f} min)')
      return [one(r, t0, len(members) > 1) for r in members]
    except _Stopped:
      return []

  # seconds of the single runs trained from scratch now; batched runs; resumed runs
  arithmetic, start = [0.0, 0, 0], time.time()
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    states = {s['run']: s for ss in pool.map(unit, _units(experiment, runs, out, batch_seeds))
              for s in ss}
  if arithmetic[0] and not arithmetic[1] and not arithmetic[2]:
    wall = time.time() - start
    _log(f'Runner: {wall:.0f} s for the runs trained now, whose training arithmetic (steps x '
         f'median step time) is {arithmetic[0]:.0f} s: {wall / arithmetic[0]:.2f}x.')
  elif arithmetic[1]:
    _log(f'Runner: {time.time() - start:.0f} s ({arithmetic[1]} runs trained with their seeds '
         'batched: their rows time the shared step, so there is no single-run arithmetic to '
         'compare with).')
  elif arithmetic[2]:
    _log(f'Runner: {time.time() - start:.0f} s ({arithmetic[2]} runs resumed from a checkpoint: '
         'no whole-run arithmetic to compare with).')
  return [states.get(r.name) or {'run': r.name, 'status': 'stopped'} for r in runs]


def _header(experiment, results, wall_seconds: float) -> str:
  train = sum(r.runner.get(k, 0) for r in results for k in report.SECONDS)
  path = os.path.abspath(experiment.path)
  if path.startswith(spec.REPO + os.sep):
    path = os.path.relpath(path, spec.REPO)
  command = spec.shell(['-m', 'experiments.run', path], 'python')
  return (f'## {experiment.title}\n\n{experiment.description}\n\n'
          f'Command: `{command}` (scale `{experiment.scale}`, {len(experiment.runs)} runs)  \n'
          f'Commit: {_commits(results)}, {_now()}  \n'
          f'Wall time: {train / 60:.1f} min of training and evaluation summed over runs; '
          f'this invocation {wall_seconds / 60:.1f} min.').replace('\n\n\n', '\n\n')


def _commits(results) -> str:
  """The commit the table is made at, and the ones its runs were trained at when they differ."""
  now = git_commit()
  trained = sorted({r.runner['git_commit'] for r in results if r.runner.get('git_commit')})
  if not trained or trained == [now]:
    return f'`{now}`'
  return f'`{now}` (runs trained at {", ".join(f"`{c}`" for c in trained)})'


def _publish(experiment, out: str, results_path: str, body: str):
  """Copies the figures next to results_path (figures/<name>/) and writes the section."""
  fig_dir = os.path.join(os.path.dirname(os.path.abspath(results_path)), 'figures',
                         experiment.name)
  os.makedirs(fig_dir, exist_ok=True)
  links = []
  for name in report.figure_names(experiment):
    with open(os.path.join(fig_dir, name), 'wb') as f:    # OUT may be on object storage
      f.write(storage.read_bytes(storage.join(out, name)))
    links.append(f'![{name}](figures/{experiment.name}/{name})')
  report.update_section(results_path, experiment.name, body + '\n' + '\n'.join(links) + '\n')


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  t0 = time.time()
  try:
    experiment = spec.load(args.experiment, report.METRICS)
  except spec.ExperimentError as e:
    print(f'Error: {e}', file=sys.stderr)
    return 2
  out = storage.abspath(args.out or os.path.join(spec.REPO, 'experiments', 'out',
                                                experiment.name))
  storage.check_reachable(out, write=True)   # a missing bucket or credentials: before any run
  runs = experiment.runs
  if args.only:
    names = set(args.only.split(','))
    unknown = names - {r.name for r in runs}
    if unknown:
      print(f'Error: no runs named {sorted(unknown)}; the runs are '
            f'{", ".join(r.name for r in runs)}.', file=sys.stderr)
      return 2
    runs = [r for r in runs if r.name in names]
  if args.print_commands:
    try:
      print_commands(experiment, runs, out, args)
      sys.stdout.flush()
    except BrokenPipeError:   # `| head`: the reader has what it wanted
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
  previous = signal.signal(signal.SIGTERM, _on_sigterm)
  try:
    if args.reanalyze:
      states = reanalyze(experiment, runs, out, cache_dir(out, args.compilation_cache))
    else:
      states = [] if args.report_only else run_all(experiment, runs, out, args.jobs,
                                                   args.batch_seeds,
                                                   cache_dir(out, args.compilation_cache))
  except _Stopped:
    states = []
  finally:
    signal.signal(signal.SIGTERM, previous)
  if _STOPPING.is_set():
    _STOPPING.clear()
    print('Stopped by SIGTERM: the runs in progress saved a checkpoint and stopped; the same '
          'command resumes them.', file=sys.stderr)
    return 143
  if args.only:  # one task of an array: the report is made once all have finished
    return 0 if all(s['status'] in ('done', 'diverged') for s in states) else 1
  results = [report.read(r, _workdir(out, r), experiment) for r in experiment.runs]
  body = report.write(experiment, results, out, _header(experiment, results, time.time() - t0))
  print(body)
  print(f'Table and figures in {out}')
  if args.results:
    _publish(experiment, out, args.results, body)
    print(f'Section {experiment.name!r} written into {args.results}')
  failed = [s for s in states if s['status'] not in ('done', 'diverged')]
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
