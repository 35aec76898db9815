"""`build_data`: documents -> tokens -> packed windows -> shuffled batches, with grain.

Train stream, epoch e (repeats forever):
  documents: train ids, permuted by (seed, e);
  each document -> [BOS] + tokens; concatenated and cut into windows of seq_len + 1 tokens;
  windows shuffled in blocks of data.shuffle_buffer; batched into [B, seq_len + 1];
  inputs = window[:, :-1], targets = window[:, 1:].
The global batches are a function of the config and the step alone, never of the number of
processes or devices: every process reads the same stream and the step puts each device's rows
of it on that device (train.Setup.global_batch(..., whole=True)). A run saved by N processes
resumes on M, and its iterator state is one for all (checkpoint.py saves it once).

Runs saved before that (issue 45) by P > 1 processes had one stream per process: the documents'
every P-th from p, packed, shuffled and batched into [B/P, seq_len + 1] by process p.
`per_process_stream=True` builds that stream, so such a run resumes with its own process count.

Validation: the held-out documents in index order, cycled so no batch is padded, packed into
global batches; process p keeps rows [p*B/P, (p+1)*B/P), so every process count sees the same set.

Training mixture (data.mix_ratio > 0; not for synthetic sources): before packing, the train
documents are mixed, document by document (grain.MapDataset.mix: evenly interleaved), with an
unbounded stream of RULER-style task documents (input_pipeline/ruler.py), prompt + target
of data.mix_tokens tokens (default seq_len / 2, so about half of them fall whole into one training
window), whose haystack is train documents only. mix_ratio is the task documents' share of the
training TOKENS: the document share that gives it follows from the mean length of a sample of
train documents. Task document i of the run is generated from (seed, i) (a per-process stream p
of P reads i = p, p + P, p + 2P, ...). The iterator state (the mixed stream's next index)
checkpoints both.

data.source='tokenized' (input_pipeline/tokenized.py, written by --mode=tokenize) reads the token
ids of the source's documents from ArrayRecord shards, in the source's document index space: the
same split, order, packing, shares and iterator state as training from the source, and no
tokenizer work.

data.mixture (input_pipeline/mixture.py, docs/mixtures.md): several corpora, each read and split as
one data.source is, their training documents drawn by weight into one stream (a function of the
seed and the document index), packed with each token's source and source epoch, shuffled and
batched as above; `MixtureAccounting` adds up each source's tokens and epochs in the iterator
state (`Data.accounting`). Validation: data.val_batches batches of each source's held-out
documents (`val_sets()`).

data.source='synthetic' (input_pipeline/synthetic.py) replaces the documents by an unbounded index
space of generated ones, train document i from (seed, i) (a per-process stream p of P reads
p, p + P, ...; i.i.d., so neither the documents nor the windows are shuffled), and validation
reads the task's own validation stream; grain's iterator state (the next index) checkpoints it.
"""

import dataclasses
import hashlib

from absl import flags
import grain
import numpy as np

from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline import mixture as mixture_lib
from gated_attention.input_pipeline.packing import PackIterDataset, TaggedPackIterDataset
from gated_attention.input_pipeline import ruler
from gated_attention.input_pipeline import synthetic
from gated_attention.input_pipeline import tasks
from gated_attention.input_pipeline import tokenized
from gated_attention.input_pipeline.shuffle import WindowShuffleIterDataset
from gated_attention.input_pipeline.sources import Documents, load_documents, split_documents
from gated_attention.input_pipeline.tokenizer import Tokenizer, make_tokenizer

_READ = grain.ReadOptions(num_threads=4, prefetch_buffer_size=128)
_SAMPLE_TOKENS = 1 << 21  # describe(): tokens read for the entropy and the token-count estimate
_SYNTHETIC_SAMPLE_DOCS = 256  # describe() of a synthetic task: validation documents sampled
_UNBOUNDED = 1 << 62  # synthetic document indices
_MIX_SAMPLE_DOCS = 64  # train documents whose mean length sets the mixture's document share


class _Encode:
  """Document id -> int32 [1 + num_tokens] (BOS first); a class so worker processes can pickle it."""

  def __init__(self, docs: Documents, tokenizer: Tokenizer):
    self.docs, self.tokenizer = docs, tokenizer

  def __call__(self, doc_id) -> np.ndarray:
    return _encode_doc(self.docs, self.tokenizer, doc_id)


