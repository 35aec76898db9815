"""--mode=analyze: the attention-sink analysis of a run's checkpoint on held-out data.

  python main.py --mode=analyze --workdir=runs/g1
  python main.py --mode=analyze --workdir=runs/g1 --config.data.val_batches=16   # more batches

The run's own config (RUN/config.json) is used, so --workdir is all it needs; command-line
overrides (--config.X=...) are applied on top of it, for the things that may change without
changing the checkpoint (runs/rundir.py `evaluation_config`): the number and size of the
held-out batches (data.val_batches, train.batch_size), data.seq_len, the data source, the mesh,
model.dtype / remat / attention_impl and the position encoding (model.rope_base,
model.rope_scaling: YaRN). Overrides of the model's structure or the tokenizer are accepted
when they equal the saved values (so the training command line works as it is) and refused,
all of them listed, when they differ. The --config file itself is ignored (a note is printed
when its model differs from the run's).

Writes RUN/analysis/ (analysis/analyze.py: report.json, attention_maps.npz, the figures), or
--out=DIR for a run that is read-only (checked before any work).
"""

import json
import math
import time

import jax

from gated_attention import input_pipeline
from gated_attention import storage
from gated_attention.analysis import analyze
from gated_attention.runs import rundir
from gated_attention.runs.factory import ModelFactory
from gated_attention.training import evaluate


def _config(saved, config, overrides, opts):
  """The analysis config: the `saved` one with the evaluation overrides and the options."""
  if config is not None:
    diffs = rundir.config_differences(saved.to_dict(), json.loads(config.to_json()))
    if diffs:
      print(f'Note: analysing with the run\'s saved config ({saved.variant}); the --config file '
            f'differs from it ({diffs[0]}{"..." if len(diffs) > 1 else ""}) and is ignored.')
  cfg = rundir.evaluation_config(saved, overrides)
  if opts['num_batches']:
    cfg.data.val_batches = int(opts['num_batches'])
  if opts['batch_size']:
    cfg.train.batch_size = int(opts['batch_size'])
  cfg.train.grad_accum = 1  # the analysis does no training step
  if cfg.data.val_batches < 1:
    raise analyze.AnalysisError('The analysis needs held-out batches: set '
                                '--config.data.val_batches to at least 1.')
  if cfg.data.seq_len < 2:
    raise analyze.AnalysisError('F-Attn needs sequences of at least 2 tokens '
                                '(--config.data.seq_len).')
  return cfg


def run(workdir: str, *, config=None, overrides: dict | None = None,
        options: dict | None = None, out_dir: str | None = None, step: int | None = None) -> dict:
  """Analyses the run in `workdir`; writes `out_dir` (default RUN/analysis); returns the report.

  Args:
    workdir: the run directory.
    config: the command line's config when --config was given, else None. Its model is not
      used (the run's saved config is); its `analysis` section, if it has one, sets options.
    overrides: {'data.val_batches': 8, ...}: the --config.X overrides, applied to the saved
      config (rundir.evaluation_config); `analysis.*` ones set options.
    options: analysis options (analyze.DEFAULT_OPTIONS), e.g. {'attn_map_layers': [0, 3]}.
    out_dir: where to write (default <workdir>/analysis).
    step: the checkpoint (--step; default the latest).
  """
  t0 = time.time()
  overrides = dict(overrides or {})
  saved = rundir.read_config(workdir)  # a missing or unreadable run directory first
  steps = rundir.checkpoint_steps(workdir)   # listed once: the checks below both read it
  if not steps:
    raise analyze.AnalysisError(
        f'{workdir!r} has no finished checkpoint under checkpoints/: nothing to analyse. Train '
        'first (checkpoints are written every config.train.checkpoint_every steps and at the '
        'end).')
  rundir.pick_step(workdir, step, steps)   # a step it lacks: named before any work
  opts = analyze.options(config, overrides, options, saved=saved)
  cfg = _config(saved, config, overrides, opts)
  data = _data(workdir, cfg, out_dir)
  run_ = rundir.load_run(workdir, step, config=cfg)
  return _analyse(workdir, cfg, run_.factory, run_.params, run_.step, data, opts, out_dir, t0)


