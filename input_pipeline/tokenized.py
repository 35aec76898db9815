"""Pre-tokenized data: a source tokenized once into sharded ArrayRecord files of token ids.

    python main.py --mode=tokenize --config=... --config.data.source=jsonl \
        --config.data.path='gs://b/corpus/*.jsonl' --config.data.tokenizer=... --out=gs://b/tok
    python main.py --config=... --config.data.source=tokenized --config.data.path=gs://b/tok ...

The folder (local or gs://) holds

    train-00000-of-00012.arrayrecord ...   the training split's documents, in index order
    val-00000-of-00001.arrayrecord         the held-out split's (sources.split_documents)
    manifest.json                          written last: the source, the tokenizer, the split, the
                                           shards with their documents and tokens

One record is one document's token ids exactly as `tokenizer.encode_doc` gives them (BOS
first), int32 little-endian. Shard k of a split holds that split's documents [k n, (k + 1) n)
with n = data.shard_documents, so the boundaries are known before anything is tokenized: the
shards are independent (tokenized in parallel, one process per core), a rerun after a kill skips
the shards already published and writes the same bytes for the rest (a shard is written to a
local temporary file and published whole: renamed, or uploaded as one object), and the manifest
appears only when every shard is there.

Training from the folder (`data.source='tokenized'`, `TokenDocuments`) sees the source's document
index space: document i of the source is a record (train shards first, then validation), the
split is recomputed from the manifest's document count and val_fraction, and everything after
tokenization (the order, packing, shuffling, each process's share of the documents, the saved
iterator position) is build_data's, so the batches are those of training from the source.
Each process reads only its own documents' records (random access by record).
"""

import concurrent.futures
import json
import os
import shutil
import tempfile
import time

import numpy as np

from gated_attention import storage
from input_pipeline.errors import DataError
from input_pipeline.sources import Documents, load_documents, split_documents
from input_pipeline.tokenizer import Tokenizer, make_tokenizer

MANIFEST = 'manifest.json'
FORMAT = 1
_EXT = 'arrayrecord'


def shard_name(split: str, k: int, n: int) -> str:
  return f'{split}-{k:05d}-of-{n:05d}.{_EXT}'