def _encode_doc(docs, tokenizer: Tokenizer, doc_id) -> np.ndarray:
  """Document `doc_id` as token ids (BOS first); a pre-tokenized source's as they are."""
  if getattr(docs, 'tokens', False):
    return docs[int(doc_id)]
  return tokenizer.encode_doc(docs[int(doc_id)])


def _to_batch(windows: list[np.ndarray]) -> dict[str, np.ndarray]:
  """Windows [seq_len + 1] x B -> inputs/targets int32 [B, seq_len], loss_mask float32 [B, seq_len]."""
  windows_bl = np.stack(windows).astype(np.int32)
  targets_bl = np.ascontiguousarray(windows_bl[:, 1:])
  return {'inputs': np.ascontiguousarray(windows_bl[:, :-1]), 'targets': targets_bl,
          'loss_mask': np.ones(targets_bl.shape, np.float32)}


def _derive_seed(seed: int, tag: str) -> int:
  """A 31-bit seed for one use (`tag`) of the run's seed."""
  return int.from_bytes(hashlib.sha256(f'{seed}/{tag}'.encode()).digest()[:4], 'little') >> 1


def _packed(doc_ids: grain.MapDataset, docs, tokenizer, seq_len: int) -> grain.IterDataset:
  return _pack(doc_ids.map(_Encode(docs, tokenizer)), seq_len)


def _pack(token_docs: grain.MapDataset, seq_len: int) -> grain.IterDataset:
  return PackIterDataset(token_docs.to_iter_dataset(_READ), seq_len + 1)


class Data:
  """The data of one run: `tokenizer`, `train_iter`, `val_batches()`, `describe()`."""

  def __init__(self, cfg, tokenizer: Tokenizer, docs: Documents, train_ids: np.ndarray,
               val_ids: np.ndarray, train_iter: grain.DatasetIterator,
               global_batch_size: int, process_index: int, process_count: int,
               mixture: '_Mixture | None' = None):
    self.tokenizer, self.train_iter = tokenizer, train_iter
    self._cfg, self._docs, self._train_ids, self._val_ids = cfg, docs, train_ids, val_ids
    self._global_batch_size, self._process = global_batch_size, (process_index, process_count)
    self._val, self._description, self.mixture = None, None, mixture
    self.on_val_batch = None    # called after each validation batch is read (training/loop.py)

  def set_process(self, process_index: int, process_count: int):
    """Whose rows of the validation batches val_batches() returns."""
    self._process, self._val = (process_index, process_count), None

  def train_documents(self) -> Documents:
    """The training split: the haystack of the training mixture's task documents."""
    return ruler.DocumentSubset(self._docs, self._train_ids, 'train')

  def held_out_documents(self) -> Documents:
    """The held-out split (validation), e.g. the haystack of ruler.examples for evaluation."""
    return ruler.DocumentSubset(self._docs, self._val_ids, 'held-out')

  def val_batches(self) -> list[dict[str, np.ndarray]]:
    """data.val_batches local batches of held-out data; the same list on every call."""
    if self._val is None:
      self._val = self._local_batches(self._val_windows())
    return list(self._val)

  def accounting(self, state: dict) -> dict:
    """Per-source metrics of a train_iter state (a mixture's; {} for one source)."""
    del state
    return {}

  def _local_batches(self, windows: grain.IterDataset) -> list[dict[str, np.ndarray]]:
    """data.val_batches global batches of `windows`, this process's rows of each."""
    local = self._global_batch_size // self._process[1]
    rows = slice(self._process[0] * local, (self._process[0] + 1) * local)
    it, out = iter(windows.batch(self._global_batch_size, batch_fn=_to_batch)), []
    for _ in range(self._cfg.val_batches):
      batch = {k: v[rows].copy() for k, v in next(it).items()}
      for v in batch.values():
        v.setflags(write=False)
      out.append(batch)
      if self.on_val_batch is not None:   # the training loop's bound on a stalled read
        self.on_val_batch()
    return out

  def _val_windows(self) -> grain.IterDataset:
    return _packed(grain.MapDataset.source(self._val_ids).repeat(), self._docs, self.tokenizer,
                   self._cfg.seq_len)

  def describe(self) -> dict:
    """Source, sizes, token-count estimates and unigram entropy (nats/token) of the train split."""
    if self._description is None:
      self._description = self._describe()
    return dict(self._description)

  def _describe(self) -> dict:
    docs, tokenizer = self._docs, self.tokenizer
    order = np.random.default_rng(0).permutation(self._train_ids)
    tokens, n_tokens = [], 0
    for doc_id in order:
      tokens.append(_encode_doc(docs, tokenizer, doc_id))
      n_tokens += len(tokens[-1])
      if n_tokens >= _SAMPLE_TOKENS:
        break
    sampled = order[:len(tokens)]
    counts = np.bincount(np.concatenate(tokens), minlength=tokenizer.vocab_size)
    p = counts[counts > 0] / n_tokens
    def estimate(ids):  # from tokens per byte (plus one BOS per document), else per document
      if docs.sizes is not None and docs.sizes[sampled].sum():
        per_byte = (n_tokens - len(sampled)) / docs.sizes[sampled].sum()
        return int(round(per_byte * docs.sizes[ids].sum())) + len(ids)
      return int(round(n_tokens / len(sampled) * len(ids)))

    exact = len(sampled) == len(order)
    num_tokens = {'train': n_tokens if exact else estimate(self._train_ids),
                  'val': estimate(self._val_ids)}
    if getattr(docs, 'split_tokens', None):   # pre-tokenized: counted when it was written
      num_tokens, exact = dict(docs.split_tokens), True
    mixture = {}
    if self.mixture:
      m = self.mixture
      mixture = {'mixture': {
          'tasks': list(m.tasks), 'token_share': m.ratio, 'tokens_per_document': m.num_tokens,
          'document_share': round(m.doc_share, 4),
          'corpus_tokens_per_document': round(m.corpus_doc_tokens, 1)}}
    return {
        'source': self._cfg.source, 'path': self._cfg.path, **docs.info,
        'num_documents': {'train': len(self._train_ids), 'val': len(self._val_ids)},
        'num_tokens': num_tokens,
        'num_tokens_train_exact': exact,
        'tokenizer': tokenizer.name, 'vocab_size': tokenizer.vocab_size,
        'unigram_entropy': float(-(p * np.log(p)).sum()),  # nats/token
        'entropy_sample_tokens': n_tokens,
        **mixture,
    }


