"""Document sources: random-access collections of text documents, and the train/val split.

Each source is a `Documents`: `len(docs)`, `docs[i] -> str`, `docs.name` (for messages),
`docs.info` (sizes for describe()) and `docs.sizes` (bytes per document, or None).
`load_documents(data_cfg)` builds the one named by `data.source`; nothing is tokenized here.
`synthetic` has no documents to load: pipeline.build_data generates them (synthetic.py).
"""

import fnmatch
import importlib
import json
import os
import re
import sysconfig

import numpy as np

from gated_attention import storage
from gated_attention.input_pipeline.errors import DataError

SOURCES = ('builtin', 'builtin_large', 'text', 'jsonl', 'parquet', 'arrayrecord', 'hf', 'synthetic',
           'tokenized')
_NUM_CHECKED = 32  # documents read at build time so that bad data fails before training


class Documents:
  """Base class: random access to documents as strings."""

  name: str = ''
  info: dict = {}
  sizes: np.ndarray | None = None  # bytes per document, when known without reading

  def __len__(self) -> int:
    raise NotImplementedError

  def __getitem__(self, i: int) -> str:
    raise NotImplementedError


class FileDocs(Documents):
  """One document per file."""

  def __init__(self, paths: list[str], name: str, errors: str = 'strict',
               sizes: dict[str, int] | None = None):
    self.paths, self.name, self._errors = paths, name, errors
    sizes = sizes or {}
    self.sizes = np.array([sizes[p] if p in sizes else storage.getsize(p) for p in paths],
                          np.int64)
    self.info = {'files': len(paths), 'megabytes': round(float(self.sizes.sum()) / 1e6, 2)}

  def __len__(self):
    return len(self.paths)

  def __getitem__(self, i):
    path = self.paths[i]
    try:
      return storage.read_bytes(path).decode('utf-8', self._errors)
    except (OSError, UnicodeError) as e:
      raise DataError(f'{self.name}: cannot read {path!r} as UTF-8 text ({e}); fix or remove the '
                      'file, or narrow --config.data.path.') from e


class JsonlDocs(Documents):
  """One document per non-blank line of JSON-lines files: the line's `field`."""

  def __init__(self, paths: list[str], field: str, name: str, sizes: dict[str, int] | None = None):
    self.paths, self.field, self.name = paths, field, name
    sizes = dict(sizes or {})
    for p in paths:
      if p not in sizes:
        sizes[p] = storage.getsize(p)
    spans = _line_spans(paths, sizes, name)
    self._file = np.concatenate([np.full(len(s[0]), k, np.int32) for k, s in enumerate(spans)])
    self._start, self._end, self._line = (np.concatenate([s[j] for s in spans]) for j in range(3))
    self.sizes = self._end - self._start
    self.info = {'files': len(paths), 'megabytes': round(sum(sizes[p] for p in paths) / 1e6, 2)}

  def __len__(self):
    return len(self._start)

  def __getitem__(self, i):
    path = self.paths[self._file[i]]
    start, end = int(self._start[i]), int(self._end[i])
    if storage.is_remote(path):      # one ranged GET: no metadata requests, no read-ahead
      raw = _remote_ranges(self.name, [path], [start], [end])[0]
    else:
      with open(path, 'rb') as f:
        f.seek(start)
        raw = f.read(end - start)
    return _json_text(raw, self.field, f'{path}, line {self._line[i]}')


_BLOCK = 64 << 20    # at most this many bytes of remote JSON-lines files read at a time


