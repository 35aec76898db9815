"""`--mode=analyze`: the attention-sink analysis of a run's latest checkpoint on held-out data.

  python main.py --mode=analyze --workdir=runs/g1
  python main.py --mode=analyze --workdir=runs/g1 --config.data.val_batches=16   # more batches

The run's own config (RUN/config.json) is used, so --workdir is all it needs; command-line
overrides (--config.X=...) are applied on top of it, for the things that may change without
changing the checkpoint: the number and size of the held-out batches (data.val_batches,
train.batch_size), data.seq_len, the data source, the mesh, model.dtype / remat /
attention_impl and the position encoding (model.rope_base, model.rope_scaling: YaRN). Overrides of the model's structure or the tokenizer are accepted when they equal
the saved values (so the training command line works as it is) and refused, all of them listed,
when they differ. The --config file itself is ignored (a note is printed when its model differs
from the run's).

Writes RUN/analysis/report.json (see metrics.report for the keys), attention_maps.npz and the
figures f_attn.png, m_act.png, gate.png (gated runs), sparsity.png, attention_maps.png.
"""

import json
import math
import os
import time

import jax
import ml_collections
import numpy as np

from configs import base as base_config
from gated_attention.runs import rundir as workdir_lib
from gated_attention.training import evaluate as eval_lib
from gated_attention.model import gating
from gated_attention.training import train as train_lib
from gated_attention.analysis import metrics, plots
from gated_attention.runs import load as runs

# Analysis options: the `analysis` section of the config (configs/base.py), set with
# --config.analysis.<name>=... or `options=`; 0 / '' / -1 mean "the run's own value".
DEFAULT_OPTIONS = base_config.analysis_config().to_dict()
DEFINITIONS = {
    'f_attn': 'attention probability to position 0, mean over heads and queries 1..T-1',
    'm_act_mean': 'mean over layers of max |h| of the layer output (after the FFN residual)',
    'gate_score_mean': 'mean gate score act(XW), averaged over layers',
    'sparsity': 'SDPA output Y before/after the gate: mean |Y|, fraction |Y| < 1e-2, 1e-3',
    'ppl': 'exp(mean token cross-entropy) on the held-out batches',
    'stability': 'loss spikes, skipped non-finite steps and rollbacks of the training run '
                 '(gated_attention/training/stability.py)',
}


class AnalysisError(runs.RunError):
  pass