class SyntheticData(Data):
  """The data of a synthetic task: generated documents, no files (see synthetic.py)."""

  def __init__(self, cfg, task: synthetic.SyntheticTask, train_iter: grain.DatasetIterator,
               global_batch_size: int, process_index: int, process_count: int):
    super().__init__(cfg, synthetic.SyntheticTokenizer(task), None, np.zeros(0, np.int64),
                     np.zeros(0, np.int64), train_iter, global_batch_size, process_index,
                     process_count)
    self.task = task

  def train_documents(self) -> Documents:
    raise DataError("data.source='synthetic' has token documents, no text documents.")

  held_out_documents = train_documents

  def _val_windows(self) -> grain.IterDataset:
    docs = grain.MapDataset.range(_UNBOUNDED).map(synthetic.val_stream(self.task))
    return _pack(docs, self._cfg.seq_len)

  def _describe(self) -> dict:
    """The task, and from sampled validation documents: token frequencies and the lowest
    reachable loss (mean entropy of the true next-token distribution; nats/token)."""
    task, spec = self.task, self.task.spec
    val = synthetic.val_stream(task)
    docs = [val(i) for i in range(_SYNTHETIC_SAMPLE_DOCS)]
    tokens_n = np.concatenate([d[1:] for d in docs])
    p = np.bincount(tokens_n, minlength=spec.vocab) / len(tokens_n)
    p = p[p > 0]
    out = {
        'source': 'synthetic', 'task': spec.name, 'vocab': spec.vocab,
        'triggers': [int(t) for t in task.triggers], 'branching': spec.branching,
        'doc_len': spec.doc_len, 'task_seed': spec.task_seed, 'num_documents': 'unbounded',
        'tokenizer': self.tokenizer.name, 'vocab_size': self.tokenizer.vocab_size,
        'trigger_fraction': float(task.is_trigger_V[tokens_n].mean()),
        'unigram_entropy': float(-(p * np.log(p)).sum()),
        'optimal_loss': float(np.mean(np.concatenate([task.target_entropy(d) for d in docs]))),
        'entropy_sample_tokens': int(len(tokens_n)),
    }
    if task.has_answers:  # mqar: its sizes; the answers' share of the targets, their distances
      answers = np.concatenate([task.answer_mask(d) for d in docs])
      distance = np.concatenate([task.answer_distance(d) for d in docs])[answers]
      del out['branching']
      out.update(pairs=spec.pairs, key_tokens=spec.key_tokens, value_tokens=spec.value_tokens,
                 query_rate=spec.query_rate, answer_fraction=float(answers.mean()),
                 answers_per_document=float(answers.sum() / len(docs)),
                 mean_answer_distance=float(distance.mean()) if len(distance) else None)
    return out


