"""The analysis of one checkpoint: options, the report and its figures (`--mode=analyze`).

  python main.py --mode=analyze --workdir=runs/g1
  python main.py --mode=analyze --workdir=runs/g1 --config.data.val_batches=16   # more batches

modes/analyze.py opens the run (its saved config with the evaluation overrides, runs/rundir.py)
and evaluates the checkpoint on held-out batches (training/evaluate.py); this module turns the
pooled statistics into RUN/analysis/report.json (see metrics.report for the keys),
attention_maps.npz and the figures f_attn.png, m_act.png, gate.png (gated runs), sparsity.png,
attention_maps.png.
"""

import io
import json

import numpy as np

from gated_attention import storage
from gated_attention.analysis import metrics, plots
from gated_attention.analysis.attention_maps import token_labels
from gated_attention.config import schema
from gated_attention.errors import UserError
from gated_attention.model import gating

# Analysis options: the `analysis` section of the config (schema.Analysis), set with
# --config.analysis.<name>=... or `options=`; 0 / '' / -1 mean "the run's own value".
DEFAULT_OPTIONS = schema.defaults(schema.Analysis)
DEFINITIONS = {
    'f_attn': 'attention probability to position 0, mean over heads and queries 1..T-1',
    'm_act_mean': 'mean over layers of max |h| of the layer output (after the FFN residual)',
    'gate_score_mean': 'mean gate score act(XW), averaged over layers',
    'linear_gate_score_mean': 'a hybrid\'s Gated DeltaNet layers: mean output-gate score '
                              'SiLU(z), averaged over those layers',
    'attention_layers': 'a hybrid: the layers (of num_layers) that attend; f_attn, gate and '
                        'sparsity have one entry per attention layer, m_act one per layer',
    'sparsity': 'SDPA output Y before/after the gate: mean |Y|, fraction |Y| < 1e-2, 1e-3',
    'ppl': 'exp(mean token cross-entropy) on the held-out batches',
    'stability': 'loss spikes, skipped non-finite steps and rollbacks of the training run '
                 '(gated_attention/training/stability.py)',
}


class AnalysisError(UserError, ValueError):
  """An analysis option or setting that cannot work; the message names it."""


def options(config, overrides: dict, given: dict | None, saved=None) -> dict:
  """The analysis options: defaults, then the run's `saved` config's `analysis` section (an
  import of a paper scale records one sequence of one batch there), the given config's where it
  sets one (not 0 / ''), the command line's --config.analysis.* overrides and `given`; unknown
  names refused."""
  opts = dict(DEFAULT_OPTIONS)
  if saved is not None and 'analysis' in saved:
    opts.update({k: v for k, v in saved.analysis.items() if k in opts})
  if config is not None and 'analysis' in config:
    opts.update({k: v for k, v in config.analysis.items() if k in opts
                 and (saved is None or v != DEFAULT_OPTIONS[k])})
  opts.update({k.split('.', 1)[1]: v for k, v in overrides.items() if k.startswith('analysis.')})
  opts.update(given or {})
  unknown = set(opts) - set(DEFAULT_OPTIONS)
  if unknown:
    raise AnalysisError(f'Unknown analysis options {sorted(unknown)}; known: '
                        f'{", ".join(DEFAULT_OPTIONS)}.')
  return opts


def map_layers(spec, num_layers: int) -> list[int]:
  """The layers whose attention maps are drawn: `spec` ('0,-1', a list, or '': first, middle,
  last), counted over the attention layers (`num_layers` of them; a hybrid's report names their
  model layers in attention_layers)."""
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


def write_json(path: str, obj):
  """`obj` as JSON at `path` (local or gs://), written whole: readers never see a part."""
  storage.write(path, json.dumps(obj, indent=1, allow_nan=False))


def build_report(result, cfg, workdir, step, tokenizer, map_layers_spec, metrics_rows, *,
                 single: bool = True) -> dict:
  """metrics.report of the evaluation (training/evaluate.py), with the run's identity, the
  training run's stability (`metrics_rows`: every row of its metrics.jsonl) and the definitions.
  `single`: one process (the token texts of the M-Act peaks need this process's inputs)."""
  report = metrics.report(result.stats, loss=result.loss, tokens=result.tokens,
                          batch_size=cfg.train.batch_size,
                          inputs=result.inputs if single else None)
  if report['gate'] is not None:
    activation = gating.GateSpec.from_config(cfg.model.gate).activation
    report['gate']['hist_range'] = list(gating.HIST_RANGE[activation])
  if single:
    for w in report['m_act_where'].values():
      w['token_text'] = token_labels(tokenizer, w['token_id'])
  num_attention = len(report['f_attn'])   # the attention layers (every layer but a hybrid's)
  types = list(cfg.model.get('layer_types') or ())
  if types:                # a hybrid: which layers the attention statistics are of
    report.update(num_layers=len(types), layer_types=types,
                  attention_layers=[i for i, t in enumerate(types) if t == 'full_attention'],
                  linear_attention_layers=[i for i, t in enumerate(types)
                                           if t == 'linear_attention'])
  report.update(
      workdir=storage.abspath(workdir), step=step, variant=cfg.get('variant', ''),
      scale=cfg.get('scale', ''), gate_spec=cfg.model.gate.to_dict(),
      seq_len=int(cfg.data.seq_len), batch_size=int(cfg.train.batch_size),
      tokenizer=tokenizer.name,
      attn_map_layers=map_layers(map_layers_spec, num_attention),
      stability=metrics.stability(metrics_rows),
      definitions=DEFINITIONS)
  return report


def write(report, result, tokenizer, out_dir, *, report_file: str, single: bool = True):
  """The report (as `report_file`: runs/rundir.py REPORT_FILE), the figures and
  attention_maps.npz into `out_dir` (by process 0)."""
  storage.makedirs(out_dir)
  title = f'{report["variant"]} step {report["step"]}'
  figures = {'f_attn.png': plots.f_attn_figure(report, title=f'F-Attn: {title}'),
             'm_act.png': plots.m_act_figure(report),
             'sparsity.png': plots.sparsity_figure(report)}
  if report['gate'] is not None:
    figures['gate.png'] = plots.gate_figure(report)
  if report.get('linear_gate') is not None:
    figures['linear_gate.png'] = plots.linear_gate_figure(report)
  maps = np.asarray(result.stats['attn_map'])
  n = maps.shape[-1]
  tokens = result.inputs[0][0, :n] if single else np.zeros(0, np.int32)
  labels = token_labels(tokenizer, tokens) if single else None
  figures['attention_maps.png'] = plots.attention_maps_figure(
      maps, report['attn_map_layers'], labels, names=report.get('attention_layers'),
      title=f'{title}: head-averaged attention, held-out sample 0')
  for name, fig in figures.items():
    plots.save(fig, storage.join(out_dir, name))
  npz = io.BytesIO()
  np.savez_compressed(npz, maps=maps.astype(np.float32), tokens=tokens)
  storage.write(storage.join(out_dir, 'attention_maps.npz'), npz.getvalue())
  report['figures'] = sorted(figures)
  write_json(storage.join(out_dir, report_file), report)
