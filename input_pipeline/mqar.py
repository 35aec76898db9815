"""The multi-query associative recall task (`data.task='mqar'`), on synthetic.py's spec and streams.

Multi-query associative recall (Arora et al. 2023, "Zoology", Sec. 3): the regular tokens are split
into `key_tokens` keys (ids 0..), `value_tokens` values (next) and filler tokens (the rest). Each
document draws its own map: `pairs` distinct keys (uniform, without replacement) with a value each
(uniform over the values, with replacement), written after BOS as k1 v1 k2 v2 ...; then a haystack
in which, token by token, a query starts with probability r (a key of the document, uniform over its
`pairs` keys, followed by that key's value) and otherwise a filler token follows (uniform).
Predicting the value after a query needs the earlier occurrence of its key: an induction (retrieval)
head (Olsson et al. 2022). `query_rate` q is the share of haystack tokens that are query keys (r = q
/ (1 - q); a stationary process, so a longer document has the same queries per token and puts them
further from the pairs: long-context evaluation at doc_len = L + 1 measures retrieval over distances
up to L). `answer_mask(doc)` marks the targets that are retrievals (the values after query keys) and
`answer_distance(doc)` how far back each query's pair is. The keys play the triggers' part (marked
'*' in the text, counted in describe()'s trigger_fraction); `triggers`, `branching` and `copy_share`
are not used.

Documents and streams are synthetic.py's: train document i of a run from (task_seed, 'train',
run seed, i), validation document i from (task_seed, 'val', i), retrieval probes from a stream
of their own (synthetic.probe_stream).
"""

import bisect

import numpy as np

from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.synthetic import (TASK_TAG, SyntheticTask, TaskSpec,
                                                      binary_entropy, entropy)