class MixtureData(Data):
  """The data of a mixture (data.mixture): `sources` (mixture.Source, by name), `val_sets()`
  ({name: that source's validation batches}), `accounting(state)`."""

  def __init__(self, cfg, tokenizer: Tokenizer, sources: list, train_iter,
               global_batch_size: int, process_index: int, process_count: int):
    super().__init__(cfg, tokenizer, None, np.zeros(0, np.int64), np.zeros(0, np.int64),
                     train_iter, global_batch_size, process_index, process_count)
    self.sources, self._val_sets = sources, None

  def set_process(self, process_index: int, process_count: int):
    super().set_process(process_index, process_count)
    self._val_sets = None

  def val_sets(self) -> dict[str, list[dict[str, np.ndarray]]]:
    """{name: data.val_batches local batches of that source's held-out documents}."""
    if self._val_sets is None:
      self._val_sets = {
          s.name: self._local_batches(_packed(grain.MapDataset.source(s.val_ids).repeat(),
                                              s.docs, self.tokenizer, self._cfg.seq_len))
          for s in self.sources}
    return {k: list(v) for k, v in self._val_sets.items()}

  def val_batches(self) -> list[dict[str, np.ndarray]]:
    """Every source's validation batches, one source after another (sorted by name)."""
    return [b for batches in self.val_sets().values() for b in batches]

  def accounting(self, state: dict) -> dict:
    return mixture_lib.accounting(self.sources, state)

  def _text_sources(self, split: str) -> Documents:
    parts = [(s.docs, s.train_ids if split == 'train' else s.val_ids) for s in self.sources
             if not getattr(s.docs, 'tokens', False)]
    if not parts:
      raise DataError('Every corpus of this mixture is pre-tokenized; the RULER-style tasks '
                      'need text documents: add a text corpus, or evaluate on a text source.')
    return mixture_lib.ConcatDocuments(parts, f'the mixture\'s {split} text documents')

  def train_documents(self) -> Documents:
    return self._text_sources('train')

  def held_out_documents(self) -> Documents:
    return self._text_sources('held-out')

  def _describe(self) -> dict:
    """Each source's settings, weight, document share, sizes and tokens per document (no
    entropy: that would read every corpus)."""
    per_source = {}
    for s in self.sources:
      tokens = (dict(s.docs.split_tokens) if getattr(s.docs, 'split_tokens', None) else
                {'train': int(round(s.mean_tokens * len(s.train_ids))),
                 'val': int(round(s.mean_tokens * len(s.val_ids)))})
      per_source[s.name] = {
          'source': s.cfg.source, 'path': s.cfg.path, 'weight': round(s.weight, 6),
          'document_share': round(s.doc_share, 6), 'documents_per_block': s.block_count,
          'tokens_per_document': round(s.mean_tokens, 2),
          'tokens_per_document_exact': s.mean_exact,
          'num_documents': {'train': len(s.train_ids), 'val': len(s.val_ids)},
          'num_tokens': tokens, **s.docs.info}
    return {'source': 'mixture', 'mixture': per_source, 'block': mixture_lib.BLOCK,
            'num_documents': {k: sum(v['num_documents'][k] for v in per_source.values())
                              for k in ('train', 'val')},
            'tokenizer': self.tokenizer.name, 'vocab_size': self.tokenizer.vocab_size}


def _build_mixture(data_cfg, global_batch_size: int, seed: int, process_index: int,
                   process_count: int) -> MixtureData:
  if process_count != 1:
    raise DataError('data.mixture reads one global stream; per-process streams (runs saved by '
                    'several processes before issue 45) have no mixtures.')
  tokenizer = make_tokenizer(data_cfg.tokenizer)
  sources = mixture_lib.load_sources(data_cfg, tokenizer)
  docs = mixture_lib.mixed_documents(sources, tokenizer, seed, _derive_seed)
  ds = TaggedPackIterDataset(docs.to_iter_dataset(_READ), data_cfg.seq_len + 1)
  if data_cfg.shuffle_buffer > 1:
    ds = WindowShuffleIterDataset(ds, window_size=data_cfg.shuffle_buffer,
                                  seed=_derive_seed(seed, 'windows/0'))
  ds = ds.batch(global_batch_size, drop_remainder=True,
                batch_fn=mixture_lib.ToBatch(len(sources)))
  ds = mixture_lib.MixtureAccounting(_prefetch(ds, data_cfg), len(sources))
  return MixtureData(data_cfg, tokenizer, sources, iter(ds), global_batch_size, process_index,
                     process_count)


