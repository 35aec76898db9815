"""`--mode=long_context`: how a run holds up beyond its training length.

  python main.py --mode=long_context --workdir=runs/g1_1k
  python main.py --mode=long_context --workdir=runs/g1_1k --config.long_context.lengths=256,4096 \\
      --config.model.rope_scaling.type=yarn --config.model.rope_scaling.factor=4 \\
      --config.model.rope_scaling.original_max_len=1024        # evaluated with YaRN, no training

Two measurements at each length of `long_context.lengths` (Qiu et al. 2025, Sec. 4.4, Table 5,
in miniature):
  * loss by position: the per-token cross-entropy on held-out documents of at least the largest
    length, averaged over position buckets [0, L1), [L1, L2), ... (L1 < L2 < ... the lengths);
    a model that does not extend shows its loss rising in the buckets past its training length;
  * RULER-style retrieval (input_pipeline/ruler.py; Hsieh et al. 2024): needle-in-a-haystack
    (single, multi-key, multi-value) and variable tracking, prompts of L tokens whose haystack is
    held-out text, answered greedily and scored by exact match.
A run on a synthetic task (data.source='synthetic') has no text: its held-out documents for the
loss are the task's validation stream generated at the largest length + 1, and for a task with
answer positions (data.task='mqar', multi-query associative recall; input_pipeline/synthetic.py)
the retrieval measurement replaces RULER: at each length L, the share of the answers (the value
after each query key) of `long_context.examples` held-out retrieval probes of L + 1 tokens (the
pairs, then filler in which each key is queried once: the pair is each answer's only source)
that the model's teacher-forced greedy prediction gets exactly right (the per-query accuracy of
Arora et al. 2023, "Zoology"), overall and by the distance from the query back to its key-value
pair in the same buckets as the loss (report['ruler'] = {'mqar': {L: accuracy}}, the RULER shape;
report['retrieval'] the answers' counts, loss and the accuracy by distance).
The RoPE settings (model.rope_base, model.rope_scaling) may be overridden on top of the run's
saved config, so one checkpoint is evaluated with and without YaRN; each setting writes its own
RUN/long_context/<tag>/ (report.json, long_context.md, loss_by_position.png, ruler.png), the tag
naming the RoPE setting unless long_context.tag names it.
Attention runs through the KV cache in chunks of `chunk` tokens (generate.py): at most
[batch, heads, chunk, length] scores exist at once, never [length, length] per head.

Under a sliding window (long_context.window W, long_context.sinks S; model/kv_cache.py) the
evaluation is StreamingLLM's (Xiao et al. 2023, Sec. 4.1): each document is decoded token by
token through a cache that keeps the first S tokens and the last W, RoPE positions by place in
the cache, and the token at position t + 1 is scored from the logits of step t. So the loss at
positions below S + W is the full cache's (nothing has been evicted yet), and beyond it measures
what the model loses once the beginning of the text is gone (with S = 0, the first token: its
attention sink). RULER's prompts stream the same way, so a needle further back than the window
is out of reach by construction. report['cache'] records the window, the sinks and the slots.
"""

import dataclasses
import os

import numpy as np

from gated_attention.analysis import plots
from gated_attention.errors import UserError
from gated_attention.input_pipeline import ruler
from gated_attention.input_pipeline import synthetic
from gated_attention.input_pipeline import tasks


class LongContextError(UserError, ValueError):
  pass


def evaluated_lengths(opts, seq_len: int) -> list[int]:
  spec = opts.lengths
  lengths = ([seq_len * m for m in (1, 2, 4, 8)] if not spec else
             [int(x) for x in str(spec).split(',') if x.strip()])
  if not lengths or min(lengths) < 16:
    raise LongContextError(f'long_context.lengths={spec!r}: give comma-separated lengths of at '
                           'least 16 tokens, e.g. --config.long_context.lengths=256,1024,4096.')
  return sorted(set(lengths))


CACHE_MARGIN = 64  # cache slots beyond the largest length (RULER's answers are generated there)


def cache_length(lengths: list[int]) -> int:
  """The KV cache's length for an evaluation of `lengths`: the largest + CACHE_MARGIN."""
  return max(lengths) + CACHE_MARGIN


def window_tag(window) -> str:
  """The sliding window's part of the output directory's name: '' for the full cache, else
  _window<W>_sinks<S>."""
  return '' if window is None else f'_window{window.window}_sinks{window.sinks}'


