"""Weighted mixtures of corpora (data.mixture): which source each training document comes from.

    c.data.mixture = {'web': dict(weight=0.7, source='tokenized', path='gs://b/tok/web'),
                      'code': dict(weight=0.3, source='jsonl', path='gs://b/code/*.jsonl')}

docs/mixtures.md defines the order exactly enough to reproduce it elsewhere; in short:

- The entries, sorted by name, are sources 0..S-1. Each is read like data.source / data.path
  read one corpus (an entry's empty fields take the data section's values) and split like it
  (sources.split_documents, data.val_fraction).
- Weights are shares of the training TOKENS. Document shares follow from each source's mean
  tokens per training document L_s (exact for a tokenized folder, from its manifest; otherwise
  the mean over up to MEAN_SAMPLE_DOCS training documents drawn with numpy's default_rng(0)):
  p_s = (w_s / L_s) / sum_t (w_t / L_t).
- The mixed stream is cut into blocks of BLOCK documents. Every block holds n_s documents of
  source s: floor(BLOCK p_s), plus one for the sources with the largest remainders (ties: the
  lower index) until the block is full. Block b's order is
  np.repeat(arange(S), n)[np.random.default_rng([mix_seed, b]).permutation(BLOCK)].
- Document k (block b = k // BLOCK, position j = k % BLOCK) of source s is that source's
  stream document i = b n_s + (occurrences of s among positions 0..j-1 of block b).
- Source s's stream: epoch e = i // T_s (T_s: its training documents), document
  train_ids_s[Permutation(T_s, seed_s, e)(i % T_s)] (a keyed Feistel permutation, below: O(1)
  per document, no index array), so a source that runs out starts its next epoch, reshuffled.
- mix_seed and seed_s are pipeline._derive_seed(config.seed, 'mixture') and
  (config.seed, 'mixture/<name>').

Everything is a function of the index k, so grain reads the mixture in parallel and its iterator
state (the next k, as for one source) resumes it exactly.
"""

import copy
import dataclasses
import math
import re
import sys
import threading

import grain
import numpy as np

from gated_attention.config import schema
from gated_attention.input_pipeline import tokenized
from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.sources import Documents, load_documents, split_documents
from gated_attention.input_pipeline.tokenizer import Tokenizer

BLOCK = 1 << 16          # documents per block of the mixed stream
MEAN_SAMPLE_DOCS = 1024  # training documents tokenized for a text source's mean length
SOURCES = ('text', 'jsonl', 'parquet', 'arrayrecord', 'hf', 'tokenized', 'builtin',
           'builtin_large')
MAX_SOURCES = 127
_NAME = re.compile(r'^[A-Za-z0-9_-]+$')
_FIELDS = tuple(f.name for f in dataclasses.fields(schema.MixtureSource))
_CACHED_BLOCKS = 4


@dataclasses.dataclass
class Source:
  """One corpus of the mixture, read and split."""
  name: str
  index: int
  weight: float            # normalised: the weights sum to 1
  cfg: object              # the data section as this source's (source, path, ... replaced)
  docs: Documents
  train_ids: np.ndarray
  val_ids: np.ndarray
  mean_tokens: float = 0.0  # per training document, BOS included
  mean_exact: bool = False
  doc_share: float = 0.0
  block_count: int = 0      # its documents in each block of BLOCK


def is_mixture(data_cfg) -> bool:
  return bool(data_cfg.get('mixture'))


def _as_dict(x) -> dict:
  return x.to_dict() if hasattr(x, 'to_dict') else dict(x)


