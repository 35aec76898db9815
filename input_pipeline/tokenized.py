"""Pre-tokenized data: a source tokenized once into sharded ArrayRecord files of token ids.

    python main.py --mode=tokenize --config=... --config.data.source=jsonl \
        --config.data.path='gs://b/corpus/*.jsonl' --config.data.tokenizer=... --out=gs://b/tok
    python main.py --config=... --config.data.source=tokenized --config.data.path=gs://b/tok ...

The folder (local or gs://) holds

    train-00000-of-00012.arrayrecord ...   the training split's documents, in index order
    train-00000-of-00012.json ...          its counts (documents, tokens, bytes, crc32c) and the
                                           settings that made it, written just before the shard
                                           is published
    val-00000-of-00001.arrayrecord         the held-out split's (sources.split_documents)
    manifest.json                          written last: the source, the tokenizer (name, vocab,
                                           BOS, fingerprint), the split, each shard's documents,
                                           tokens, bytes and crc32c

One record is one document's token ids exactly as `tokenizer.encode_doc` gives them (BOS
first), int32 little-endian; the files are written with 'group_size:1' (random access by record,
each record compressed on its own). Shard k of a split holds that split's documents
[k n, (k + 1) n) with n = data.shard_documents, so the boundaries are known before anything is
tokenized: the shards are independent (tokenized in parallel, one process per core; with one
worker, in this process), and a rerun after a kill skips the shards already published and intact
(their counts from their .json files, their size, content checksum (crc32c) and record count
checked: shard_checks.py) and
writes the same bytes for the rest and for a damaged one. A shard is written to a local temporary
file and published whole (renamed, or uploaded as one object), so a partial shard is never under its
final name; a rerun removes a killed run's temporary files; the manifest appears only when every
shard is there. A rerun on a folder of other data (another tokenizer, split, document count or
data.shard_documents) is refused.

Training from the folder (`data.source='tokenized'`, `TokenDocuments`) sees the source's document
index space: document i of the source is a record (train shards first, then validation), the
split is recomputed from the manifest's document count and val_fraction, and everything after
tokenization (the order, packing, shuffling, each process's share of the documents, the saved
iterator position) is build_data's, so the batches are those of training from the source.
Each process reads only its own documents' records (random access by record); a shard is opened
when one of them is first read. The run's data.tokenizer must be the one the folder was made
with: the same token ids for a fixed text (`tokenizer_fingerprint`), whatever its file is called.
"""

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

import numpy as np

from gated_attention import storage
from gated_attention.input_pipeline import shard_checks
from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.sources import Documents, load_documents, split_documents
from gated_attention.input_pipeline.tokenizer import Tokenizer, make_tokenizer

MANIFEST = 'manifest.json'
FORMAT = 1
_EXT = 'arrayrecord'
# A killed run's leftovers in --out: a shard, its counts or the manifest under a temporary name.
_STALE = re.compile(r'^(?:(?:train|val)-\d{5}-of-\d{5}\.(?:arrayrecord|json)|manifest\.json)'
                    r'\.tmp\d*$')
# Text whose token ids identify a tokenizer (the name alone does not: 'hf:tokenizer.json').
_PROBE = ('The quick brown fox jumps over the lazy dog. 0123456789 +-*/=<>()[]{} '
          'def f(x):\n    return x ** 2  # déjà vu, naïve, Ελληνικά, русский, 日本語, 한국어, 🙂\n'
          'https://example.com/a?b=c&d=e  \t tabs, CamelCase, snake_case, UPPER, ...!?')
_PROGRESS_DOCS = 64  # a worker adds its documents and tokens to the progress bar this often


def shard_name(split: str, k: int, n: int) -> str:
  return f'{split}-{k:05d}-of-{n:05d}.{_EXT}'


def counts_name(shard: str) -> str:
  """The shard's counts file, written before the shard is published: 'train-00000-of-00012.json'
  holds its documents, tokens and the settings that made it."""
  return shard[:-len(_EXT)] + 'json'


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
  """sha256 of the vocabulary size, BOS, the token ids of a fixed text and the text of the whole
  vocabulary (every id decoded, in order): equal for the same tokenizer wherever its file is and
  whatever it is called, different for another."""
  ids = np.asarray(tokenizer.encode_doc(_PROBE), '<i4')
  try:
    vocab = tokenizer.decode(np.arange(tokenizer.vocab_size))
  except Exception:  # pylint: disable=broad-except  # a tokenizer that cannot decode some ids
    vocab = ''
  head = f'{tokenizer.vocab_size}/{tokenizer.bos_id}/'.encode()
  return hashlib.sha256(head + ids.tobytes() + vocab.encode('utf-8', 'replace')).hexdigest()[:16]