def _plan(train_ids: np.ndarray, val_ids: np.ndarray, per_shard: int) -> list[tuple]:
  """[(split, k, n, document ids)] of every shard."""
  plan = []
  for split, ids in (('train', train_ids), ('val', val_ids)):
    n = max(1, -(-len(ids) // per_shard))
    plan += [(split, k, n, ids[k * per_shard:(k + 1) * per_shard]) for k in range(n)]
  return plan


def _write_shard(docs: Documents, tokenizer: Tokenizer, ids: np.ndarray, out: str,
                 name: str) -> tuple[str, int, int]:
  """Tokenizes documents `ids` into the shard `out`/`name`, published whole; (name, documents,
  tokens). A worker process's job."""
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  target = storage.join(out, name)
  tmp_dir = (tempfile.mkdtemp(prefix='gated_attention_shard_') if storage.is_remote(out)
             else None)
  tmp = os.path.join(tmp_dir, name) if tmp_dir else f'{target}.tmp{os.getpid()}'
  try:
    writer = ar.ArrayRecordWriter(tmp, 'group_size:1')
    tokens = 0
    for i in ids:
      ids_n = np.asarray(tokenizer.encode_doc(docs[int(i)]), '<i4')
      writer.write(ids_n.tobytes())
      tokens += len(ids_n)
    writer.close()
    if tmp_dir:
      storage.upload_tree(tmp_dir, out)       # one object, uploaded once complete
    else:
      os.replace(tmp, target)                 # a partial shard never has the final name
  finally:
    if tmp_dir:
      shutil.rmtree(tmp_dir, ignore_errors=True)
    elif os.path.exists(tmp):
      os.remove(tmp)
  return name, len(ids), tokens


def _count(path: str) -> tuple[int, int]:
  """(documents, tokens) of a published shard."""
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  reader = ar.ArrayRecordReader(path)
  try:
    n = reader.num_records()
    return n, sum(len(r) // 4 for r in reader.read(list(range(n)))) if n else 0
  finally:
    reader.close()


def tokenize(data_cfg, out: str, *, workers: int | None = None, progress: bool = True) -> dict:
  """Tokenizes the source of `data_cfg` into shards under `out` (see the module docstring);
  returns the manifest. Shards already there are kept (a resumed run); the manifest is written
  last."""
  if data_cfg.source in ('tokenized', 'synthetic'):
    raise DataError(f"--mode=tokenize reads a text source; data.source={data_cfg.source!r} is not "
                    'one (set --config.data.source to text, jsonl, parquet, arrayrecord, ...).')
  per_shard = int(data_cfg.get('shard_documents', 0))
  if per_shard < 1:
    raise DataError(f'data.shard_documents={per_shard} must be positive (documents per shard).')
  storage.check_reachable(out, write=True)
  storage.makedirs(out)
  tokenizer = make_tokenizer(data_cfg.tokenizer)
  docs = load_documents(data_cfg)
  train_ids, val_ids = split_documents(len(docs), data_cfg.val_fraction)
  plan = _plan(train_ids, val_ids, per_shard)
  have = set(storage.listdir(out))
  for name in have:             # a killed run's unfinished shard (local: a temporary name)
    if f'.{_EXT}.tmp' in name:
      storage.remove(storage.join(out, name))
  todo = [(split, k, n, ids) for split, k, n, ids in plan if shard_name(split, k, n) not in have]
  done = {}                     # name -> (documents, tokens)
  for split, k, n, ids in plan:
    name = shard_name(split, k, n)
    if name in have:
      count = _count(storage.join(out, name))
      if count[0] != len(ids):
        raise DataError(f'{storage.join(out, name)} holds {count[0]} documents, not the '
                        f'{len(ids)} this source and data.shard_documents put there: --out holds '
                        'shards of other data or settings. Use another --out.')
      done[name] = count
  bar = _bar(len(docs), sum(n_docs for n_docs, _ in done.values()), progress)
  workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
  start, tokens_new = time.time(), 0
  if todo:
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
      futures = [pool.submit(_write_shard, docs, tokenizer, ids, out, shard_name(split, k, n))
                 for split, k, n, ids in todo]
      for future in concurrent.futures.as_completed(futures):
        name, n_docs, n_tokens = future.result()
        done[name] = (n_docs, n_tokens)
        tokens_new += n_tokens
        bar.update(n_docs)
        bar.set_postfix_str(f'{tokens_new / max(time.time() - start, 1e-9):,.0f} tokens/s')
  bar.close()
  manifest = {
      'format': FORMAT, 'source': data_cfg.source, 'path': data_cfg.path,
      'text_field': data_cfg.get('text_field', ''), 'tokenizer': tokenizer.name,
      'data_tokenizer': data_cfg.tokenizer, 'vocab_size': tokenizer.vocab_size,
      'bos_id': int(tokenizer.bos_id), 'num_documents': len(docs),
      'val_fraction': float(data_cfg.val_fraction), 'shard_documents': per_shard,
      'shards': {split: [dict(name=shard_name(split, k, n), documents=done[shard_name(split, k, n)][0],
                              tokens=done[shard_name(split, k, n)][1])
                         for s, k, n, _ in plan if s == split] for split in ('train', 'val')},
  }
  manifest['num_tokens'] = {split: sum(s['tokens'] for s in shards)
                            for split, shards in manifest['shards'].items()}
  storage.write(storage.join(out, MANIFEST), json.dumps(manifest, indent=1))
  return manifest


def _bar(total: int, initial: int, enabled: bool):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=total, initial=initial, unit='doc', disable=not enabled, dynamic_ncols=True)


def read_manifest(path: str) -> dict:
  manifest_path = storage.join(path, MANIFEST)
  if not storage.isfile(manifest_path):
    raise DataError(f"data.source='tokenized' reads the folder written by --mode=tokenize; "
                    f'{path!r} has no {MANIFEST} (is the tokenization finished? run it again: it '
                    'resumes). Set --config.data.path to that folder.')
  try:
    manifest = json.loads(storage.read_bytes(manifest_path))
  except ValueError as e:
    raise DataError(f'{manifest_path} is unreadable ({e}); run --mode=tokenize again.') from e
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    raise DataError(f'{manifest_path} is not a manifest of format {FORMAT}; tokenize again.')
  return manifest


class TokenDocuments(Documents):
  """The documents of a tokenized folder, in the source's index space: `docs[i]` is document
  i's token ids (int32, BOS first). `tokens = True` tells the pipeline not to encode them."""

  tokens = True

  def __init__(self, data_cfg, tokenizer: Tokenizer):
    self.path = data_cfg.path
    m = read_manifest(self.path)
    if (m['tokenizer'], m['vocab_size']) != (tokenizer.name, tokenizer.vocab_size):
      raise DataError(
          f'{self.path} was tokenized with {m["tokenizer"]} ({m["vocab_size"]} tokens, '
          f'data.tokenizer={m["data_tokenizer"]!r}), but this run\'s data.tokenizer is '
          f'{tokenizer.name} ({tokenizer.vocab_size} tokens); set --config.data.tokenizer to the '
          'one it was tokenized with, or tokenize again with this one.')
    if float(data_cfg.val_fraction) != m['val_fraction']:
      raise DataError(f'{self.path} was split with data.val_fraction={m["val_fraction"]}; this '
                      f'run asks {data_cfg.val_fraction}. Set --config.data.val_fraction='
                      f'{m["val_fraction"]} (the split is fixed when tokenizing).')
    self.name = f'data.path={self.path!r} (tokenized from {m["source"]} {m["path"]!r})'
    self.info = {'files': sum(len(s) for s in m['shards'].values()),
                 'tokenized_from': {'source': m['source'], 'path': m['path']},
                 'tokens': m['num_tokens']}
    self.sizes = None
    self._n = int(m['num_documents'])
    train_ids, val_ids = split_documents(self._n, m['val_fraction'])
    counts = {split: sum(s['documents'] for s in m['shards'][split]) for split in m['shards']}
    if (counts['train'], counts['val']) != (len(train_ids), len(val_ids)):
      raise DataError(f'{self.path}: the manifest\'s shards hold {counts} documents, not the '
                      f'split of {self._n}; the folder is damaged: tokenize again.')
    # record of document i: train documents first (their rank), then the held-out ones
    self._record = np.empty(self._n, np.int64)
    self._record[train_ids] = np.arange(len(train_ids))
    self._record[val_ids] = len(train_ids) + np.arange(len(val_ids))
    self._files = [storage.join(self.path, s['name']) for split in ('train', 'val')
                   for s in m['shards'][split]]
    self._src = None

  def _source(self):
    if self._src is None:
      import grain  # pylint: disable=g-import-not-at-top
      try:
        self._src = grain.sources.ArrayRecordDataSource(self._files)
      except Exception as e:  # pylint: disable=broad-except
        raise DataError(f'{self.name}: cannot open its shards ({e}); tokenize again.') from e
    return self._src

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != '_src'} | {'_src': None}

  def __len__(self):
    return self._n

  def __getitem__(self, i) -> np.ndarray:
    return np.frombuffer(self._source()[int(self._record[int(i)])], '<i4').astype(np.int32)