def entries(data_cfg) -> list[tuple[str, object, float]]:
  """(name, the data section as that entry reads it, weight) of each entry, sorted by name;
  DataError (naming the entry and the fix) for a bad name, key, weight or source."""
  mixture = data_cfg.get('mixture')
  if not hasattr(mixture, 'items') or not mixture:
    raise DataError(f'data.mixture must map names to entries ({{"web": {{"weight": 0.7, '
                    f'"source": "tokenized", "path": "gs://..."}}, ...}}); got {mixture!r}.')
  if float(data_cfg.get('mix_ratio', 0.0)):
    raise DataError('data.mix_ratio > 0 mixes RULER task documents into data.source; with '
                    'data.mixture set, set --config.data.mix_ratio=0 (or add the task documents '
                    'as a corpus of the mixture: tokenize them into a folder of their own).')
  out = []
  for name in sorted(mixture):
    entry = mixture[name]
    where = f'data.mixture.{name}'
    if not _NAME.match(str(name)):
      raise DataError(f'{where}: a mixture entry\'s name is letters, digits, "_" or "-" (it '
                      'names the entry\'s metrics: tokens/<name>, loss/<name>); rename it.')
    if not hasattr(entry, 'items'):
      raise DataError(f'{where} is {entry!r}; each entry is an object with the fields '
                      f'{", ".join(_FIELDS)} (weight required).')
    entry = _as_dict(entry)
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
      raise DataError(f'{where} has key(s) {", ".join(unknown)}, which are no field of a '
                      f'mixture entry; its fields are {", ".join(_FIELDS)} (schema.MixtureSource)'
                      '. Fix the spelling in the config file or the --config.data.mixture flag.')
    weight = entry.get('weight', 0.0)
    if (isinstance(weight, bool) or not isinstance(weight, (int, float))
        or not math.isfinite(weight) or weight <= 0):
      raise DataError(f'{where}.weight={weight!r}: every entry of a mixture needs a positive '
                      'weight (its share of the training tokens, normalised over the entries); '
                      f'set --config.data.mixture.{name}.weight, or remove the entry.')
    cfg = copy.deepcopy(data_cfg)
    for key in _FIELDS[1:]:
      if entry.get(key):
        cfg[key] = entry[key]
    if cfg.source not in SOURCES:
      raise DataError(f'{where}: source={cfg.source!r} cannot be mixed; set '
                      f'--config.data.mixture.{name}.source to one of {", ".join(SOURCES)}.')
    out.append((name, cfg, float(weight)))
  if len(out) > MAX_SOURCES:
    raise DataError(f'data.mixture has {len(out)} entries; at most {MAX_SOURCES} (each token '
                    'carries its source as an int8); merge some corpora into one folder.')
  return out


def _check_tokenizers(items: list[tuple[str, object, float]]):
  """Pre-tokenized entries must share one tokenizer (a mixture trains on one vocabulary)."""
  seen = []
  for name, cfg, _ in items:
    if cfg.source != 'tokenized':
      continue
    try:
      m = tokenized.read_manifest(cfg.path)
    except DataError as e:
      raise _in_entry(name, cfg, e) from e
    key = (m['vocab_size'], m['bos_id'], m['tokenizer_fingerprint'])
    for other, other_key, other_m in seen:
      if key != other_key:
        raise DataError(
            f'data.mixture.{other} ({other_m["path"]!r} tokenized into {cfg_path(items, other)!r}) '
            f'and data.mixture.{name} ({cfg.path!r}) were tokenized with different tokenizers: '
            f'{other_m["tokenizer"]} ({other_m["vocab_size"]} tokens, fingerprint '
            f'{other_m["tokenizer_fingerprint"]}) and {m["tokenizer"]} ({m["vocab_size"]} tokens, '
            f'fingerprint {m["tokenizer_fingerprint"]}). A mixture trains on one tokenizer '
            '(data.tokenizer): tokenize every corpus with it (--mode=tokenize '
            '--config.data.tokenizer=...), then point the entries at those folders.')
    seen.append((name, key, m))


def cfg_path(items, name: str) -> str:
  return next(cfg.path for n, cfg, _ in items if n == name)


def _load(name: str, cfg, tokenizer: Tokenizer) -> Documents:
  """The entry's documents; a DataError says which entry."""
  try:
    if cfg.source == 'tokenized':
      return tokenized.TokenDocuments(cfg, tokenizer)
    return load_documents(cfg)
  except DataError as e:
    raise _in_entry(name, cfg, e) from e