def _build_synthetic(data_cfg, global_batch_size: int, seed: int, process_index: int,
                     process_count: int) -> SyntheticData:
  task = tasks.make_task(data_cfg)
  docs = grain.MapDataset.range(_UNBOUNDED).map(synthetic.train_stream(task, seed))
  ds = _pack(docs[process_index::process_count], data_cfg.seq_len)
  ds = ds.batch(global_batch_size // process_count, drop_remainder=True, batch_fn=_to_batch)
  return SyntheticData(data_cfg, task, iter(_prefetch(ds, data_cfg)), global_batch_size,
                       process_index, process_count)


def _prefetch(ds: grain.IterDataset, data_cfg) -> grain.IterDataset:
  """`data.worker_count` worker processes, if any."""
  if data_cfg.worker_count > 0:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags (notebooks, tests)
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=data_cfg.worker_count))
  return ds


@dataclasses.dataclass(frozen=True)
class _Mixture:
  """The training mixture of data.mix_*."""
  tasks: tuple[str, ...]
  ratio: float      # the task documents' share of the training tokens
  num_tokens: int   # per task document, BOS included
  doc_share: float = 0.0  # the task documents' share of the documents that gives `ratio`
  corpus_doc_tokens: float = 0.0  # mean tokens of a corpus document (a sample's)

  def with_corpus(self, docs: Documents, train_ids: np.ndarray, tokenizer) -> '_Mixture':
    """The document share that makes `ratio` of the tokens task documents, from the mean length
    of (up to) _MIX_SAMPLE_DOCS train documents: p = r Lc / (r Lc + (1 - r) Lt)."""
    sample = np.random.default_rng(0).permutation(train_ids)[:_MIX_SAMPLE_DOCS]
    corpus = float(np.mean([len(tokenizer.encode_doc(docs[int(i)])) for i in sample]))
    r, task = self.ratio, float(self.num_tokens)
    return dataclasses.replace(self, doc_share=r * corpus / (r * corpus + (1 - r) * task),
                               corpus_doc_tokens=corpus)


def _mixture(data_cfg, tokenizer: Tokenizer) -> _Mixture | None:
  """data.mix_* checked (None when data.mix_ratio is 0); raises DataError naming the fix."""
  ratio = float(data_cfg.get('mix_ratio', 0.0))
  if not 0.0 <= ratio < 1.0:
    raise DataError(f'data.mix_ratio={ratio} must be in [0, 1) (the share of training tokens in '
                    'RULER task documents; 0: none); set --config.data.mix_ratio.')
  if ratio == 0.0:
    return None
  spec = data_cfg.get('mix_tasks', '')
  if not spec.strip():
    raise DataError(f'data.mix_ratio={ratio} needs data.mix_tasks: set --config.data.mix_tasks to '
                    f'"all" or some of {", ".join(ruler.TASKS)}, comma-separated.')
  tasks = ruler.parse_tasks(spec)
  num_tokens = int(data_cfg.get('mix_tokens', 0)) or int(data_cfg.seq_len) // 2
  for task in tasks:
    need = ruler.min_tokens(task, tokenizer)
    if num_tokens < need:
      raise DataError(
          f'Task documents of {num_tokens} tokens (data.mix_tokens, 0: data.seq_len / 2) are too '
          f'short for {task}, which needs at least {need} with the {tokenizer.name} tokenizer; '
          f'set --config.data.mix_tokens >= {need}, or leave {task} out of data.mix_tasks.')
  return _Mixture(tasks, ratio, num_tokens)


def _mixed(token_docs: grain.MapDataset, mixture: _Mixture, tokenizer: Tokenizer,
           haystack: Documents, seed: int, process_index: int,
           process_count: int) -> grain.MapDataset:
  """Token documents mixed with this process's share of the task documents."""
  stream = ruler.TaskStream(mixture.tasks, mixture.num_tokens, tokenizer, haystack,
                            _derive_seed(seed, 'ruler'))
  tasks = grain.MapDataset.range(_UNBOUNDED)[process_index::process_count].map(stream)
  return grain.MapDataset.mix([token_docs, tasks], [1.0 - mixture.doc_share, mixture.doc_share])