def _cli_overrides() -> tuple[dict, bool]:
  """(--config.X=value overrides given on the command line, whether --config was given)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fl = flags.FLAGS
  if not fl.is_parsed() or 'config' not in fl:
    return {}, False
  flag = fl['config']
  return dict(getattr(flag, 'override_values', None) or {}), bool(flag.present)


def _fixed(path: str) -> bool:
  """Whether the checkpoint fixes this config field (the model's structure, the tokenizer)."""
  parts = path.split('.')
  return ((parts[0] == 'model' and parts[1] not in workdir_lib.EVAL_FREE)
          or path == 'data.tokenizer')


def _saved_value(saved, path: str):
  node = saved
  for part in path.split('.'):
    node = node[part]
  return node


def analysis_config(saved, overrides: dict) -> ml_collections.ConfigDict:
  """The saved config with `overrides` ({'data.val_batches': 8, ...}) applied. Overrides of
  what the checkpoint fixes must equal the saved values; every one that differs is listed."""
  cfg = ml_collections.ConfigDict(saved.to_dict())
  flat, diffs = {}, []
  for path, value in overrides.items():
    if path.split('.')[0] == 'analysis':
      continue
    if _fixed(path):
      try:
        same = _saved_value(saved, path) == value
      except (KeyError, AttributeError):
        same = False
      if not same:
        diffs.append(path)
      continue
    flat[path] = value
  if diffs:
    raise AnalysisError(
        'These overrides change what the checkpoint fixes (the model, or the tokenizer it was '
        'trained on): ' + ', '.join(f'--config.{p}={overrides[p]!r} (saved: '
                                    f'{_saved_value_or_none(saved, p)!r})' for p in diffs) +
        f'. Drop them; only model.{", model.".join(workdir_lib.EVAL_FREE)} and the data / batch '
        'settings may differ from the run\'s saved config.')
  try:
    cfg.update_from_flattened_dict(flat)
  except (KeyError, AttributeError, TypeError) as e:
    raise AnalysisError(f'Cannot apply the overrides {flat} to the run\'s config: {e}') from e
  return cfg


def _saved_value_or_none(saved, path):
  try:
    return _saved_value(saved, path)
  except (KeyError, AttributeError):
    return None


def _options(config, overrides: dict, options: dict | None) -> dict:
  opts = dict(DEFAULT_OPTIONS)
  if config is not None and 'analysis' in config:
    opts.update({k: v for k, v in config.analysis.items() if k in opts})
  opts.update({k.split('.', 1)[1]: v for k, v in overrides.items() if k.startswith('analysis.')})
  opts.update(options or {})
  unknown = set(opts) - set(DEFAULT_OPTIONS)
  if unknown:
    raise AnalysisError(f'Unknown analysis options {sorted(unknown)}; known: '
                        f'{", ".join(DEFAULT_OPTIONS)}.')
  return opts


def _map_layers(spec, num_layers: int) -> list[int]:
  if spec in ('', None):
    return sorted({0, num_layers // 2, num_layers - 1})
  items = spec.split(',') if isinstance(spec, str) else list(spec)
  layers = []
  for item in items:
    i = int(item)
    if not -num_layers <= i < num_layers:
      raise AnalysisError(f'attn_map_layers: layer {i} is out of range for {num_layers} layers.')
    layers.append(i % num_layers)
  return layers


def _write_json(path: str, obj):
  with open(path + '.tmp', 'w') as f:
    json.dump(obj, f, indent=1, allow_nan=False)
  os.replace(path + '.tmp', path)


def _prepare(config, workdir, overrides, options):
  """(analysis config, options, checkpoint step) from the saved config and the overrides."""
  saved = runs.read_config(workdir)
  if not runs.checkpoint_steps(workdir):
    raise AnalysisError(f'{workdir!r} has no finished checkpoint under checkpoints/: nothing to '
                        'analyse. Train first (checkpoints are written every '
                        'config.train.checkpoint_every steps and at the end).')
  config_given = False
  if overrides is None:
    overrides, config_given = _cli_overrides() if config is not None else ({}, False)
  opts = _options(config, overrides, options)
  if config_given and config is not None:
    diffs = workdir_lib.config_differences(saved.to_dict(), json.loads(config.to_json()))
    if diffs:
      print(f'Note: analysing with the run\'s saved config ({saved.variant}); the --config file '
            f'differs from it ({diffs[0]}{"..." if len(diffs) > 1 else ""}) and is ignored.')
  cfg = analysis_config(saved, overrides)
  step = runs.pick_step(workdir, None if int(opts['step']) < 0 else int(opts['step']))
  if opts['num_batches']:
    cfg.data.val_batches = int(opts['num_batches'])
  if opts['batch_size']:
    cfg.train.batch_size = int(opts['batch_size'])
  cfg.train.grad_accum = 1  # the analysis does no training step
  if cfg.data.val_batches < 1:
    raise AnalysisError('The analysis needs held-out batches: set --config.data.val_batches to '
                        'at least 1.')
  if cfg.data.seq_len < 2:
    raise AnalysisError('F-Attn needs sequences of at least 2 tokens (--config.data.seq_len).')
  return cfg, opts, step


def _report(result, cfg, workdir, step, data, map_layers_spec) -> dict:
  """metrics.report of the evaluation, with the run's identity and the definitions."""
  single = jax.process_count() == 1
  report = metrics.report(result.stats, loss=result.loss, tokens=result.tokens,
                          batch_size=cfg.train.batch_size,
                          inputs=result.inputs if single else None)
  if report['gate'] is not None:
    activation = gating.GateSpec.from_config(cfg.model.gate).activation
    report['gate']['hist_range'] = list(gating.HIST_RANGE[activation])
  if single:
    for w in report['m_act_where'].values():
      w['token_text'] = runs.token_labels(data.tokenizer, w['token_id'])
  report.update(
      workdir=os.path.abspath(workdir), step=step, variant=cfg.get('variant', ''),
      scale=cfg.get('scale', ''), gate_spec=cfg.model.gate.to_dict(),
      seq_len=int(cfg.data.seq_len), batch_size=int(cfg.train.batch_size),
      tokenizer=data.tokenizer.name,
      attn_map_layers=_map_layers(map_layers_spec, report['num_layers']),
      stability=metrics.stability(runs.read_metrics(workdir, every_row=True)),
      definitions=DEFINITIONS)
  return report


def _write(report, result, data, out_dir):
  """report.json, the figures and attention_maps.npz (process 0)."""
  os.makedirs(out_dir, exist_ok=True)
  title = f'{report["variant"]} step {report["step"]}'
  figures = {'f_attn.png': plots.f_attn_figure(report, title=f'F-Attn: {title}'),
             'm_act.png': plots.m_act_figure(report),
             'sparsity.png': plots.sparsity_figure(report)}
  if report['gate'] is not None:
    figures['gate.png'] = plots.gate_figure(report)
  maps = np.asarray(result.stats['attn_map'])
  n = maps.shape[-1]
  single = jax.process_count() == 1
  tokens = result.inputs[0][0, :n] if single else np.zeros(0, np.int32)
  labels = runs.token_labels(data.tokenizer, tokens) if single else None
  figures['attention_maps.png'] = plots.attention_maps_figure(
      maps, report['attn_map_layers'], labels,
      title=f'{title}: head-averaged attention, held-out sample 0')
  for name, fig in figures.items():
    plots.save(fig, os.path.join(out_dir, name))
  np.savez_compressed(os.path.join(out_dir, 'attention_maps.npz'), maps=maps.astype(np.float32),
                      tokens=tokens)
  report['figures'] = sorted(figures)
  _write_json(os.path.join(out_dir, 'report.json'), report)


def run(config, workdir: str, *, overrides: dict | None = None, options: dict | None = None,
        out_dir: str | None = None) -> dict:
  """Analyses the run in `workdir`; writes `out_dir` (default RUN/analysis); returns the report.

  Args:
    config: the command line's config (main.py), or None. Its model is not used (the run's
      saved config is); its `analysis` section, if it has one, sets options.
    workdir: the run directory.
    overrides: {'data.val_batches': 8, ...} applied to the saved config. Default (None): the
      --config.X overrides given on the command line, when flags have been parsed.
    options: analysis options (DEFAULT_OPTIONS), e.g. {'attn_map_layers': [0, 3]}.
    out_dir: where to write (default <workdir>/analysis).
  """
  t0 = time.time()
  cfg, opts, step = _prepare(config, workdir, overrides, options)
  import input_pipeline  # pylint: disable=g-import-not-at-top
  data = input_pipeline.build_data(
      cfg.data, global_batch_size=cfg.train.batch_size, seed=cfg.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  setup = train_lib.Setup(cfg, runs.build_mesh(cfg))
  if int(opts['step']) < 0:     # the latest that verifies (a bad newer one: a warning)
    step, params = runs.restore_latest_params(setup, workdir)
  else:
    params = runs.restore_params(setup, workdir, step)
  result = eval_lib.evaluate(setup, params, data.val_batches())
  report = _report(result, cfg, workdir, step, data, opts['attn_map_layers'])
  out_dir = out_dir or os.path.join(workdir, runs.ANALYSIS_DIR)
  if jax.process_index() == 0:
    _write(report, result, data, out_dir)
  fmt = lambda x, spec: '-' if x is None else format(x, spec)  # noqa: E731
  print(f'{report["variant"]} step {step}: F-Attn {fmt(report["f_attn_mean"], ".3f")}, '
        f'M-Act {fmt(report["m_act_mean"], ".1f")}, gate score '
        f'{fmt(report["gate_score_mean"], ".3f")}, ppl {fmt(report["ppl"], ".3f")} '
        f'({report["num_batches"]} batches of {cfg.train.batch_size} x {cfg.data.seq_len}, '
        f'{time.time() - t0:.0f}s) -> {os.path.join(out_dir, "report.json")}', flush=True)
  if not math.isfinite(result.loss):
    print('Warning: the validation loss is not finite.')
  return report