def _in_entry(name: str, cfg, e: DataError) -> DataError:
  """A source's DataError, as the mixture entry `name`'s: its flags named as the entry's."""
  text = str(e)
  for key in _FIELDS[1:]:
    text = text.replace(f'--config.data.{key}', f'--config.data.mixture.{name}.{key}')
  return DataError(f'data.mixture.{name} (source={cfg.source!r}, path={cfg.path!r}): {text} '
                   '(An entry\'s empty fields take the data section\'s.)')


def _mean_tokens(docs: Documents, train_ids: np.ndarray, tokenizer: Tokenizer
                 ) -> tuple[float, bool]:
  """Mean tokens per training document (BOS included), and whether it is exact."""
  if getattr(docs, 'split_tokens', None):
    return docs.split_tokens['train'] / len(train_ids), True
  sample = np.random.default_rng(0).permutation(train_ids)[:MEAN_SAMPLE_DOCS]
  lengths = [len(tokenizer.encode_doc(docs[int(i)])) for i in sample]
  return float(np.mean(lengths)), len(sample) == len(train_ids)


def block_counts(doc_shares: np.ndarray, block: int = BLOCK) -> np.ndarray:
  """Documents of each source per block: floor(block p_s), then one more for the largest
  remainders (ties: the lower index) until they sum to `block`."""
  exact = np.asarray(doc_shares, np.float64) * block
  counts = np.floor(exact).astype(np.int64)
  rest = block - int(counts.sum())
  order = sorted(range(len(counts)), key=lambda s: (-(exact[s] - counts[s]), s))
  for s in order[:rest]:
    counts[s] += 1
  return counts


def load_sources(data_cfg, tokenizer: Tokenizer) -> list[Source]:
  """Every entry read, split and measured; everything checked before anything is read twice."""
  items = entries(data_cfg)
  _check_tokenizers(items)
  total = sum(w for _, _, w in items)
  out = []
  for index, (name, cfg, weight) in enumerate(items):
    docs = _load(name, cfg, tokenizer)
    train_ids, val_ids = split_documents(len(docs), data_cfg.val_fraction)
    mean, exact = _mean_tokens(docs, train_ids, tokenizer)
    out.append(Source(name, index, weight / total, cfg, docs, train_ids, val_ids, mean, exact))
  inverse = np.array([s.weight / s.mean_tokens for s in out])
  shares = inverse / inverse.sum()
  counts = block_counts(shares)
  for s, p, n in zip(out, shares, counts):
    s.doc_share, s.block_count = float(p), int(n)
    if n == 0:
      raise DataError(f'data.mixture.{s.name}.weight={s.weight:.3g} (normalised) gives it a '
                      f'document share of {p:.2g}, less than one document in {BLOCK}; raise its '
                      'weight or leave it out.')
  return out


class MixtureSelection(grain.transforms.DatasetSelectionMap):
  """Mixed document k -> (source, index in the source's stream): the block rule above."""

  def __init__(self, counts, seed: int, block: int = BLOCK):
    self._counts = np.asarray(counts, np.int64)
    if self._counts.sum() != block or (self._counts < 1).any():
      raise ValueError(f'block counts {self._counts} must be positive and sum to {block}.')
    self._seed, self._block = int(seed), int(block)
    self._base = np.repeat(np.arange(len(self._counts), dtype=np.int8), self._counts)
    self._cache, self._lock = {}, threading.Lock()

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k not in ('_cache', '_lock')}

  def __setstate__(self, state):
    self.__dict__.update(state, _cache={}, _lock=threading.Lock())

  def __len__(self) -> int:
    return sys.maxsize

  def block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Block b's sources [BLOCK] and each position's rank among its source's positions."""
    with self._lock:
      hit = self._cache.get(b)
    if hit is not None:
      return hit
    src = self._base[np.random.default_rng([self._seed, b]).permutation(self._block)]
    rank = np.empty(self._block, np.int64)
    for s in range(len(self._counts)):
      where = np.flatnonzero(src == s)
      rank[where] = np.arange(len(where))
    with self._lock:
      if len(self._cache) >= _CACHED_BLOCKS:
        self._cache.pop(min(self._cache))
      self._cache[b] = (src, rank)
    return src, rank

  def __getitem__(self, k: int) -> tuple[int, int]:
    b, j = divmod(int(k), self._block)
    src, rank = self.block(b)
    s = int(src[j])
    return s, int(b * self._counts[s] + rank[j])

  def documents_before(self, k: int) -> np.ndarray:
    """Documents of each source among mixed documents 0..k-1."""
    b, j = divmod(int(k), self._block)
    out = b * self._counts
    if j:
      out = out + np.bincount(self.block(b)[0][:j], minlength=len(self._counts))
    return out


