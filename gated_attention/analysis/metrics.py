"""Pooling the per-batch analysis statistics over several batches, and the report they make.

The model computes, per batch and per layer (`Transformer.__call__(tokens, inspect=True)`,
stacked to [L, ...] by the scan):
  f_attn_H        [L, H]   attention probability to position 0, mean over the batch and queries
                           1..T-1 (query 0, which can only attend to itself, is excluded; the
                           paper, Qiu et al. 2025 Sec. 4.3, does not say whether it counts it)
  attn_map        [L, n, n] head-averaged probabilities of sample 0, first n <= 128 positions
  gate            {mean, frac_below_0.1: [L], hist: [L, bins] (fractions)}   (gated runs only)
  sdpa_pre_gate / sdpa_post_gate  {abs_mean, frac_below_1e-2, frac_below_1e-3: [L]}
  m_act           {site: {max: [L], where: [L, 3] = (sample, token, channel), median: [L]}}
                  for the sites attn_out, attn_residual, ffn_out, ffn_residual (median: of |h|
                  over every element of the batch)
In a hybrid (config.model.layer_types: Gated DeltaNet and attention layers) the attention
statistics (f_attn_H, attn_map, gate, sdpa_*) have one row per attention layer, in layer order,
m_act one per layer, and the DeltaNet layers add, one row each:
  linear_gate     {mean, abs_mean, frac_abs_below_0.1: [Ll], hist: [Ll, bins]}: their output
                  gate SiLU(z) (model/deltanet.py summarize_output_gate)

`pool` combines batches exactly: averages weighted by how many values each batch averaged over
(so pooled == the statistic of all batches concatenated), histograms summed, M-Act maxima taken
over batches with their location, the medians of |h| averaged over batches weighted by their
tokens (a batch's median is exact; the pooled one is the weighted mean of those, not the median
of all batches together). `report` turns the pooled statistics into report.json.
"""

import math

import numpy as np

M_ACT_SITES = ('attn_out', 'attn_residual', 'ffn_out', 'ffn_residual')
# The paper's M-Act is "the maximum absolute value of each layer's output hidden state": the
# residual stream after the FFN residual, averaged over layers.
M_ACT_PAPER_SITE = 'ffn_residual'
SPARSITY_KEYS = ('abs_mean', 'frac_below_1e-2', 'frac_below_1e-3')
GATE_FRAC_KEY = 'frac_below_0.1'
LINEAR_GATE_FRAC_KEY = 'frac_abs_below_0.1'


def _np(tree):
  if isinstance(tree, dict):
    return {k: _np(v) for k, v in tree.items()}
  return np.asarray(tree)


def _weighted_mean(values, weights):
  w = np.asarray(weights, np.float64)
  stacked = np.stack([np.asarray(v, np.float64) for v in values])
  return np.tensordot(w, stacked, axes=1) / w.sum()


