"""Evaluation: held-out loss and the analysis statistics, for the training loop and the analysis.

    result = evaluate(setup, params, batches, inspect_rows=8)   # the loop: 8 rows of batch 0
    result = evaluate(setup, params, batches)                   # --mode=analyze: every batch

The loss is pooled exactly over all batches (summed cross-entropy / tokens). The analysis
statistics (model.inspect: F-Attn, M-Act, gate scores, sparsity) materialise attention
probabilities [B, H, T, T] one layer at a time, so the loop inspects only the first rows of the
first batch (its loss comes from the training forward); the analysis inspects every batch, and
takes the loss from that same forward (explicit attention: equal to the fused one to float
rounding). `analysis.metrics.pool` combines them.
"""

import dataclasses
import math

import jax
import numpy as np

from gated_attention.analysis import metrics


@dataclasses.dataclass
class Evaluation:
  loss: float                    # mean token cross-entropy (nats)
  tokens: float                  # tokens it averaged over
  stats: dict                    # metrics.pool of the inspected batches
  shapes: list[tuple[int, int]]  # (rows, seq_len) of each inspected (global) batch
  inputs: list[np.ndarray]       # this process's input tokens of each inspected batch

  @property
  def ppl(self) -> float:
    return math.exp(min(self.loss, 50.0))


def _inspect_rows(setup, rows: int, local_rows: int) -> int:
  """Rows per process for `rows` global rows: at least one per data shard, at most a batch."""
  shards = setup.batch_shards
  per_process = -(-rows // shards) * shards // jax.process_count()
  return min(max(per_process, 1), local_rows)


def evaluate(setup, params, batches: list[dict], *, inspect_rows: int | None = None
             ) -> Evaluation:
  """Loss over `batches` (local numpy batches); statistics of every batch, or with
  `inspect_rows` of that many (global) rows of the first batch only."""
  loss_sum = tokens = 0.0
  auxes, shapes, inputs = [], [], []
  with jax.set_mesh(setup.mesh):
    for i, local in enumerate(batches):
      batch = setup.global_batch(local)
      if inspect_rows is None:   # every batch inspected: the loss comes from the same forward
        out, aux = jax.device_get(setup.eval_inspect_step(params, batch))
        inspected = local
      else:
        out, aux = jax.device_get(setup.eval_step(params, batch)), None
        if i == 0:
          rows = _inspect_rows(setup, inspect_rows, len(local['inputs']))
          inspected = {k: v[:rows] for k, v in local.items()}
          batch = setup.global_batch(inspected)
          aux = jax.device_get(setup.inspect_step(params, batch))
      loss_sum += float(out['loss_sum'])
      tokens += float(out['tokens'])
      if aux is not None:
        auxes.append(aux)
        shapes.append(tuple(batch['inputs'].shape))
        inputs.append(np.asarray(inspected['inputs']))
  if not auxes:
    raise ValueError('evaluate() got no batches.')
  return Evaluation(loss=loss_sum / max(tokens, 1.0), tokens=tokens,
                    stats=metrics.pool(auxes, shapes), shapes=shapes, inputs=inputs)


def summary(result: Evaluation) -> dict:
  """The validation row the training loop logs: loss, ppl, per-layer F-Attn and M-Act (the
  paper's site, the layer output) and their means, and the gate score (gated runs)."""
  stats = result.stats
  f_attn_L = np.mean(stats['f_attn_H'], axis=-1)
  m_act_L = np.asarray(stats['m_act'][metrics.M_ACT_PAPER_SITE]['max'])
  out = {'loss': result.loss, 'ppl': result.ppl,
         'f_attn': f_attn_L, 'f_attn_mean': float(np.mean(f_attn_L)),
         'm_act': m_act_L, 'm_act_mean': float(np.mean(m_act_L))}
  if 'gate' in stats:
    out['gate_score'] = stats['gate']['mean']
    out['gate_score_mean'] = float(np.mean(stats['gate']['mean']))
  return out
