"""`--mode=analyze`: the attention-sink analysis of a run's latest checkpoint on held-out data.

  python main.py --mode=analyze --workdir=runs/g1
  python main.py --mode=analyze --workdir=runs/g1 --config.data.val_batches=16   # more batches

The run's own config (RUN/config.json) is used, so --workdir is all it needs; command-line
overrides (--config.X=...) are applied on top of it, for the things that may change without
changing the checkpoint: the number and size of the held-out batches (data.val_batches,
train.batch_size), data.seq_len, the data source, the mesh and model.dtype / remat /
attention_impl. An override of the model's structure or the tokenizer is refused. The --config
file itself is ignored (a note is printed when its model differs from the run's).

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

from gated_attention import checkpoint as ckpt_lib
from gated_attention import gating
from gated_attention import train as train_lib
from gated_attention.analysis import metrics, plots, runs

# Analysis options; set them with `options=` (Python) or, when the config has an `analysis`
# section, with --config.analysis.<name>=... . 0 / '' / -1 mean "the run's own value".
DEFAULT_OPTIONS = dict(
    num_batches=0,          # held-out batches (0: data.val_batches, after overrides)
    batch_size=0,           # sequences per batch (0: train.batch_size, after overrides)
    attn_map_layers='',     # comma-separated layer indices for attention_maps.png ('' : first, middle, last)
    step=-1,                # checkpoint step (-1: the latest)
)
# Config fields an override may change without touching what the checkpoint holds.
_MODEL_FREE = ckpt_lib._MODEL_FREE  # pylint: disable=protected-access


class AnalysisError(ValueError):
  pass


def _cli_overrides() -> tuple[dict, bool]:
  """(--config.X=value overrides given on the command line, whether --config was given)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fl = flags.FLAGS
  if not fl.is_parsed() or 'config' not in fl:
    return {}, False
  flag = fl['config']
  return dict(getattr(flag, 'override_values', None) or {}), bool(flag.present)


def _check_override(path: str):
  parts = path.split('.')
  if parts[0] == 'model' and parts[1] not in _MODEL_FREE:
    raise AnalysisError(
        f'--config.{path} changes the model, which must match the checkpoint; the analysis uses '
        f'the run\'s saved config (only model.{", model.".join(_MODEL_FREE)} may be overridden).')
  if path == 'data.tokenizer':
    raise AnalysisError('--config.data.tokenizer must stay the run\'s tokenizer (the model was '
                        'trained on its token ids).')