def pool(batches: list[dict], shapes: list[tuple[int, int]] | None = None) -> dict:
  """Pools the inspect statistics of several batches (numpy or jax trees, as the model returns).

  Args:
    batches: one aux dict per batch (the output of `train.inspect_step`).
    shapes: (batch size, sequence length) of each batch; they set the weights: F-Attn averages
      over B * (T - 1) queries, gate and sparsity statistics over B * T tokens (times a fixed
      number of heads/channels). Default: all batches weigh the same (equal shapes).

  Returns a dict like one batch's, with float64 values, plus `num_batches`; `m_act[site]` gains
  `batch` [L] (the index of the batch holding the maximum) and `where` stays (sample, token,
  channel) within that batch. `attn_map` is the first batch's (its sample 0).
  """
  if not batches:
    raise ValueError('pool() needs at least one batch of inspect statistics.')
  batches = [_np(b) for b in batches]
  n = len(batches)
  shapes = shapes or [(1, 2)] * n
  if len(shapes) != n:
    raise ValueError(f'pool(): {n} batches but {len(shapes)} shapes.')
  query_w = [b * (t - 1) for b, t in shapes]
  token_w = [b * t for b, t in shapes]
  if sum(query_w) <= 0:
    raise ValueError(f'pool(): F-Attn needs sequences of at least 2 tokens, got shapes {shapes}.')
  first = batches[0]
  out = {'num_batches': n,
         'f_attn_H': _weighted_mean([b['f_attn_H'] for b in batches], query_w),
         'attn_map': np.asarray(first['attn_map'], np.float64)}
  for key in ('sdpa_pre_gate', 'sdpa_post_gate'):
    if key in first:
      out[key] = {k: _weighted_mean([b[key][k] for b in batches], token_w)
                  for k in first[key]}
  for key in ('gate', 'linear_gate'):
    if key in first:
      # hist holds fractions of each batch's scores: the weighted mean of fractions is the
      # fraction of the summed counts.
      out[key] = {k: _weighted_mean([b[key][k] for b in batches], token_w) for k in first[key]}
  m_act = {}
  for site in first.get('m_act', {}):
    maxes = np.stack([np.asarray(b['m_act'][site]['max'], np.float64) for b in batches])  # [n, L]
    wheres = np.stack([np.asarray(b['m_act'][site]['where'], np.int64)
                       for b in batches])                                              # [n, L, 3]
    best = np.argmax(maxes, axis=0)                                   # first batch wins ties
    layers = np.arange(maxes.shape[1])
    m_act[site] = {'max': maxes[best, layers], 'batch': best, 'where': wheres[best, layers]}
    if 'median' in first['m_act'][site]:
      m_act[site]['median'] = _weighted_mean([b['m_act'][site]['median'] for b in batches],
                                             token_w)
  out['m_act'] = m_act
  return out


def _floats(a) -> list:
  return [_float(x) for x in np.asarray(a, np.float64).reshape(-1)]


def _float(x):
  x = float(x)
  return x if math.isfinite(x) else None


def _m_act_report(m_act_pooled: dict, batch_size, inputs) -> dict:
  """m_act, m_act_median, m_act_where, m_act_mean_by_site and m_act_mean of the report."""
  m_act, median, where, means = {}, {}, {}, {}
  for site, s in m_act_pooled.items():
    m_act[site] = _floats(s['max'])
    if 'median' in s:
      median[site] = _floats(s['median'])
    means[site] = _float(np.mean(s['max']))
    batch, sample = np.asarray(s['batch']), np.asarray(s['where'])[:, 0]
    w = {'batch': [int(b) for b in batch], 'sample': [int(x) for x in sample],
         'token': [int(x) for x in np.asarray(s['where'])[:, 1]],
         'channel': [int(x) for x in np.asarray(s['where'])[:, 2]]}
    if batch_size:
      w['sequence'] = [int(b) * batch_size + int(x) for b, x in zip(batch, sample)]
    if inputs is not None:
      w['token_id'] = [int(np.asarray(inputs[b])[x, t])
                       for b, x, t in zip(batch, sample, w['token'])]
    where[site] = w
  return {'m_act': m_act, 'm_act_median': median, 'm_act_where': where,
          'm_act_mean_by_site': means, 'm_act_mean': means.get(M_ACT_PAPER_SITE)}


