"""Runs an experiment file: trains every run, analyses it, writes the table and the figures.
(The command line and the schedule of runs; one run's steps are running.py's, the tables and
figures tables.py's, figures.py's and sections.py's.)

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
import os
import signal
import sys
import time

from experiments import processes, rundata, running, sections, spec
from experiments.processes import log
from gated_attention import storage


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


def print_commands(experiment, runs, out: str, args):
  cache = running.cache_dir(out, args.compilation_cache)
  for run in runs:
    if args.print_commands == 'main':
      workdir = running.run_dir(out, run)
      steps = [run.train_args(experiment.scale, workdir), experiment.analyze_args(workdir)]
      evaluated = rundata.extended_dir(workdir) if experiment.extend else workdir
      if experiment.extend:
        steps.append(experiment.extend_args(workdir, evaluated))
      steps += [experiment.long_context_args(evaluated, label)
                for label in experiment.long_context]
      line = ' && '.join(spec.shell(running.cached(a, cache), args.python) for a in steps)
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
    before = rundata.read_runner(running.run_dir(out, run))
    trained_before = before.get('status') in ('done', 'diverged')
    state = running.execute(experiment, run, out, cache)
    if not trained_before and state['status'] == 'done':
      if batched:   # its rows time the seeds' shared step: not a single run's arithmetic
        arithmetic[1] += 1
      elif before.get('attempts'):  # resumed: only its last steps trained now
        arithmetic[2] += 1
      else:
        arithmetic[0] += rundata.step_arithmetic(rundata.read(run, running.run_dir(out, run)).rows)
    done[0] += 1
    log(f'[{done[0]}/{len(runs)}] {run.name}: {state["status"]} ({(time.time() - t0) / 60:.1f} '
        f'min now, {state.get("train_seconds", 0) / 60:.1f} min training in all)')
    return state

  def unit(members):
    t0 = time.time()
    try:
      if len(members) > 1:
        rc = running.train_seeds(experiment, members, out, cache)
        log(f'{members[0].group}: seeds {", ".join(str(r.seed) for r in members)} trained as '
            f'one program ({"done" if rc == 0 else f"exit {rc}"}, '
            f'{(time.time() - t0) / 60:.1f} min)')
      return [one(r, t0, len(members) > 1) for r in members]
    except processes.Stopped:
      return []

  # seconds of the single runs trained from scratch now; batched runs; resumed runs
  arithmetic, start = [0.0, 0, 0], time.time()
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    todo = running.units(experiment, runs, out, batch_seeds)
    states = {s['run']: s for ss in pool.map(unit, todo) for s in ss}
  if arithmetic[0] and not arithmetic[1] and not arithmetic[2]:
    wall = time.time() - start
    log(f'Runner: {wall:.0f} s for the runs trained now, whose training arithmetic (steps x '
        f'median step time) is {arithmetic[0]:.0f} s: {wall / arithmetic[0]:.2f}x.')
  elif arithmetic[1]:
    log(f'Runner: {time.time() - start:.0f} s ({arithmetic[1]} runs trained with their seeds '
        'batched: their rows time the shared step, so there is no single-run arithmetic to '
        'compare with).')
  elif arithmetic[2]:
    log(f'Runner: {time.time() - start:.0f} s ({arithmetic[2]} runs resumed from a checkpoint: '
        'no whole-run arithmetic to compare with).')
  return [states.get(r.name) or {'run': r.name, 'status': 'stopped'} for r in runs]


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  t0 = time.time()
  try:
    experiment = spec.load(args.experiment, rundata.METRICS)
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
  previous = signal.signal(signal.SIGTERM, processes.on_sigterm)
  try:
    if args.reanalyze:
      states = running.reanalyze(experiment, runs, out,
                                 running.cache_dir(out, args.compilation_cache))
    else:
      states = [] if args.report_only else run_all(experiment, runs, out, args.jobs,
                                                   args.batch_seeds,
                                                   running.cache_dir(out, args.compilation_cache))
  except processes.Stopped:
    states = []
  finally:
    signal.signal(signal.SIGTERM, previous)
  if processes.STOPPING.is_set():
    processes.STOPPING.clear()
    print('Stopped by SIGTERM: the runs in progress saved a checkpoint and stopped; the same '
          'command resumes them.', file=sys.stderr)
    return 143
  if args.only:  # one task of an array: the report is made once all have finished
    return 0 if all(s['status'] in ('done', 'diverged') for s in states) else 1
  results = [rundata.read(r, running.run_dir(out, r), experiment) for r in experiment.runs]
  header = sections.header(experiment, results, time.time() - t0)
  body = sections.write(experiment, results, out, header)
  print(body)
  print(f'Table and figures in {out}')
  if args.results:
    sections.publish(experiment, out, args.results, body)
    print(f'Section {experiment.name!r} written into {args.results}')
  failed = [s for s in states if s['status'] not in ('done', 'diverged')]
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