class MQARTask(SyntheticTask):
  """Multi-query associative recall (module docstring): keys, values and filler are fixed id
  ranges; each document draws its own key -> value map."""

  has_answers = True

  def __init__(self, spec: TaskSpec):  # pylint: disable=super-init-not-called
    self.spec = spec
    k, v = spec.key_tokens, spec.value_tokens
    self.key_ids = np.arange(k, dtype=np.int32)
    self.value_ids = np.arange(k, k + v, dtype=np.int32)
    self.filler_ids = np.arange(spec.filler_first, spec.vocab, dtype=np.int32)
    self.is_key_V = np.zeros(spec.vocab, bool)
    self.is_key_V[:k] = True
    self.triggers, self.is_trigger_V = self.key_ids, self.is_key_V  # the tokenizer marks keys
    q = spec.query_rate
    self.slot_rate = q / (1.0 - q)  # P(a query starts) at each haystack token not ending a key
    r, p, f = self.slot_rate, spec.pairs, spec.filler_tokens
    if spec.filler == 'skip_bigram':  # filler row of the token two back: [vocab, filler]
      rng = np.random.default_rng([TASK_TAG, spec.task_seed])
      self.skip_VxF = np.zeros((spec.vocab, f))
      for a in range(spec.vocab):
        support = rng.choice(f, spec.branching, replace=False)
        self.skip_VxF[a, support] = rng.dirichlet(np.ones(spec.branching))
      self._skip_cdf = [list(np.cumsum(row)) for row in self.skip_VxF]
      filler_entropy_V = entropy(self.skip_VxF)
    else:
      filler_entropy_V = np.full(spec.vocab, np.log(f))
    # the next haystack token after anything but a query key, by the token before the current
    # one: a key (uniform over the document's pairs keys) w.p. r, else a filler token
    self.haystack_entropy_V = (np.full(spec.vocab, np.log(p)) if r >= 1 else
                               binary_entropy(r) + r * np.log(p) + (1 - r) * filler_entropy_V)

  @property
  def haystack_start(self) -> int:
    """The index in a document of the haystack's first token (after BOS and the pairs)."""
    return 1 + 2 * self.spec.pairs

  def document(self, key: tuple[int, ...]) -> np.ndarray:
    """int32 [doc_len]: BOS, k1 v1 ... kP vP, then the haystack of queries and filler."""
    s = self.spec
    rng = np.random.default_rng([*key])
    m = s.doc_len - self.haystack_start  # haystack tokens
    keys_P = rng.choice(s.key_tokens, s.pairs, replace=False).astype(np.int32)
    values_P = (s.key_tokens + rng.integers(s.value_tokens, size=s.pairs)).astype(np.int32)
    u_m, which_m = rng.random(m).tolist(), rng.integers(s.pairs, size=m).tolist()
    first = s.filler_first
    if s.filler == 'skip_bigram':
      w_m = rng.random(m).tolist()
    else:
      filler_m = (first + rng.integers(s.filler_tokens, size=m)).tolist()
    keys, values, r = keys_P.tolist(), values_P.tolist(), self.slot_rate
    doc = np.empty(s.doc_len, np.int32)
    doc[0] = self.bos_id
    doc[1:self.haystack_start:2], doc[2:self.haystack_start:2] = keys_P, values_P
    out = doc[:self.haystack_start].tolist()
    pending = -1  # the value owed after a query key
    for t in range(m):
      if pending >= 0:
        out.append(pending)
        pending = -1
      elif u_m[t] < r:
        out.append(keys[which_m[t]])
        pending = values[which_m[t]]
      elif s.filler == 'skip_bigram':  # from the row of the token before the last one
        cdf = self._skip_cdf[out[-2]]
        out.append(first + min(bisect.bisect_right(cdf, w_m[t] * cdf[-1]), s.filler_tokens - 1))
      else:
        out.append(filler_m[t])
    doc[self.haystack_start:] = out[self.haystack_start:]
    return doc

  def probe_document(self, key: tuple[int, ...]) -> np.ndarray:
    """int32 [doc_len]: a retrieval probe (long-context evaluation): BOS and the pairs as in
    document(), then a haystack of filler alone (the same filler process) in which each of the
    document's keys is queried exactly once, followed by its value, at uniformly random
    non-overlapping positions in random order. In document()'s haystack a key is queried again
    and again, so most queries can copy from a recent query rather than from the pairs; here the
    pair is each answer's only source, at a distance spread over the whole length (RULER's
    needles, Hsieh et al. 2024, with the question anywhere after them)."""
    s = self.spec
    rng = np.random.default_rng([*key])
    m = s.doc_len - self.haystack_start
    if m < 2 * s.pairs:
      raise DataError(f'A probe document of {s.doc_len} tokens cannot hold {s.pairs} key-value '
                      f'pairs and a query of each; it needs at least {4 * s.pairs + 1} tokens.')
    keys_P = rng.choice(s.key_tokens, s.pairs, replace=False).astype(np.int32)
    values_P = (s.key_tokens + rng.integers(s.value_tokens, size=s.pairs)).astype(np.int32)
    starts = np.sort(rng.choice(m - s.pairs, s.pairs, replace=False)) + np.arange(s.pairs)
    order = rng.permutation(s.pairs)
    w_m = rng.random(m).tolist()
    query = dict(zip(starts.tolist(), order.tolist()))
    first, keys, values = s.filler_first, keys_P.tolist(), values_P.tolist()
    doc = np.empty(s.doc_len, np.int32)
    doc[0] = self.bos_id
    doc[1:self.haystack_start:2], doc[2:self.haystack_start:2] = keys_P, values_P
    out = doc[:self.haystack_start].tolist()
    t = 0
    while t < m:
      if t in query:
        out += [keys[query[t]], values[query[t]]]
        t += 2
        continue
      if s.filler == 'skip_bigram':
        cdf = self._skip_cdf[out[-2]]
        out.append(first + min(bisect.bisect_right(cdf, w_m[t] * cdf[-1]), s.filler_tokens - 1))
      else:
        out.append(first + min(int(w_m[t] * s.filler_tokens), s.filler_tokens - 1))
      t += 1
    doc[self.haystack_start:] = out[self.haystack_start:]
    return doc

  def answer_mask(self, doc: np.ndarray) -> np.ndarray:
    """bool [doc_len - 1]: target t (doc[t + 1]) is the value after a query key doc[t] of the
    haystack, i.e. a retrieval whose answer is fixed by the document's pairs."""
    doc = np.asarray(doc)
    mask = np.zeros(len(doc) - 1, bool)
    mask[self.haystack_start:] = self.is_key_V[doc[self.haystack_start:-1]]
    return mask

  def answer_distance(self, doc: np.ndarray) -> np.ndarray:
    """int64 [doc_len - 1]: at each answer (answer_mask), how many tokens back the query's key
    stands in the pairs (query position - pair key position); 0 elsewhere."""
    doc = np.asarray(doc)
    where_V = np.zeros(self.spec.vocab + 1, np.int64)
    where_V[doc[1:self.haystack_start:2]] = np.arange(1, self.haystack_start, 2)
    mask = self.answer_mask(doc)
    t = np.arange(len(doc) - 1)
    return np.where(mask, t - where_V[doc[:-1]], 0)

  def target_entropy(self, doc: np.ndarray) -> np.ndarray:
    """float64 [doc_len - 1]: entropy (nats) of the true next-token distribution of each target
    doc[1:] given everything before it: the i-th pair key log(key_tokens - i) (keys are distinct),
    a pair value log(value_tokens), an answer 0, any other haystack token haystack_entropy_V of
    the token before its input (the skip-bigram filler's row; uniform filler: the same for all)."""
    s, start = self.spec, self.haystack_start
    doc = np.asarray(doc)
    h = np.empty(len(doc) - 1)
    h[start - 1:] = self.haystack_entropy_V[doc[start - 2:-2]]
    h[0:start - 1:2] = np.log(s.key_tokens - np.arange(s.pairs))
    h[1:start - 1:2] = np.log(s.value_tokens)
    h[self.answer_mask(doc)] = 0.0
    return h