_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
  """splitmix64's finaliser of a 64-bit integer."""
  x &= _M64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
  return x ^ (x >> 31)


class Permutation:
  """A pseudo-random permutation of range(n) keyed by (seed, epoch), evaluated one index at a
  time in O(1) time and memory (a corpus of a billion documents needs no shuffled index array):
  a 4-round Feistel network on 2h bits (h = max(1, ceil(bitlength(n - 1) / 2))), round r's key
  mix64((seed << 40) + (epoch << 8) + r + 0x9E3779B97F4A7C15), round function
  mix64(right ^ key) & (2^h - 1), and cycle-walking: the network is applied again while the
  result is >= n (fewer than 4 times on average)."""

  ROUNDS = 4

  def __init__(self, n: int, seed: int, epoch: int):
    self.n = int(n)
    self.half = max(1, -(-(self.n - 1).bit_length() // 2))
    self.mask = (1 << self.half) - 1
    self.keys = [mix64((int(seed) << 40) + (int(epoch) << 8) + r + 0x9E3779B97F4A7C15)
                 for r in range(self.ROUNDS)]

  def __call__(self, q: int) -> int:
    if not 0 <= q < self.n:
      raise IndexError(f'{q} is not in range({self.n})')
    x, h, mask = int(q), self.half, self.mask
    while True:
      left, right = x >> h, x & mask
      for key in self.keys:
        left, right = right, left ^ (mix64(right ^ key) & mask)
      x = (left << h) | right
      if x < self.n:
        return x


class SourceStream:
  """Source s's stream index i -> {'tokens': BOS + ids, 'source': s, 'epoch': i // T}: document
  train_ids[Permutation(T, seed_s, epoch)(i % T)] (T: its training documents)."""

  def __init__(self, docs: Documents, tokenizer: Tokenizer, source: int, train_ids: np.ndarray,
               seed: int):
    self.docs, self.tokenizer, self.source = docs, tokenizer, source
    self.train_ids, self.seed = train_ids, int(seed)
    self._perms = {}

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != '_perms'}

  def __setstate__(self, state):
    self.__dict__.update(state, _perms={})

  def doc_id(self, index: int) -> tuple[int, int]:
    """(document id, epoch) of stream index `index`."""
    epoch, q = divmod(int(index), len(self.train_ids))
    perm = self._perms.get(epoch)
    if perm is None:
      if len(self._perms) > 4:
        self._perms.clear()
      perm = self._perms[epoch] = Permutation(len(self.train_ids), self.seed, epoch)
    return int(self.train_ids[perm(q)]), epoch

  def __call__(self, index: int) -> dict:
    doc_id, epoch = self.doc_id(index)
    if getattr(self.docs, 'tokens', False):
      tokens = self.docs[doc_id]
    else:
      tokens = self.tokenizer.encode_doc(self.docs[doc_id])
    return {'tokens': tokens, 'source': self.source, 'epoch': epoch}


def mixed_documents(sources: list[Source], tokenizer: Tokenizer, seed: int,
                    derive_seed) -> grain.MapDataset:
  """The mixed stream of tagged token documents (unbounded)."""
  streams = [grain.MapDataset.range(sys.maxsize).map(SourceStream(
      s.docs, tokenizer, s.index, s.train_ids, derive_seed(seed, f'mixture/{s.name}')))
             for s in sources]
  selection = MixtureSelection([s.block_count for s in sources], derive_seed(seed, 'mixture'))
  return grain.MapDataset.select_from_datasets(streams, selection)


class ToBatch:
  """Tagged windows -> the batch of pipeline._to_batch, plus 'mixture_tokens' [S] (target
  tokens of each source) and 'mixture_epochs' [S] (1 + the highest epoch of each source's
  target tokens; 0: none), which MixtureAccounting takes out."""

  def __init__(self, num_sources: int):
    self.num_sources = num_sources

  def __call__(self, windows: list[dict]) -> dict:
    tokens_bl = np.stack([w['tokens'] for w in windows]).astype(np.int32)
    source_bl = np.stack([w['source'] for w in windows])[:, 1:]
    epoch_bl = np.stack([w['epoch'] for w in windows])[:, 1:]
    targets_bl = np.ascontiguousarray(tokens_bl[:, 1:])
    epochs = np.zeros(self.num_sources, np.int64)
    for s in range(self.num_sources):
      mine = epoch_bl[source_bl == s]
      epochs[s] = int(mine.max()) + 1 if len(mine) else 0
    return {'inputs': np.ascontiguousarray(tokens_bl[:, :-1]), 'targets': targets_bl,
            'loss_mask': np.ones(targets_bl.shape, np.float32),
            'mixture_tokens': np.bincount(source_bl.ravel(), minlength=self.num_sources),
            'mixture_epochs': epochs}


class MixtureAccounting(grain.IterDataset):
  """Takes each batch's per-source counts out and adds them up: its state is the parent's plus
  the tokens of each source trained on so far and the epochs each has begun, so a checkpoint's
  data position carries them and a resumed run counts on exactly."""

  def __init__(self, parent: grain.IterDataset, num_sources: int):
    super().__init__(parent)
    self._num_sources = num_sources

  def __iter__(self) -> grain.DatasetIterator:
    return _AccountingIterator(self._parent.__iter__(), self._num_sources)


class _AccountingIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, num_sources: int):
    super().__init__(parent)
    self._tokens, self._epochs = [0] * num_sources, [0] * num_sources

  def __next__(self) -> dict:
    batch = dict(next(self._parent))
    tokens, epochs = batch.pop('mixture_tokens'), batch.pop('mixture_epochs')
    self._tokens = [a + int(b) for a, b in zip(self._tokens, tokens)]
    self._epochs = [max(a, int(b)) for a, b in zip(self._epochs, epochs)]
    return batch

  def get_state(self) -> dict:
    return {'parent': self._parent.get_state(), 'mixture_tokens': list(self._tokens),
            'mixture_epochs': list(self._epochs)}

  def set_state(self, state: dict):
    self._parent.set_state(state['parent'])
    self._tokens = [int(x) for x in state['mixture_tokens']]
    self._epochs = [int(x) for x in state['mixture_epochs']]


def accounting(sources: list[Source], state: dict) -> dict:
  """The metrics of a MixtureAccounting state: tokens/<name> (target tokens trained on),
  share/<name> (their share of all), epochs/<name> (epochs begun)."""
  tokens, epochs = state['mixture_tokens'], state['mixture_epochs']
  total = max(sum(tokens), 1)
  out = {}
  for s in sources:
    out[f'tokens/{s.name}'] = int(tokens[s.index])
    out[f'share/{s.name}'] = tokens[s.index] / total
    out[f'epochs/{s.name}'] = int(epochs[s.index])
  return out


class ConcatDocuments(Documents):
  """Several sources' documents (each a subset by ids) as one collection."""

  def __init__(self, parts: list[tuple[Documents, np.ndarray]], name: str):
    self._parts = parts
    self._ends = np.cumsum([len(ids) for _, ids in parts])
    self.name, self.info, self.sizes = name, {}, None

  def __len__(self):
    return int(self._ends[-1]) if len(self._ends) else 0

  def __getitem__(self, i):
    p = int(np.searchsorted(self._ends, int(i), side='right'))
    docs, ids = self._parts[p]
    return docs[int(ids[int(i) - (int(self._ends[p - 1]) if p else 0)])]