def cache_report(gen) -> dict:
  """What report['cache'] records of a Generator with a sliding window."""
  return {'kind': 'sliding_window', 'window': gen.window.window, 'sinks': gen.window.sinks,
          'slots': gen.cache_len, 'positions': 'by place in the cache (StreamingLLM)',
          'evaluation': 'token by token (streaming)'}


def rope_tag(model_cfg) -> str:
  """The evaluated position encoding, as a directory name: rope1e+06, rope1e+06_yarn4x1024."""
  tag = f'rope{model_cfg.rope_base:.0e}'
  s = model_cfg.rope_scaling
  if s.type == 'yarn':
    tag += f'_yarn{s.factor:g}x{s.original_max_len}'
  return tag


def long_documents(data, min_tokens: int, count: int) -> np.ndarray:
  """[n, min_tokens] token ids: the first `min_tokens` of up to `count` held-out documents that
  have at least that many (BOS first), in held-out order."""
  tok, out = data.tokenizer, []
  docs = data.held_out_documents()
  for i in range(len(docs)):
    ids = tok.encode_doc(docs[i])
    if len(ids) >= min_tokens:
      out.append(ids[:min_tokens])
      if len(out) == count:
        break
  if not out:
    raise LongContextError(
        f'No held-out document has {min_tokens} tokens (the largest length + 1): lower '
        '--config.long_context.lengths, or evaluate on data with longer documents '
        '(--config.data.source / path; held-out documents are never trained on).')
  return np.stack(out).astype(np.int32)


def synthetic_documents(task, num_tokens: int, count: int, probes: bool = False) -> np.ndarray:
  """int32 [count, num_tokens]: the first `count` documents of the task's validation stream (never
  trained on), or with `probes` of its retrieval probes (mqar: each key queried once), generated
  at doc_len = num_tokens (BOS first)."""
  task = tasks.task_of(dataclasses.replace(task.spec, doc_len=num_tokens))
  stream = synthetic.probe_stream(task) if probes else synthetic.val_stream(task)
  return np.stack([stream(i) for i in range(count)]).astype(np.int32)


def answer_accuracy(docs_NxT: np.ndarray, pred_NxT1: np.ndarray, nll_NxT1: np.ndarray,
                    mask_NxT1: np.ndarray, distance_NxT1: np.ndarray, edges: list[int]) -> dict:
  """Exact match of the predictions at the answer positions (mask): prediction t == token t+1.
  Overall, the mean loss there, and per distance bucket [edges[i], edges[i+1]) (None where a
  bucket has no answer)."""
  right = (pred_NxT1 == docs_NxT[:, 1:])[mask_NxT1]
  dist = distance_NxT1[mask_NxT1]
  buckets = []
  for a, b in zip(edges[:-1], edges[1:]):
    inside = (dist >= a) & (dist < b)
    buckets.append({'from': int(a), 'to': int(b), 'answers': int(inside.sum()),
                    'accuracy': float(right[inside].mean()) if inside.any() else None})
  return {'answers': int(mask_NxT1.sum()),
          'accuracy': float(right.mean()) if right.size else None,
          'answer_loss': float(nll_NxT1[mask_NxT1].mean()) if right.size else None,
          'by_distance': buckets}


def retrieval_accuracy(gen, task, lengths: list[int], count: int, batch: int) -> dict:
  """A synthetic task with answer positions (mqar), per length L: answer_accuracy on `count`
  retrieval probes of L + 1 tokens (mqar.MQARTask.probe_document: each key queried once, so
  each answer's only source is its pair, at a distance spread up to L), through the Generator's
  cached chunks (token_scores); None for a length too short for the pairs and their queries."""
  edges = [0] + list(lengths)
  out = {'task': task.spec.name, 'documents': int(count), 'lengths': {}}
  for length in lengths:
    if length < 4 * task.spec.pairs:
      out['lengths'][str(length)] = None
      continue
    docs = synthetic_documents(task, length + 1, count, probes=True)
    scored = [gen.token_scores(docs[i:i + batch]) for i in range(0, count, batch)]
    nll, pred = (np.concatenate(x) for x in zip(*scored))
    mask = np.stack([task.answer_mask(d) for d in docs])
    distance = np.stack([task.answer_distance(d) for d in docs])
    out['lengths'][str(length)] = answer_accuracy(docs, pred, nll, mask, distance, edges)
  return out


