"""Reading runs: what each run left behind (Result), and the per-run values the tables show.

Each run directory holds what main.py writes (config.json, metrics.jsonl, analysis/report.json)
and the runner's runner.json (status, commands, wall times). `read` gathers them into a Result;
METRICS names each value a table column can show (its heading, how to get it from a Result, its
format). Nothing here trains, analyses or writes.
"""

import dataclasses
import json

import numpy as np

from experiments import scaling
from gated_attention import storage
from gated_attention.analysis import metrics as metrics_lib
from gated_attention.runs import rundir as runs_lib


RUNNER_FILE = 'runner.json'


EXTENDED_DIR = 'extended'  # a run continued at a longer context (EXTEND), inside the run's dir


SECONDS = ('train_seconds', 'analyze_seconds', 'extend_seconds', 'long_context_seconds')


@dataclasses.dataclass
class Result:
  """What one run left behind; `report` is None until its analysis has run."""
  run: object  # spec.Run
  runner: dict
  report: dict | None
  rows: list[dict]
  long_context: dict = dataclasses.field(default_factory=dict)  # label -> long-context report
  size: dict = dataclasses.field(default_factory=dict)  # scaling.run_size of a finished run

  @property
  def status(self) -> str:
    return self.runner.get('status', 'missing')


def step_arithmetic(rows: list[dict]) -> float:
  """A run's training arithmetic in seconds: its last step times the median step time of its
  train rows (the first row's window, which holds the compile, left out); 0 without rows."""
  train = [r for r in rows if r.get('split') == 'train' and r.get('step_time')]
  if not train:
    return 0.0
  times = sorted(r['step_time'] for r in (train[1:] or train))
  return train[-1]['step'] * times[len(times) // 2]


def _last_train_loss(res: Result):
  losses = [r['loss'] for r in res.rows if r.get('split') == 'train' and r.get('loss') is not None]
  return losses[-1] if losses else None


def from_report(key, reduce=None):
  def get(res: Result):
    if res.report is None or res.report.get(key) is None:
      return None
    value = res.report[key]
    return reduce(value) if reduce else value
  return get


def _seconds(key):
  return lambda res: res.runner[key] / 60 if res.runner.get(key) is not None else None


SINK_F_ATTN = 0.3  # a run "has a sink" when some layer's F-Attn reaches this (Gu et al. 2025's


_SITE_ORDER = metrics_lib.M_ACT_SITES  # the order in which a layer writes them


def m_act_origin(report: dict, share: float = 0.5) -> dict | None:
  """Where a run's largest activation is born: the first (layer, site) in forward order whose
  max |h| reaches `share` of the run's largest over all layers and sites, with the token there
  (position, and its text when the analysis recorded it). The residual stream then carries it,
  so the paper's M-Act (the layer outputs) shows it at every later layer."""
  m_act, where = report.get('m_act') or {}, report.get('m_act_where') or {}
  sites = [s for s in _SITE_ORDER if s in m_act]
  if not sites:
    return None
  values = [(layer, site, m_act[site][layer]) for layer in range(len(m_act[sites[0]]))
            for site in sites if m_act[site][layer] is not None]
  if not values:
    return None
  peak = max(v for _, _, v in values)
  layer, site, value = next(x for x in values if x[2] >= share * peak)
  w = where.get(site, {})
  token = w['token'][layer] if 'token' in w else None
  text = w['token_text'][layer] if 'token_text' in w else None
  return {'layer': layer, 'site': site, 'value': value, 'peak': peak, 'token': token,
          'token_text': text, 'first_token': token == 0}


def _origin(key):
  def get(res: Result):
    o = m_act_origin(res.report) if res.report else None
    return None if o is None else o[key]
  return get


def _origin_label(res: Result):
  o = m_act_origin(res.report) if res.report else None
  return None if o is None else f'L{o["layer"]} {o["site"]}'


def _m_act_ratio(res: Result):
  """The largest over layers of max |h| / median |h| at the layer output (the paper's M-Act
  site): how far the peak stands out of the layer's typical activation."""
  rep = res.report or {}
  site = metrics_lib.M_ACT_PAPER_SITE
  maxes, medians = (rep.get('m_act') or {}).get(site), (rep.get('m_act_median') or {}).get(site)
  if not maxes or not medians:
    return None
  return max(m / d for m, d in zip(maxes, medians) if m is not None and d)


def _f_attn_max_during(res: Result):
  """The largest F-Attn of any layer at any of the training loop's evaluations: a sink that
  formed and went away shows here and not in the final analysis."""
  values = [max(r['f_attn']) for r in res.rows
            if r.get('split') == 'val' and isinstance(r.get('f_attn'), list) and r['f_attn']]
  return max(values) if values else None


def _has_sink(res: Result):
  f = from_report('f_attn', max)(res)
  return None if f is None else float(f >= SINK_F_ATTN)


def _sink_layers(res: Result):
  """Per layer, 1.0 where that layer's final F-Attn reaches SINK_F_ATTN: a gate can move the sink
  to a later layer instead of removing it, which the largest-layer count does not show."""
  f = from_report('f_attn')(res)
  return None if f is None else [float(x is not None and x >= SINK_F_ATTN) for x in f]


def _sink_layer(res: Result):
  """Where the seed's sink is: the layer of its largest F-Attn if that reaches SINK_F_ATTN
  ('none' otherwise)."""
  f = from_report('f_attn')(res)
  if not f:
    return None
  layer = int(np.argmax([-1.0 if x is None else x for x in f]))
  named = (res.report or {}).get('attention_layers')   # a hybrid: f_attn is per attention layer
  name = named[layer] if named and len(named) == len(f) else layer
  return f'L{name}' if f[layer] is not None and f[layer] >= SINK_F_ATTN else 'none'


def formed_at(rows: list[dict], threshold: float) -> int | None:
  """The step of a run's first evaluation whose validation loss is below `threshold` (None:
  none is)."""
  return next((r['step'] for r in rows if r.get('split') == 'val'
               and r.get('loss') is not None and r['loss'] < threshold), None)


def formed(res: Result, threshold: float) -> bool | None:
  """Whether the run formed the capability: its final validation loss (the analysis's) is below
  `threshold` (None: not analysed)."""
  loss = from_report('loss')(res)
  return None if loss is None else loss < threshold


def _copy_share(res: Result):
  d = (res.report or {}).get('data_description') or {}
  return d.get('trigger_fraction')


# name -> (column heading, value of a Result (float, list for per-layer values, or None), format)
METRICS = {
    'val_loss': ('val loss', from_report('loss'), '.3f'),
    'ppl': ('PPL', from_report('ppl'), '.3f'),
    'train_loss': ('final train loss', _last_train_loss, '.3f'),
    'f_attn_mean': ('F-Attn', from_report('f_attn_mean'), '.3f'),
    'f_attn_max': ('F-Attn max layer', from_report('f_attn', max), '.3f'),
    'f_attn_layers': ('F-Attn per layer', from_report('f_attn'), '.2f'),
    'm_act_mean': ('M-Act', from_report('m_act_mean'), '.1f'),
    'm_act_layers': ('M-Act per layer', from_report('m_act', lambda m: m['ffn_residual']), '.0f'),
    'gate_score_mean': ('gate score', from_report('gate_score_mean'), '.3f'),
    # a hybrid's Gated DeltaNet layers: the mean of their output gate SiLU(z) (analysis/metrics.py)
    'linear_gate_score': ('DeltaNet output gate SiLU(z)', from_report('linear_gate_score_mean'),
                          '.3f'),
    # the gate's sparsity: the share of gate scores below 0.1 (Qiu et al. 2025, Fig. 3)
    'gate_sparse': (f'gate scores {metrics_lib.GATE_FRAC_KEY.replace("frac_below_", "< ")}',
                    from_report('gate', lambda g: g.get(f'{metrics_lib.GATE_FRAC_KEY}_mean')),
                    '.3f'),
    # the guard's spikes as the analysis counts them (metrics.stability, every attempt's rows)
    'loss_spikes': ('loss spikes', from_report('stability', lambda s: s['spikes']), '.1f'),
    'train_minutes': ('train min', _seconds('train_seconds'), '.1f'),
    # seeds with a sink: some layer's F-Attn >= SINK_F_ATTN (a count over the seeds)
    'sink_seeds': (f'seeds with F-Attn >= {SINK_F_ATTN}', _has_sink, 'count'),
    # the synthetic task's measured share of targets that follow a trigger
    'f_attn_max_during': ('F-Attn max during training', _f_attn_max_during, '.3f'),
    'copy_share': ('copy share', _copy_share, '.3f'),
    # per layer: the seeds whose F-Attn there reaches SINK_F_ATTN, with the rate's 95% interval
    'sink_layers': (f'seeds with F-Attn >= {SINK_F_ATTN}, by layer (95% interval)', _sink_layers,
                    'layer_count'),
    'sink_layer': ('sink layer (largest F-Attn)', _sink_layer, 'mode'),
    # a run's size (experiments/scaling.py): non-embedding parameters, tokens and FLOPs trained
    'params': ('non-embedding params', lambda r: r.size.get('params'), '=,.0f'),
    'train_tokens': ('tokens trained', lambda r: r.size.get('tokens'), '=.3g'),
    'train_flops': ('training FLOPs', lambda r: r.size.get('flops'), '=.3g'),
    # the largest activation: the seeds whose peak is born on the first token (BOS), and where
    'm_act_bos': ('M-Act peak on token 0', _origin('first_token'), 'count'),
    'm_act_origin': ('M-Act peak born at', _origin_label, 'mode'),
    'm_act_ratio': ('M-Act / median', _m_act_ratio, '.0f'),
}


SIZE_COLUMNS = {'params', 'train_tokens', 'train_flops'}   # read off the run's saved config


def read_runner(workdir: str) -> dict:
  """The run's runner.json ({} when there is none)."""
  path = storage.join(workdir, RUNNER_FILE)
  if not storage.isfile(path):
    return {}
  return json.loads(storage.read_bytes(path))


def extended_dir(workdir: str) -> str:
  return storage.join(workdir, EXTENDED_DIR)


def read_long_context(workdir: str, label: str) -> dict | None:
  """The --mode=long_context report of `workdir` for the evaluation `label`, if written."""
  return runs_lib.read_long_context(workdir, label)


def read(run, workdir: str, experiment=None) -> Result:
  runner = read_runner(workdir)
  report, long_context, size = None, {}, {}
  if runner.get('status') == 'done':
    report = runs_lib.read_report(workdir)
  if report is not None:
    if experiment is not None and experiment.long_context:
      evaluated = extended_dir(workdir) if experiment.extend else workdir
      long_context = {label: read_long_context(evaluated, label)
                      for label in experiment.long_context}
    if experiment is not None and (experiment.scaling or set(experiment.columns) & SIZE_COLUMNS):
      size = scaling.run_size(runs_lib.read_config(workdir))
  return Result(run, runner, report, runs_lib.read_metrics(workdir), long_context, size)


def by_group(experiment, results: list[Result]) -> dict[str, list[Result]]:
  return {g: [r for r in results if r.run.group == g] for g in experiment.groups()}


def ruler_mean(rep: dict, length) -> float | None:
  """The mean exact match over the tasks that fit at `length` (None if none did)."""
  acc = [a[str(length)] for a in rep['ruler'].values() if a.get(str(length)) is not None]
  return float(np.mean(acc)) if acc else None