def _data(workdir, cfg, out_dir):
  """The held-out data of the analysis, after the checks that come before any work: a tokenizer
  to read text with, and somewhere to write."""
  rundir.check_tokenizer(workdir, cfg, 'the analysis (held-out text)')
  if jax.process_index() == 0:   # a read-only run (a mounted bucket, a colleague's folder)
    storage.check_writable(out_dir or rundir.analysis_dir(workdir), 'the analysis',
                           'Pass --out=DIR to write it elsewhere (the run is only read).')
  return input_pipeline.build_data(
      cfg.data, global_batch_size=cfg.train.batch_size, seed=cfg.seed,
      process_index=jax.process_index(), process_count=jax.process_count())


def loaded(run_, *, out_dir: str | None = None) -> dict:
  """The analysis of a run already opened by rundir.load_run (the notebook), from the parameters
  it holds: nothing is restored again (an import of the authors' 1.7B model is 6.9 GB of float32
  weights). At the run's own settings (its saved config's data and `analysis` sections: one
  4096-token sequence for an import of a paper scale), what `--mode=analyze --workdir=RUN`
  writes, to RUN/analysis/ (or `out_dir`)."""
  t0 = time.time()
  workdir = run_.workdir
  saved = rundir.read_config(workdir)
  opts = analyze.options(None, {}, None, saved=saved)
  cfg = _config(saved, None, {}, opts)
  data = _data(workdir, cfg, out_dir)
  factory = run_.factory
  if not ModelFactory.same_model(factory.cfg, cfg):   # the parameters as they are, another jit
    factory = rundir.model_factory(cfg)
  return _analyse(workdir, cfg, factory, run_.params, run_.step, data, opts, out_dir, t0)


def after_training(finished) -> dict:
  """`--mode=train --analyze`: the analysis of a run that has just trained to its last step and
  saved it (training/loop.py `Finished`), in the training process: the parameters in memory
  (the final checkpoint's), its data pipeline and its model factory (the compiled evaluation,
  the mesh), so nothing is restored, rebuilt or imported again. Writes what `--mode=analyze
  --workdir=RUN` writes, the same numbers (tests/test_analysis.py compares them)."""
  t0 = time.time()
  workdir = finished.workdir
  saved = rundir.read_config(workdir)
  opts = analyze.options(None, {}, None, saved=saved)
  cfg = _config(saved, None, {}, opts)
  factory = finished.factory
  if not ModelFactory.same_model(factory.cfg, cfg):
    factory = rundir.model_factory(cfg)
  return _analyse(workdir, cfg, factory, finished.params, finished.step, finished.data, opts,
                  None, t0)


def _analyse(workdir, cfg, factory, params, step, data, opts, out_dir, t0) -> dict:
  """The analysis of `params` (checkpoint `step` of the run in `workdir`) on `data`'s held-out
  batches: report.json, the figures and the attention maps in `out_dir` (default
  RUN/analysis)."""
  result = evaluate.evaluate(factory, params, data.val_batches())
  single = jax.process_count() == 1
  report = analyze.build_report(result, cfg, workdir, step, data.tokenizer,
                                opts['attn_map_layers'],
                                rundir.read_metrics(workdir, every_row=True), single=single)
  if cfg.data.source == 'synthetic':  # the task's measured statistics (copy share, floor)
    report['data_description'] = data.describe()
  out_dir = out_dir or rundir.analysis_dir(workdir)
  if jax.process_index() == 0:
    analyze.write(report, result, data.tokenizer, out_dir, report_file=rundir.REPORT_FILE,
                  single=single)
  fmt = lambda x, spec: '-' if x is None else format(x, spec)  # noqa: E731
  print(f'{report["variant"]} step {step}: F-Attn {fmt(report["f_attn_mean"], ".3f")}, '
        f'M-Act {fmt(report["m_act_mean"], ".1f")}, gate score '
        f'{fmt(report["gate_score_mean"], ".3f")}'
        + (f', DeltaNet output gate {fmt(report["linear_gate_score_mean"], ".3f")} (attention '
           f'layers {report["attention_layers"]})' if report.get('linear_gate') else '')
        + f', ppl {fmt(report["ppl"], ".3f")} '
        f'({report["num_batches"]} batches of {cfg.train.batch_size} x {cfg.data.seq_len}, '
        f'{time.time() - t0:.0f}s) -> {storage.join(out_dir, rundir.REPORT_FILE)}', flush=True)
  if not math.isfinite(result.loss):
    print('Warning: the validation loss is not finite.')
  return report


def main(args):
  run(args.workdir, config=args.config if args.config_given else None, overrides=args.overrides,
      out_dir=args.out or None, step=args.step)