def loss_by_position(gen, tokens_NxT: np.ndarray, lengths: list[int], batch: int) -> dict:
  """Mean cross-entropy per bucket [0, L1), [L1, L2), ... and a 64-bin curve over positions."""
  nll = np.concatenate([gen.token_nll(tokens_NxT[i:i + batch])
                        for i in range(0, len(tokens_NxT), batch)])       # [N, T - 1]
  edges = [0] + lengths
  buckets = [{'from': a, 'to': b, 'loss': float(nll[:, a:b].mean())}
             for a, b in zip(edges[:-1], edges[1:])]
  bins = np.array_split(np.arange(nll.shape[1]), min(64, nll.shape[1]))
  curve = {'position': [int(b.mean()) for b in bins],
           'loss': [float(nll[:, b].mean()) for b in bins]}
  return {'documents': len(tokens_NxT), 'buckets': buckets, 'curve': curve}


def ruler_accuracy(gen, data, tasks, lengths, count: int, seed: int, batch: int) -> dict:
  """{task: {length: exact-match accuracy}} with greedy answers (input_pipeline/ruler.py);
  None where the length cannot hold the task's needles and question (ruler.min_tokens)."""
  tok, haystack = data.tokenizer, data.held_out_documents()
  out = {}
  for task in tasks:
    out[task] = {}
    for length in lengths:
      if length < ruler.min_tokens(task, tok):
        out[task][str(length)] = None
        continue
      examples = ruler.examples(task, num_tokens=length, count=count, seed=seed, tokenizer=tok,
                                haystack=haystack)
      scores = []
      for i in range(0, count, batch):
        group = examples[i:i + batch]
        prompts = [[int(t) for t in tok.encode_doc(e.prompt)] for e in group]
        new = max(len(tok.encode(e.target)) for e in group) + 4
        res = gen.generate(prompts, max_new_tokens=new)
        scores += [ruler.score(e, tok.decode(t)) for e, t in zip(group, res.tokens)]
      out[task][str(length)] = float(np.mean(scores))
  return out


def table(report) -> str:
  lengths = report['lengths']
  retrieval = report.get('retrieval')
  cache = report.get('cache')
  streamed = ('' if not cache else
              f', streamed through a sliding window of {cache["window"]} + {cache["sinks"]} sinks')
  lines = [f'# {report["variant"]} step {report["step"]}, {report["rope_tag"]} '
           f'(trained at {report["train_seq_len"]} tokens){streamed}', '',
           '| loss by position | ' + ' | '.join(f'{b["from"]}-{b["to"]}'
                                                for b in report['loss']['buckets']) + ' |',
           '|---|' + '---|' * len(lengths),
           '| cross-entropy (nats) | ' + ' | '.join(f'{b["loss"]:.3f}'
                                                   for b in report['loss']['buckets']) + ' |', '',
           ('| retrieval, % of answers exact | ' if retrieval else '| RULER task | ') +
           ' | '.join(str(n) for n in lengths) + ' |',
           '|---|' + '---|' * len(lengths)]
  pct = lambda x: '-' if x is None else f'{100 * x:.1f}'  # noqa: E731
  for task, acc in report['ruler'].items():
    lines.append(f'| {task} | ' + ' | '.join(pct(acc[str(n)]) for n in lengths) + ' |')
  if len(report['ruler']) > 1:
    mean = [_mean([acc[str(n)] for acc in report['ruler'].values()]) for n in lengths]
    lines.append('| mean (tasks that fit) | ' + ' | '.join(pct(m) for m in mean) + ' |')
  if retrieval:
    lines += ['', f'| {retrieval["task"]}: % exact by distance (answers) | ' +
              ' | '.join(f'{a}-{b}' for a, b in zip([0] + lengths[:-1], lengths)) + ' |',
              '|---|' + '---|' * len(lengths)]
    for n in lengths:
      cell = retrieval['lengths'][str(n)]
      if cell is not None:
        lines.append(f'| length {n} ({cell["answers"]} answers) | ' + ' | '.join(
            '' if b['accuracy'] is None else f'{pct(b["accuracy"])} ({b["answers"]})'
            for b in cell['by_distance']) + ' |')
  return '\n'.join(lines) + '\n'


def _mean(values):
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def figures(report, out_dir):
  fig = plots.long_context_loss_figure({report['rope_tag']: report},
                                       title=f'{report["variant"]}: loss by position')
  plots.save(fig, os.path.join(out_dir, 'loss_by_position.png'))
  if report['ruler']:
    fig = plots.ruler_figure(report['ruler'], title=f'{report["variant"]} {report["rope_tag"]}')
    plots.save(fig, os.path.join(out_dir, 'ruler.png'))