def analysis_config(saved, overrides: dict) -> ml_collections.ConfigDict:
  """The saved config with `overrides` ({'data.val_batches': 8, ...}) applied; checked."""
  cfg = ml_collections.ConfigDict(saved.to_dict())
  flat = {}
  for path, value in overrides.items():
    if path.split('.')[0] == 'analysis':
      continue
    _check_override(path)
    flat[path] = value
  try:
    cfg.update_from_flattened_dict(flat)
  except (KeyError, AttributeError, TypeError) as e:
    raise AnalysisError(f'Cannot apply the overrides {flat} to the run\'s config: {e}') from e
  return cfg


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
  saved = runs.read_config(workdir)
  steps = runs.checkpoint_steps(workdir)
  if not steps:
    raise AnalysisError(f'{workdir!r} has no finished checkpoint under checkpoints/: nothing to '
                        'analyse. Train first (checkpoints are written every '
                        'config.train.checkpoint_every steps and at the end).')
  config_given = False
  if overrides is None:
    overrides, config_given = _cli_overrides() if config is not None else ({}, False)
  opts = _options(config, overrides, options)
  if config_given and config is not None:
    diffs = ckpt_lib.config_differences(saved.to_dict(), json.loads(config.to_json()))
    if diffs:
      print(f'Note: analysing with the run\'s saved config ({saved.variant}); the --config file '
            f'differs from it ({diffs[0]}{"..." if len(diffs) > 1 else ""}) and is ignored.')
  cfg = analysis_config(saved, overrides)
  step = steps[-1] if int(opts['step']) < 0 else int(opts['step'])
  if step not in steps:
    raise AnalysisError(f'{workdir!r} has no checkpoint at step {step}; it has {steps}.')
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

  import input_pipeline  # pylint: disable=g-import-not-at-top
  data = input_pipeline.build_data(
      cfg.data, global_batch_size=cfg.train.batch_size, seed=cfg.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  mesh = runs.build_mesh(cfg)
  setup = train_lib.Setup(cfg, mesh)
  params = runs.restore_params(setup, workdir, step)

  auxes, shapes, inputs = [], [], []
  loss_sum = tokens = 0.0
  with jax.set_mesh(mesh):
    for local in data.val_batches():
      batch = setup.global_batch(local)
      out = jax.device_get(setup.eval_step(params, batch))
      loss_sum += float(out['loss_sum'])
      tokens += float(out['tokens'])
      auxes.append(jax.device_get(setup.inspect_step(params, batch)))
      shapes.append(tuple(batch['inputs'].shape))
      inputs.append(np.asarray(local['inputs']))
  if not auxes:
    raise AnalysisError('The held-out split produced no batches; check data.val_fraction.')
  loss = loss_sum / max(tokens, 1.0)
  pooled = metrics.pool(auxes, shapes)
  single = jax.process_count() == 1
  report = metrics.report(pooled, loss=loss, tokens=tokens, batch_size=cfg.train.batch_size,
                          inputs=inputs if single else None)
  num_layers = report['num_layers']
  map_layers = _map_layers(opts['attn_map_layers'], num_layers)
  gate_spec = gating.GateSpec.from_config(cfg.model.gate)
  if report['gate'] is not None:
    report['gate']['hist_range'] = list(gating.HIST_RANGE[gate_spec.activation])
  if single:
    for w in report['m_act_where'].values():
      w['token_text'] = runs.token_labels(data.tokenizer, w['token_id'])
  report.update(
      workdir=os.path.abspath(workdir), step=step, variant=saved.get('variant', ''),
      scale=saved.get('scale', ''), gate_spec=cfg.model.gate.to_dict(),
      seq_len=int(cfg.data.seq_len), batch_size=int(cfg.train.batch_size),
      tokenizer=data.tokenizer.name, attn_map_layers=map_layers,
      definitions={
          'f_attn': 'attention probability to position 0, mean over heads and queries 1..T-1',
          'm_act_mean': 'mean over layers of max |h| of the layer output (after the FFN residual)',
          'gate_score_mean': 'mean gate score act(XW), averaged over layers',
          'sparsity': 'SDPA output Y before/after the gate: mean |Y|, fraction |Y| < 1e-2, 1e-3',
          'ppl': 'exp(mean token cross-entropy) on the held-out batches',
      })

  out_dir = out_dir or os.path.join(workdir, runs.ANALYSIS_DIR)
  if jax.process_index() == 0:
    os.makedirs(out_dir, exist_ok=True)
    title = f'{report["variant"]} step {step}'
    figures = {'f_attn.png': plots.f_attn_figure(report, title=f'F-Attn: {title}'),
               'm_act.png': plots.m_act_figure(report),
               'sparsity.png': plots.sparsity_figure(report)}
    if report['gate'] is not None:
      figures['gate.png'] = plots.gate_figure(report)
    maps = np.asarray(pooled['attn_map'])
    n = maps.shape[-1]
    labels = runs.token_labels(data.tokenizer, inputs[0][0, :n]) if single else None
    figures['attention_maps.png'] = plots.attention_maps_figure(
        maps, map_layers, labels, title=f'{title}: head-averaged attention, held-out sample 0')
    for name, fig in figures.items():
      plots.save(fig, os.path.join(out_dir, name))
    np.savez_compressed(os.path.join(out_dir, 'attention_maps.npz'), maps=maps.astype(np.float32),
                        tokens=inputs[0][0, :n] if single else np.zeros(0, np.int32))
    report['figures'] = sorted(figures)
    _write_json(os.path.join(out_dir, 'report.json'), report)
  fmt = lambda x, spec: '-' if x is None else format(x, spec)  # noqa: E731
  print(f'{report["variant"]} step {step}: F-Attn {fmt(report["f_attn_mean"], ".3f")}, '
        f'M-Act {fmt(report["m_act_mean"], ".1f")}, gate score '
        f'{fmt(report["gate_score_mean"], ".3f")}, ppl {fmt(report["ppl"], ".3f")} '
        f'({report["num_batches"]} batches of {cfg.train.batch_size} x {cfg.data.seq_len}, '
        f'{time.time() - t0:.0f}s) -> {os.path.join(out_dir, "report.json")}', flush=True)
  if not math.isfinite(loss):
    print('Warning: the validation loss is not finite.')
  return report