def _remote_ranges(name: str, paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
  """Bytes [start, end) of each remote file, fetched concurrently; a DataError naming the file
  that cannot be read."""
  fs, _ = storage.filesystem(paths[0])
  try:
    out = fs.cat_ranges([storage.filesystem(p)[1] for p in paths], starts, ends)
  except Exception as e:  # pylint: disable=broad-except  # the client as a whole failed
    out = [e] * len(paths)
  for path, got in zip(paths, out):
    if isinstance(got, BaseException):
      gone = isinstance(got, FileNotFoundError)
      raise DataError(
          f'{name}: cannot read {path!r} ({type(got).__name__}: {got}); '
          + ('it was removed or renamed after data.path was listed: restore it, or rerun to '
             'list data.path again.' if gone else
             'check that the object exists and that your credentials may read it, or narrow '
             '--config.data.path.')) from got
  return out


def _line_spans(paths: list[str], sizes: dict[str, int],
                name: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """For each file: byte [start, end) and 1-based line number of each non-blank line."""
  remote = [p for p in paths if storage.is_remote(p) and sizes[p] > 0]
  found = _remote_newlines(remote, sizes, name) if remote else {}
  spans = []
  for path in paths:
    size = sizes[path] if storage.is_remote(path) else storage.getsize(path)  # local: as now
    if size == 0:
      spans.append((np.zeros(0, np.int64),) * 3)
      continue
    if path in found:                 # no memmap on object storage: read in blocks
      newlines, before = found[path]
    else:
      buf_n = np.memmap(path, np.uint8, mode='r')
      newlines = np.flatnonzero(buf_n == ord('\n'))
      before = buf_n[np.maximum(np.concatenate([newlines, [size]]) - 1, 0)]
    start = np.concatenate([[0], newlines + 1])
    end = np.concatenate([newlines, [size]])
    line = np.arange(1, len(start) + 1)
    crlf = (end > start) & (before == ord('\r'))     # `before`: the byte before each end
    keep = (end - crlf) > start
    spans.append((start[keep].astype(np.int64), end[keep].astype(np.int64), line[keep]))
  return spans


def _remote_newlines(paths: list[str], sizes: dict[str, int],
                     name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{file: (offsets of its newlines, the byte before each line's end)} of remote files, each
  read once: blocks of at most _BLOCK bytes, fetched concurrently in batches of at most _BLOCK
  bytes (thousands of small files cost a few round trips, not one each; big files stream)."""
  chunks = [(p, s, min(s + _BLOCK, sizes[p])) for p in paths for s in range(0, sizes[p], _BLOCK)]
  batches, batch, total = [], [], 0
  for c in chunks:
    if batch and total + c[2] - c[1] > _BLOCK:
      batches.append(batch)
      batch, total = [], 0
    batch.append(c)
    total += c[2] - c[1]
  batches += [batch] if batch else []
  newlines = {p: [] for p in paths}
  before = {p: [] for p in paths}
  last = dict.fromkeys(paths, 0)     # the last byte read of each file so far
  for batch in batches:
    blocks = _remote_ranges(name, *map(list, zip(*batch)))
    for (path, offset, _), block in zip(batch, blocks):
      buf = np.frombuffer(block, np.uint8)
      if not len(buf):
        continue
      found = np.flatnonzero(buf == ord('\n'))
      prev = np.concatenate([[last[path]], buf[:-1]])   # the byte before each byte of the block
      newlines[path].append(found + offset)
      before[path].append(prev[found])
      last[path] = int(buf[-1])
  return {p: (np.concatenate(newlines[p] + [np.zeros(0, np.int64)]).astype(np.int64),
              np.concatenate(before[p] + [[last[p]]]).astype(np.uint8)) for p in paths}


def _json_type(v) -> str:
  return {bool: 'boolean', int: 'number', float: 'number', str: 'string', list: 'array',
          dict: 'object', type(None): 'null'}.get(type(v), type(v).__name__)


def _json_text(raw: bytes, field: str, where: str) -> str:
  """The string `field` of the JSON object `raw`; `where` names it in errors."""
  try:
    obj = json.loads(raw)
  except ValueError as e:
    raise DataError(f'{where}: not valid JSON ({e}).') from e
  if isinstance(obj, dict) and field in obj and not isinstance(obj[field], str):
    value = json.dumps(obj[field])
    raise DataError(f'{where}: field {field!r} holds a JSON {_json_type(obj[field])} '
                    f'({value if len(value) <= 40 else value[:40] + "..."}), not a string; set '
                    '--config.data.text_field to the key that holds the text.')
  if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
    found = f'keys {sorted(obj)}' if isinstance(obj, dict) else f'a JSON {_json_type(obj)}'
    raise DataError(f'{where}: no string field {field!r} (found {found}); set '
                    '--config.data.text_field to the key that holds the text.')
  return obj[field]


def _megabytes(paths: list[str], sizes: dict[str, int] | None) -> float:
  """Total size of the files: from the listing where it gave them, else one lookup each."""
  sizes = sizes or {}
  return round(sum(sizes[p] if p in sizes else storage.getsize(p) for p in paths) / 1e6, 2)


class ParquetDocs(Documents):
  """One document per row of parquet files: column `field` (needs pyarrow)."""

  def __init__(self, paths: list[str], field: str, name: str, sizes: dict[str, int] | None = None):
    self.paths, self.field, self.name = paths, field, name
    self._load()
    self.info = {'files': len(paths), 'megabytes': _megabytes(paths, sizes)}

  def _load(self):
    pq = _need('pyarrow.parquet', 'pyarrow', 'parquet')
    self._chunks = []
    for path in self.paths:
      try:
        if storage.is_remote(path):   # ranged reads through the bucket's file system
          fs, p = storage.filesystem(path)
          names = pq.read_schema(p, filesystem=fs).names
          if self.field in names:
            self._chunks += pq.read_table(p, columns=[self.field],
                                          filesystem=fs)[self.field].chunks
        else:
          names = pq.read_schema(path).names
          if self.field in names:
            self._chunks += pq.read_table(path, columns=[self.field],
                                          memory_map=True)[self.field].chunks
      except Exception as e:  # pylint: disable=broad-except
        raise DataError(f'{self.name}: cannot read {path!r} as parquet ({e}).') from e
      if self.field not in names:
        raise DataError(f'{path!r} has no column {self.field!r} (columns: {names}); set '
                        '--config.data.text_field to the column that holds the text.')
    self._offsets = np.cumsum([0] + [len(c) for c in self._chunks])

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != '_chunks'}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._load()

  def __len__(self):
    return int(self._offsets[-1])

  def __getitem__(self, i):
    c = int(np.searchsorted(self._offsets, i, side='right')) - 1
    text = self._chunks[c][i - int(self._offsets[c])].as_py()
    if not isinstance(text, (str, type(None))):
      raise DataError(f'{self.name}: column {self.field!r} holds {type(text).__name__}, not text.')
    return text or ''


class ArrayRecordDocs(Documents):
  """One document per ArrayRecord record: raw UTF-8 text, or JSON objects with `field`.

  The first record decides: if it is a JSON object with `field`, all records are JSON.
  """

  def __init__(self, paths: list[str], field: str, name: str, sizes: dict[str, int] | None = None):
    self.field, self.name = field, name
    _need('array_record.python.array_record_module', 'array-record', 'arrayrecord')
    import grain  # pylint: disable=g-import-not-at-top
    try:
      self._src = grain.sources.ArrayRecordDataSource(paths)
      first = self._src[0] if len(self._src) else b''
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f'{name}: cannot read the files as ArrayRecord ({e}).') from e
    try:
      self._json = isinstance(json.loads(first).get(field), str)
    except (ValueError, AttributeError):
      self._json = False
    self.info = {'files': len(paths), 'megabytes': _megabytes(paths, sizes)}

  def __len__(self):
    return len(self._src)

  def __getitem__(self, i):
    raw = self._src[i]
    if self._json:
      return _json_text(raw, self.field, f'{self.name}, record {i}')
    try:
      return raw.decode('utf-8')
    except UnicodeDecodeError as e:
      raise DataError(f'{self.name}, record {i}: not UTF-8 text ({e}).') from e


class HFDocs(Documents):
  """A Hugging Face dataset split: `datasets.load_dataset(path, hf_config, split)[i][field]`."""

  def __init__(self, cfg):
    datasets = _need('datasets', 'datasets', 'hf')
    self.field = cfg.text_field
    self.name = f'data.path={cfg.path!r} (hf_config={cfg.hf_config!r}, hf_split={cfg.hf_split!r})'
    try:
      self._ds = datasets.load_dataset(cfg.path, cfg.hf_config or None, split=cfg.hf_split)
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(
          f"data.source='hf': could not load {self.name}: {type(e).__name__}: {e}. Without internet, "
          'use a dataset already in the Hugging Face cache (HF_DATASETS_OFFLINE=1), or export it to '
          'jsonl/parquet files and set --config.data.source and --config.data.path.') from e
    if self.field not in self._ds.column_names:
      raise DataError(f'{self.name} has no column {self.field!r} (columns: {self._ds.column_names}); '
                      'set --config.data.text_field.')
    self.info = {'dataset': cfg.path}

  def __len__(self):
    return len(self._ds)

  def __getitem__(self, i):
    return self._ds[int(i)][self.field] or ''


def _py_files(root: str, skip=('site-packages', 'dist-packages')) -> list[str]:
  """The .py files under `root` (relative, sorted), outside the directories named in `skip`."""
  skip = set(skip) | {'__pycache__'}
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in skip]
    files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith('.py')]
  return sorted(files)


def stdlib_files() -> tuple[str, list[str]]:
  """The stdlib root and its .py files (relative, sorted), outside site-/dist-packages."""
  root = sysconfig.get_paths()['stdlib']
  return root, _py_files(root)


def _builtin(cfg) -> Documents:
  """'builtin': the running Python's standard library source (~31 MB on CPython 3.11).
  'builtin_large': that and the .py files of the installed packages (site-packages: 130-260 MB,
  depending on what is installed; describe() reports the size), for models that would see the
  stdlib alone many times over."""
  root, files = stdlib_files()
  paths = [os.path.join(root, f) for f in files]
  name = f'builtin (Python stdlib at {root})'
  if cfg.source == 'builtin_large':
    packages = sysconfig.get_paths()['purelib']
    paths += [os.path.join(packages, f) for f in _py_files(packages, skip=())]
    name = f'builtin_large (Python stdlib at {root} and the packages in {packages})'
  docs = FileDocs(paths, name, errors='replace')  # a few test files are deliberately not UTF-8
  docs.info['root'] = root
  return docs


def _glob(cfg, what: str) -> dict[str, int]:
  """{file: bytes} of the files matched by the comma-separated globs in data.path (local or
  gs://; `**` matches folders recursively), sorted."""
  fix = f'set --config.data.path to a glob of {what}'
  if not cfg.path:
    raise DataError(f'data.source={cfg.source!r} needs data.path; {fix}.')
  patterns = [p.strip() for p in cfg.path.split(',') if p.strip()]
  found = {}
  for pattern in patterns:
    storage.check_reachable(pattern, write=False)   # a missing bucket, credentials: one paragraph
    matched = storage.glob_sizes(pattern)
    if storage.is_remote(pattern):   # the local rules: no hidden files or folders unless named
      matched = {f: n for f, n in matched.items() if _glob_match(_parts(pattern), _parts(f))}
    found.update(matched)
  if not found:
    raise DataError(f'data.path={cfg.path!r} matched no files; {fix}.')
  return dict(sorted(found.items()))


def _parts(url: str) -> list[str]:
  """'gs://bucket/a//b' -> ['bucket', 'a', 'b']."""
  return [c for c in url.split('://', 1)[1].split('/') if c]


def _glob_match(pattern: list[str], parts: list[str]) -> bool:
  """Whether Python's glob.glob(recursive=True) would match the path `parts` with `pattern` (both
  split at '/'): `**` spans zero or more folders, and no wildcard matches a name that starts with
  '.' unless its pattern does too. Object storage globs (fsspec) match such names; a local glob,
  the reference, does not (e.g. macOS's ._part0.jsonl beside part0.jsonl)."""
  if not pattern:
    return not parts
  head, rest = pattern[0], pattern[1:]
  if head == '**':
    for k in range(len(parts) + 1):
      if k and parts[k - 1].startswith('.'):
        return False
      if _glob_match(rest, parts[k:]):
        return True
    return False
  if not parts:
    return False
  if not re.search(r'[*?[]', head):
    return parts[0] == head and _glob_match(rest, parts[1:])
  if parts[0].startswith('.') and not head.startswith('.'):
    return False
  return fnmatch.fnmatchcase(parts[0], head) and _glob_match(rest, parts[1:])


def _need(module: str, package: str, source: str):
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise DataError(f'data.source={source!r} needs the {package!r} package: '
                    f'pip install {package}') from e


def load_documents(cfg) -> Documents:
  """The documents of `data.source` / `data.path`; raises DataError if they cannot be used."""
  name = f'data.path={cfg.path!r}'
  if cfg.source in ('builtin', 'builtin_large'):
    docs = _builtin(cfg)
  elif cfg.source == 'text':
    files = _glob(cfg, 'UTF-8 text files')
    docs = FileDocs(list(files), name, sizes=files)
  elif cfg.source == 'jsonl':
    files = _glob(cfg, 'JSON-lines files')
    docs = JsonlDocs(list(files), cfg.text_field, name, sizes=files)
  elif cfg.source == 'parquet':
    files = _glob(cfg, 'parquet files')
    docs = ParquetDocs(list(files), cfg.text_field, name, sizes=files)
  elif cfg.source == 'arrayrecord':
    files = _glob(cfg, 'ArrayRecord files')
    docs = ArrayRecordDocs(list(files), cfg.text_field, name, sizes=files)
  elif cfg.source == 'hf':
    if not cfg.path:
      raise DataError("data.source='hf' needs data.path; set --config.data.path to a Hugging Face "
                      'dataset name (and data.hf_config / data.hf_split).')
    docs = HFDocs(cfg)
  elif cfg.source in ('synthetic', 'tokenized'):
    raise DataError(f'data.source={cfg.source!r} holds token documents, not text: use '
                    'input_pipeline.build_data, not load_documents.')
  else:
    raise DataError(f'Unknown data.source={cfg.source!r}; set --config.data.source to one of '
                    f'{", ".join(SOURCES)}.')
  empty = len(docs) == 0 or (docs.sizes is not None and not docs.sizes.any())
  if not empty and len(docs) < 2:
    docs[0]  # pylint: disable=pointless-statement  # unreadable (not UTF-8): say so, not "only 1"
  if empty or len(docs) < 2:
    what = 'is empty' if empty else 'has only 1 document'
    raise DataError(f'{docs.name} {what}; the train/validation split needs at least 2 documents. '
                    'Point --config.data.path at more data.')
  for i in range(min(len(docs), _NUM_CHECKED)):
    docs[i]  # pylint: disable=pointless-statement
  return docs


def _unit_hash(i_n: np.ndarray) -> np.ndarray:
  """splitmix64 of each index, as a float64 uniform in [0, 1)."""
  x = i_n.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  x = x ^ (x >> np.uint64(31))
  return (x >> np.uint64(11)).astype(np.float64) / 2.0**53


def split_documents(num_docs: int, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
  """(train_ids, val_ids): each index is held out when its hash < val_fraction.

  Independent of the training seed; at least one document on each side.
  """
  if not 0.0 <= val_fraction < 1.0:
    raise DataError(f'data.val_fraction={val_fraction} must be in [0, 1).')
  u_n = _unit_hash(np.arange(num_docs))
  val_n = u_n < val_fraction
  val_n[np.argmin(u_n)] = True
  val_n[np.argmax(u_n)] = False
  return np.flatnonzero(~val_n), np.flatnonzero(val_n)