def data_tokenizer(data_cfg) -> Tokenizer:
  """The tokenizer of a data config: the synthetic task's, or the one `data.tokenizer` names."""
  if data_cfg.get('source') == 'synthetic':
    return synthetic.SyntheticTokenizer(tasks.make_task(data_cfg))
  return make_tokenizer(data_cfg.tokenizer)


def build_data(data_cfg, *, global_batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, per_process_stream: bool = False) -> Data:
  """Reads, splits and checks the data of `data_cfg` (the run config's `data` section,
  gated_attention/config/schema.py).

  `train_iter` yields whole global batches [global_batch_size, ...], the same in every process;
  with `per_process_stream` (runs saved by several processes before issue 45) this process's
  own stream of [global_batch_size / process_count, ...] batches. `val_batches()` are this
  process's rows of the global validation batches either way.

  Everything that can be checked before training is: a bad source, path, tokenizer or batch
  size raises DataError (a ValueError) whose message names the setting and the fix.
  """
  if process_count < 1 or not 0 <= process_index < process_count:
    raise DataError(f'process_index={process_index} must be in [0, process_count={process_count}).')
  if global_batch_size < 1 or global_batch_size % process_count:
    raise DataError(f'The global batch size {global_batch_size} must be a positive multiple of the '
                    f'process count {process_count}; change --config.train.batch_size.')
  data = _build(data_cfg, global_batch_size, seed,
                *((process_index, process_count) if per_process_stream else (0, 1)))
  data.set_process(process_index, process_count)
  return data


def _build(data_cfg, global_batch_size: int, seed: int, process_index: int,
           process_count: int) -> Data:
  """build_data's work for the train stream of `process_index` of `process_count` (0 of 1: the
  global one)."""
  if data_cfg.seq_len < 1 or data_cfg.val_batches < 0 or data_cfg.shuffle_buffer < 0:
    raise DataError('data.seq_len must be >= 1, data.val_batches and data.shuffle_buffer >= 0 '
                    f'(got {data_cfg.seq_len}, {data_cfg.val_batches}, {data_cfg.shuffle_buffer}).')
  if mixture_lib.is_mixture(data_cfg):
    return _build_mixture(data_cfg, global_batch_size, seed, process_index, process_count)
  if data_cfg.source == 'synthetic':
    if data_cfg.get('mix_ratio', 0.0):
      raise DataError("data.mix_ratio > 0 mixes RULER task documents into text documents; "
                      "data.source='synthetic' has none: set --config.data.mix_ratio=0.")
    return _build_synthetic(data_cfg, global_batch_size, seed, process_index, process_count)
  tokenizer = make_tokenizer(data_cfg.tokenizer)
  mixture = _mixture(data_cfg, tokenizer)
  if data_cfg.source == 'tokenized':    # shards of token ids (--mode=tokenize): tokenized.py
    if mixture is not None:
      raise DataError("data.mix_ratio > 0 mixes RULER task documents built from text; "
                      "data.source='tokenized' holds token ids: set --config.data.mix_ratio=0.")
    docs = tokenized.TokenDocuments(data_cfg, tokenizer)
  else:
    docs = load_documents(data_cfg)
  train_ids, val_ids = split_documents(len(docs), data_cfg.val_fraction)
  if len(train_ids) < process_count:
    raise DataError(f'{docs.name} has {len(train_ids)} training documents, fewer than the '
                    f'{process_count} processes that each need their own; add data.')

  doc_ids = grain.MapDataset.source(train_ids).shuffle(seed=_derive_seed(seed, 'documents'))
  if mixture is None:
    ds = _packed(doc_ids[process_index::process_count].repeat(), docs, tokenizer, data_cfg.seq_len)
  else:
    mixture = mixture.with_corpus(docs, train_ids, tokenizer)
    token_docs = doc_ids[process_index::process_count].repeat().map(_Encode(docs, tokenizer))
    haystack = ruler.DocumentSubset(docs, train_ids, 'train')
    ds = _pack(_mixed(token_docs, mixture, tokenizer, haystack, seed, process_index,
                      process_count), data_cfg.seq_len)
  if data_cfg.shuffle_buffer > 1:
    ds = WindowShuffleIterDataset(
        ds, window_size=data_cfg.shuffle_buffer,
        seed=_derive_seed(seed, f'windows/{process_index}'))
  ds = ds.batch(global_batch_size // process_count, drop_remainder=True, batch_fn=_to_batch)
  return Data(data_cfg, tokenizer, docs, train_ids, val_ids, iter(_prefetch(ds, data_cfg)),
              global_batch_size, process_index, process_count, mixture)