def _plan(train_ids: np.ndarray, val_ids: np.ndarray, per_shard: int) -> list[tuple]:
  """[(split, k, n, document ids)] of every shard."""
  plan = []
  for split, ids in (('train', train_ids), ('val', val_ids)):
    n = max(1, -(-len(ids) // per_shard))
    plan += [(split, k, n, ids[k * per_shard:(k + 1) * per_shard]) for k in range(n)]
  return plan


# --- the worker processes ----------------------------------------------------------------------

_WORKER = {}  # a worker process's documents, tokenizer and progress counters (_init_worker)


def _init_worker(docs: Documents, tokenizer: Tokenizer, progress, parent: int):
  """Each worker's state, given once (not with every shard). Ctrl-C stops the parent, which
  prints one line; the workers ignore it and die with the parent (Linux: PR_SET_PDEATHSIG), so a
  kill of the command leaves no process writing behind it."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if sys.platform.startswith('linux'):
    try:
      import ctypes  # pylint: disable=g-import-not-at-top
      ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
      pass
  if os.getppid() != parent:  # the parent died before the line above
    os._exit(1)  # pylint: disable=protected-access
  _WORKER.update(docs=docs, tokenizer=tokenizer, progress=progress)


def _add_progress(docs: int, tokens: int):
  progress = _WORKER.get('progress')
  if progress is not None:
    with progress.get_lock():
      progress[0] += docs
      progress[1] += tokens


def _write_shard(ids: np.ndarray, out: str, name: str, counts: dict,
                 tmp_dir: str | None) -> tuple[str, int, int, int, str]:
  """Tokenizes documents `ids` into the shard `out`/`name`: written to a local temporary file,
  its counts file written, then the shard published whole (a rename, or one object upload), so a
  shard under its final name is always complete and has its counts. (name, documents, tokens,
  bytes, crc32c)."""
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  docs, tokenizer = _WORKER['docs'], _WORKER['tokenizer']
  target = storage.join(out, name)
  tmp = os.path.join(tmp_dir, name) if tmp_dir else target
  tmp = f'{tmp}.tmp{os.getpid()}'
  try:
    writer = ar.ArrayRecordWriter(tmp, 'group_size:1')
    tokens = step_docs = step_tokens = 0
    for i in ids:
      ids_n = np.asarray(tokenizer.encode_doc(docs[int(i)]), '<i4')
      writer.write(ids_n.tobytes())
      tokens += len(ids_n)
      step_docs, step_tokens = step_docs + 1, step_tokens + len(ids_n)
      if step_docs == _PROGRESS_DOCS:
        _add_progress(step_docs, step_tokens)
        step_docs = step_tokens = 0
    writer.close()
    nbytes = os.path.getsize(tmp)             # checked by a rerun and by training
    checksum = storage.crc32c(tmp)            # so is the content (gs://: the object's own)
    storage.write(storage.join(out, counts_name(name)), json.dumps(
        {'documents': len(ids), 'tokens': tokens, 'bytes': nbytes, 'crc32c': checksum,
         **counts}, indent=1, sort_keys=True))
    if tmp_dir:
      storage.upload_file(tmp, target)        # one object, uploaded once complete
    else:
      os.replace(tmp, target)                 # a partial shard never has the final name
    _add_progress(step_docs, step_tokens)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return name, len(ids), tokens, nbytes, checksum


# --- the command -------------------------------------------------------------------------------

def _local_tmp_dir(out: str) -> str:
  """Where the shards of a remote --out are written before their upload: one folder per --out,
  emptied by every run (a killed run's files go with it)."""
  key = hashlib.sha256(out.rstrip('/').encode()).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), 'gated_attention_tokenize', key)
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(path)
  return path


def tokenize(data_cfg, out: str, *, workers: int | None = None, progress: bool = True) -> dict:
  """Tokenizes the source of `data_cfg` into shards under `out` (see the module docstring);
  returns the manifest. Shards already there are kept (a resumed run); the manifest is written
  last. `workers` processes (default: one per core) tokenize one shard each at a time."""
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
  # What makes a shard's bytes (the source's path may be written differently on a rerun).
  counts = {'format': FORMAT, 'source': data_cfg.source, 'num_documents': len(docs),
            'val_fraction': float(data_cfg.val_fraction), 'shard_documents': per_shard,
            'tokenizer_fingerprint': tokenizer_fingerprint(tokenizer)}
  listed = shard_checks.listing(out)          # name -> (bytes, crc32c on gs://)
  have = {name: size for name, (size, _) in listed.items()}
  for name in sorted(have):
    if _STALE.match(name):    # a killed run's unfinished file (local: a temporary name)
      storage.remove(storage.join(out, name))
  planned = [(shard_name(s, k, n), counts_name(shard_name(s, k, n)), len(ids))
             for s, k, n, ids in plan]
  done, damaged = shard_checks.check_published(out, planned, listed, counts)
  for name, why in sorted(damaged.items()):   # written again below, with the missing ones
    print(f'Warning: {storage.join(out, name)} is damaged ({why}); writing it again.',
          file=sys.stderr, flush=True)
    storage.remove(storage.join(out, name))
    if counts_name(name) in have:
      storage.remove(storage.join(out, counts_name(name)))
  todo = [(split, k, n, ids) for split, k, n, ids in plan if shard_name(split, k, n) not in done]
  initial = sum(found[0] for found in done.values())
  bar = _bar(len(docs), initial, progress)
  try:
    if todo:
      _run(todo, docs, tokenizer, out, counts, workers, bar, initial, done)
  finally:
    bar.close()
  manifest = {
      'format': FORMAT, 'source': data_cfg.source, 'path': data_cfg.path,
      'text_field': data_cfg.get('text_field', ''),
      **({'hf_config': data_cfg.get('hf_config', ''), 'hf_split': data_cfg.get('hf_split', '')}
         if data_cfg.source == 'hf' else {}),
      'tokenizer': tokenizer.name,
      'data_tokenizer': data_cfg.tokenizer, 'vocab_size': tokenizer.vocab_size,
      'bos_id': int(tokenizer.bos_id), 'tokenizer_fingerprint': counts['tokenizer_fingerprint'],
      'num_documents': len(docs), 'val_fraction': float(data_cfg.val_fraction),
      'shard_documents': per_shard,
      'shards': {'train': [], 'val': []},
  }
  for split, k, n, _ in plan:
    name = shard_name(split, k, n)
    documents, tokens, nbytes, checksum = done[name]
    manifest['shards'][split].append({'name': name, 'documents': documents, 'tokens': tokens,
                                      'bytes': nbytes, 'crc32c': checksum})
  manifest['num_shards'] = {split: len(shards) for split, shards in manifest['shards'].items()}
  manifest['num_tokens'] = {split: sum(s['tokens'] for s in shards)
                            for split, shards in manifest['shards'].items()}
  storage.write(storage.join(out, MANIFEST), json.dumps(manifest, indent=1))
  return manifest


def _run(todo: list[tuple], docs: Documents, tokenizer: Tokenizer, out: str, counts: dict,
         workers: int | None, bar, initial: int, done: dict):
  """The shards of `todo`, by `workers` processes; `done` gets each as it is published."""
  tmp_dir = _local_tmp_dir(out) if storage.is_remote(out) else None
  workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
  if workers == 1:   # in this process: nothing to gain from a fork, and a process that has used
    _run_here(todo, docs, tokenizer, out, counts, bar, done, tmp_dir)  # array_record's thread
    return                                 # pool cannot fork safely (its child crashed writing)
  ctx = multiprocessing.get_context()
  progress = ctx.Array('q', 2)            # documents, tokens written by the workers
  pool = concurrent.futures.ProcessPoolExecutor(
      max_workers=workers, mp_context=ctx, initializer=_init_worker,
      initargs=(docs, tokenizer, progress, os.getpid()))
  start, shown = time.time(), initial
  try:
    pending = {pool.submit(_write_shard, ids, out, shard_name(split, k, n), counts, tmp_dir)
               for split, k, n, ids in todo}
    while pending:
      finished, pending = concurrent.futures.wait(
          pending, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED)
      for future in finished:
        name, *found = future.result()
        done[name] = tuple(found)            # documents, tokens, bytes, crc32c
      with progress.get_lock():
        n_docs, n_tokens = progress[0], progress[1]
      bar.update(initial + n_docs - shown)
      shown = initial + n_docs
      seconds = max(time.time() - start, 1e-9)
      bar.set_postfix_str(f'{_si(n_tokens / seconds)} tokens/s, {_si(n_tokens)} tokens, '
                          f'shards {len(done)}/{len(done) + len(pending)}', refresh=False)
  finally:   # an error: the shards not started are not started
    pool.shutdown(wait=True, cancel_futures=True)
    if tmp_dir:
      shutil.rmtree(tmp_dir, ignore_errors=True)


def _run_here(todo: list[tuple], docs: Documents, tokenizer: Tokenizer, out: str, counts: dict,
              bar, done: dict, tmp_dir: str | None):
  """The shards of `todo`, one after the other in this process."""
  _WORKER.update(docs=docs, tokenizer=tokenizer, progress=None)
  try:
    for split, k, n, ids in todo:
      name, *found = _write_shard(ids, out, shard_name(split, k, n), counts, tmp_dir)
      done[name] = tuple(found)              # documents, tokens, bytes, crc32c
      bar.update(found[0])
  finally:
    _WORKER.clear()
    if tmp_dir:
      shutil.rmtree(tmp_dir, ignore_errors=True)


def _si(x: float) -> str:
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm.format_sizeof(x)


def _bar(total: int, initial: int, enabled: bool):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=total, initial=initial, unit='doc', unit_scale=True, disable=not enabled,
              dynamic_ncols=True, desc='tokenize')


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
    # The same token ids of a fixed text, not the same name: 'hf:tokenizer.json' names any BPE.
    if (m['vocab_size'], m['bos_id'], m['tokenizer_fingerprint']) != (
        tokenizer.vocab_size, tokenizer.bos_id, tokenizer_fingerprint(tokenizer)):
      raise DataError(
          f'{self.path} was tokenized with {m["tokenizer"]} (data.tokenizer='
          f'{m["data_tokenizer"]!r}, {m["vocab_size"]} tokens, fingerprint '
          f'{m["tokenizer_fingerprint"]}), but this run\'s data.tokenizer={data_cfg.tokenizer!r} '
          f'is {tokenizer.name} ({tokenizer.vocab_size} tokens, fingerprint '
          f'{tokenizer_fingerprint(tokenizer)}): another tokenizer. Set --config.data.tokenizer '
          'to the one it was tokenized with, or tokenize again with this one.')
    if float(data_cfg.val_fraction) != m['val_fraction']:
      raise DataError(f'{self.path} was split with data.val_fraction={m["val_fraction"]}; this '
                      f'run asks {data_cfg.val_fraction}. Set --config.data.val_fraction='
                      f'{m["val_fraction"]} (the split is fixed when tokenizing).')
    self.name = f'data.path={self.path!r} (tokenized from {m["source"]} {m["path"]!r})'
    self.info = {'files': sum(len(s) for s in m['shards'].values()),
                 'tokenized_from': {'source': m['source'], 'path': m['path']}}
    self.sizes = None
    self.split_tokens = {split: int(m['num_tokens'][split]) for split in ('train', 'val')}
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
    listed = shard_checks.listing(self.path)  # name -> (bytes, crc32c on gs://)
    missing = [s['name'] for split in ('train', 'val') for s in m['shards'][split]
               if s['name'] not in listed]
    if missing:
      raise DataError(f'{self.path} lacks {len(missing)} of the shards its manifest lists '
                      f'({", ".join(missing[:3])}{", ..." if len(missing) > 3 else ""}); run the '
                      '--mode=tokenize command that wrote it again (it writes only what is '
                      'missing), or set --config.data.path to a complete folder.')
    shard_checks.check_shards(self.path, m['shards']['train'] + m['shards']['val'], listed, m)
    self._manifest = m
    self._names = [s['name'] for split in ('train', 'val') for s in m['shards'][split]]
    self._ends = np.cumsum([s['documents'] for split in ('train', 'val')
                            for s in m['shards'][split]])
    # 'file[0:n]': the record counts from the manifest, so no shard is opened before it is read
    # (each process opens only the shards of the documents it reads, when it first reads one)
    self._files = [f'{storage.join(self.path, s["name"])}[0:{s["documents"]}]'
                   for split in ('train', 'val') for s in m['shards'][split]]
    self._src, self._lock = None, threading.Lock()

  def _source(self):
    if self._src is None:
      with self._lock:      # grain's reader threads
        if self._src is None:
          import grain  # pylint: disable=g-import-not-at-top
          try:
            self._src = grain.sources.ArrayRecordDataSource(self._files)
          except Exception as e:  # pylint: disable=broad-except
            raise DataError(f'{self.name}: cannot open its shards ({e}); tokenize again.') from e
    return self._src

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k not in ('_src', '_lock')}

  def __setstate__(self, state):
    self.__dict__.update(state, _src=None, _lock=threading.Lock())

  def __len__(self):
    return self._n

  def __getitem__(self, i) -> np.ndarray:
    record = int(self._record[int(i)])
    try:
      raw = self._source()[record]
    except DataError:
      raise
    except Exception as e:  # pylint: disable=broad-except  # array_record: RuntimeError
      shard = self._names[int(np.searchsorted(self._ends, record, side='right'))]
      raise shard_checks.unreadable(self.path, shard, e, self._manifest) from e
    return np.frombuffer(raw, '<i4').astype(np.int32)