def report(pooled: dict, *, loss: float | None, tokens: float | None = None,
           batch_size: int | None = None, inputs: list | None = None) -> dict:
  """The analysis report (JSON-serialisable) from `pool`'s output and the validation loss.

  Keys: f_attn (per layer), f_attn_mean, f_attn_per_head [L][H]; m_act {site: per-layer max},
  m_act_median {site: per-layer median |h|},
  m_act_mean (the paper's: mean over layers of the per-layer max after the FFN residual),
  m_act_mean_by_site, m_act_where {site: per-layer {sequence, token, channel[, token_id]}};
  gate_score_mean (None without a gate), gate (per-layer mean, frac_below_0.1, hist; None
  without a gate); sparsity {pre_gate, post_gate: per-layer lists and their means over layers};
  a hybrid's linear_gate (per DeltaNet layer: mean, abs_mean, frac_abs_below_0.1 of SiLU(z),
  their means over layers, hist) and linear_gate_score_mean;
  loss and ppl (exp of the mean token cross-entropy).

  `batch_size` converts (batch, sample) of the M-Act location into a sequence index over all
  analysed sequences; `inputs` (the batches' input tokens, [B, T] each) adds the token id there.
  """
  f_attn_LxH = np.asarray(pooled['f_attn_H'], np.float64)
  f_attn_L = f_attn_LxH.mean(axis=-1)
  out = {
      'num_layers': int(f_attn_LxH.shape[0]),
      'num_heads': int(f_attn_LxH.shape[1]),
      'num_batches': int(pooled['num_batches']),
      'f_attn': _floats(f_attn_L),
      'f_attn_mean': _float(f_attn_L.mean()),
      'f_attn_per_head': [_floats(row) for row in f_attn_LxH],
  }
  out.update(_m_act_report(pooled['m_act'], batch_size, inputs))
  gate = pooled.get('gate')
  if gate is not None:
    out['gate_score_mean'] = _float(np.mean(gate['mean']))
    out['gate'] = {'mean': _floats(gate['mean']), GATE_FRAC_KEY: _floats(gate[GATE_FRAC_KEY]),
                   f'{GATE_FRAC_KEY}_mean': _float(np.mean(gate[GATE_FRAC_KEY])),
                   'hist': [_floats(row) for row in np.asarray(gate['hist'])]}
  else:
    out['gate_score_mean'] = None
    out['gate'] = None
  linear = pooled.get('linear_gate')
  if linear is not None:    # a hybrid's DeltaNet layers: their output gate SiLU(z)
    keys = ('mean', 'abs_mean', LINEAR_GATE_FRAC_KEY)
    out['linear_gate'] = dict({k: _floats(linear[k]) for k in keys},
                              **{f'{k}_mean': _float(np.mean(linear[k])) for k in keys},
                              hist=[_floats(row) for row in np.asarray(linear['hist'])])
    out['linear_gate_score_mean'] = _float(np.mean(linear['mean']))
  sparsity = {}
  for name, key in (('pre_gate', 'sdpa_pre_gate'), ('post_gate', 'sdpa_post_gate')):
    if key in pooled:
      per_layer = {k: _floats(pooled[key][k]) for k in SPARSITY_KEYS}
      sparsity[name] = dict(per_layer, **{f'{k}_mean': _float(np.mean(pooled[key][k]))
                                          for k in SPARSITY_KEYS})
  out['sparsity'] = sparsity
  out['loss'] = None if loss is None else _float(loss)
  out['ppl'] = None if loss is None else _float(math.exp(min(float(loss), 700.0)))
  if tokens is not None:
    out['val_tokens'] = int(tokens)
  return out


def uniform_causal_f_attn(seq_len: int) -> float:
  """F-Attn of uniform causal attention: mean over queries q = 1..T-1 of 1 / (q + 1)."""
  return float(np.mean(1.0 / (np.arange(1, seq_len) + 1.0)))


def stability(rows: list[dict]) -> dict:
  """Loss spikes, skipped (non-finite) steps and rollbacks of a run, from its metrics.jsonl rows
  (the training loop's stability guard writes one row per event; gated_attention/training/stability.py):
  counts, the largest spike (loss over the running level) and the steps of every spike."""
  spikes = [r for r in rows if r.get('split') == 'spike']
  largest = max(spikes, key=lambda r: r.get('ratio') or 0.0, default=None)
  return {
      'spikes': len(spikes),
      'skipped_steps': sum(r.get('split') == 'skip' for r in rows),
      'rollbacks': sum(r.get('split') == 'rollback' for r in rows),
      'halted': any(r.get('split') == 'failure' for r in rows),
      'largest_spike': None if largest is None else {
          k: largest.get(k) for k in ('step', 'loss', 'level', 'ratio')},
      'spike_steps': [r['step'] for r in spikes],
  }
