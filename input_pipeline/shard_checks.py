"""Which pre-tokenized shards already in a folder are intact (tokenized.py's rerun and training).

A shard is published whole (tokenized.py), but a file can be damaged afterwards: truncated by a
copy that stopped, overwritten, its counts file cut short. Issue 50: a shard truncated to a
third was kept by a rerun of --mode=tokenize (it trusted the counts file), and training from the
folder ended in `RuntimeError: ArrayRecord file should be at least 64KB big` and a traceback.

  rerun      `check_published`: for each planned shard already there, its counts file must parse
             and name these settings (else DataError: another folder's data, as before), the
             shard's size must be the one its counts file recorded (`bytes`; counts files of
             older code have none), and the shard must hold the planned number of records (its
             footer, read with array_record). A shard failing one of these is damaged: the
             rerun writes it again (with a warning naming it and why).
  training   `check_sizes`: every shard's size against the manifest's (one listing), before any
             batch; a damaged one is a one-paragraph DataError naming it and the command that
             rewrites it. A shard damaged past the footer (the right size, a bad record) is
             found when that record is read (`unreadable`), named the same way.
"""

import concurrent.futures
import json

from gated_attention import storage
from gated_attention.input_pipeline.errors import DataError

_REWRITE = ('run the --mode=tokenize command that wrote the folder again: it checks the shards '
            'there and rewrites a damaged one')


def sizes(folder: str) -> dict[str, int]:
  """{file name: bytes} of the files directly in `folder` (one listing)."""
  return {storage.basename(p): n for p, n in storage.glob_sizes(storage.join(folder, '*')).items()}


# No thread pool: tokenized.py forks its workers after these checks, and a process that has used
# array_record's global thread pool cannot fork safely (a worker crashed writing its shard).
_READER = 'readahead_buffer_size:0,max_parallelism:0'


def records(path: str) -> int:
  """The number of records array_record finds in a shard (0 for a truncated one: its footer is
  gone); an exception if it cannot be opened."""
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  reader = ar.ArrayRecordReader(path, _READER)
  try:
    return reader.num_records()
  finally:
    reader.close()


def count(path: str) -> tuple[int, int]:
  """(documents, tokens) of a shard, read back whole."""
  from array_record.python import array_record_module as ar  # pylint: disable=g-import-not-at-top
  reader = ar.ArrayRecordReader(path, _READER)
  try:
    n, tokens = reader.num_records(), 0
    for start in range(0, n, 1024):
      tokens += sum(len(r) // 4 for r in reader.read(list(range(start, min(n, start + 1024)))))
    return n, tokens
  finally:
    reader.close()


def _counts_file(out: str, name: str, counts_name: str, counts: dict) -> dict | None:
  """The shard's counts file as a dict; None if it is unreadable (damaged); DataError if it was
  made from other data or settings."""
  path = storage.join(out, counts_name)
  try:
    c = json.loads(storage.read_bytes(path))
  except ValueError:
    return None
  if not (isinstance(c, dict) and isinstance(c.get('documents'), int)
          and isinstance(c.get('tokens'), int)):
    return None
  other = ', '.join(f'{key}: {c.get(key)!r} there, {value!r} now'
                    for key, value in sorted(counts.items()) if c.get(key) != value)
  if other:
    raise DataError(f'{storage.join(out, name)} was made with other settings ({other}): --out '
                    'holds shards of other data, another tokenizer or data.shard_documents. Use '
                    'another --out, or the settings it was made with.')
  return c


def _check_one(out: str, name: str, counts_name: str, want_docs: int, have: dict,
               counts: dict) -> tuple[tuple | None, str | None]:
  """((documents, tokens, bytes), None) of an intact shard, or (None, why it is damaged)."""
  path = storage.join(out, name)
  size = have[name]
  c = _counts_file(out, name, counts_name, counts) if counts_name in have else None
  if c is not None:
    if c['documents'] != want_docs:
      raise DataError(f'{path} holds {c["documents"]} documents, not the {want_docs} this '
                      'source and data.shard_documents put there: --out holds shards of other '
                      'data or settings. Use another --out.')
    if 'bytes' in c and c['bytes'] != size:
      return None, f'it holds {size} bytes, its counts file says {c["bytes"]}'
    try:
      n = records(path)
    except Exception as e:  # pylint: disable=broad-except  # array_record raises RuntimeError
      return None, f'it cannot be read ({type(e).__name__}: {e})'
    if n != want_docs:
      return None, f'it holds {n} records, not {want_docs}'
    return (want_docs, int(c['tokens']), size), None
  # No counts file (copied without it), or an unreadable one: the shard read back whole.
  try:
    n, tokens = count(path)
  except Exception as e:  # pylint: disable=broad-except
    return None, f'it cannot be read ({type(e).__name__}: {e})'
  if n == 0 < want_docs:
    return None, 'it holds no records (truncated)'
  if n != want_docs:
    raise DataError(f'{path} holds {n} documents, not the {want_docs} this source and '
                    'data.shard_documents put there: --out holds shards of other data or '
                    'settings. Use another --out.')
  storage.write(storage.join(out, counts_name), json.dumps(
      {'documents': n, 'tokens': tokens, 'bytes': size, **counts}, indent=1, sort_keys=True))
  return (n, tokens, size), None


def check_published(out: str, planned: list[tuple[str, str, int]], have: dict[str, int],
                    counts: dict) -> tuple[dict, dict]:
  """Of the `planned` shards (name, counts file name, documents) found in `have` ({name:
  bytes} of --out): ({name: (documents, tokens, bytes)} of the intact ones, {name: why} of the
  damaged ones). Checked in parallel (thousands of shards on gs://)."""
  present = [p for p in planned if p[0] in have]
  if not present:
    return {}, {}
  with concurrent.futures.ThreadPoolExecutor(min(16, len(present))) as pool:
    results = list(pool.map(lambda p: (p[0], _check_one(out, *p, have, counts)), present))
  done = {name: found for name, (found, why) in results if found is not None}
  damaged = {name: why for name, (found, why) in results if found is None}
  return done, damaged


def check_sizes(folder: str, shards: list[dict], have: dict[str, int]):
  """Training: a DataError naming the shards whose size is not the manifest's (`shards`: its
  entries; those of older code record no size)."""
  bad = [f'{s["name"]} ({have[s["name"]]} bytes, written with {s["bytes"]})' for s in shards
         if 'bytes' in s and s['name'] in have and have[s['name']] != s['bytes']]
  if bad:
    raise DataError(f'{folder} holds {len(bad)} damaged shard(s): {", ".join(bad[:3])}'
                    f'{", ..." if len(bad) > 3 else ""} (truncated or overwritten since they were '
                    f'written). Nothing was trained; {_REWRITE}.')


def unreadable(folder: str, name: str, e: Exception) -> DataError:
  """The error of a shard whose record could not be read while training."""
  return DataError(f'{storage.join(folder, name)} cannot be read ({type(e).__name__}: {e}): the '
                   f'shard is damaged; {_REWRITE}. Checkpoints already written are intact: '
                   'training resumes from the latest once the folder is whole again.')
