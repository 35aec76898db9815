"""Which pre-tokenized shards already in a folder are intact (tokenized.py's rerun and training).

A shard is published whole (tokenized.py), but a file can be damaged afterwards: truncated by a
copy that stopped, overwritten, its counts file cut short, bytes changed in place. Issue 50: a
shard truncated to a third was kept by a rerun of --mode=tokenize (it trusted the counts file),
and training from the folder ended in `RuntimeError: ArrayRecord file should be at least 64KB
big` and a traceback. Issue 57: 64 bytes flipped inside a shard, its size unchanged, were kept
by every rerun (sizes and record counts agreed), and the run that met them mid-way was told to
rerun tokenize, which did nothing.

Each shard's counts file and the manifest record its content checksum, `crc32c` in GCS's form
(base64 of the big-endian value): computed once from the local file before it is published; on
gs:// the object's own crc32c (which GCS computes on upload) is the same number, free to read
in every listing.

  rerun      `check_published`: for each planned shard already there, its counts file must parse
             and name these settings (else DataError: another folder's data, as before), the
             shard's size must be the one its counts file recorded (`bytes`), its crc32c the
             recorded one (gs://: the listing's; local: read once), and it must hold the
             planned number of records (its footer, read with array_record). Counts files of
             older code have no crc32c (nor, older still, `bytes`): such a shard is read back
             whole (array_record checks every chunk's hash) and its crc32c added. A shard
             failing one of these is damaged: the rerun writes it again (with a warning
             naming it and why).
  training   `check_shards`, before any batch: every shard's size against the manifest's, and
             its crc32c where that is cheap: on gs:// the listing's (free), on a local disk
             when the shards total at most LOCAL_CHECK_BYTES (read once; larger local folders
             are checked by size only). A damaged one is a one-paragraph DataError naming it
             and the command that rewrites it (`repair_command`: the --mode=tokenize command
             of the folder, from its manifest). A shard damaged in a way no check at the
             start saw is found when a record is read (array_record checks each chunk's
             hash): `unreadable` names it and the same command.
"""

import concurrent.futures
import json
import shlex

from gated_attention import storage
from gated_attention.input_pipeline.errors import DataError

# A local folder's shards are checksummed at the start of training up to this many bytes in all
# (read once, at about a GB/s from the page cache); a larger one is checked by size only.
LOCAL_CHECK_BYTES = 256 << 20


def repair_command(folder: str, manifest: dict | None) -> str:
  """The --mode=tokenize command that wrote `folder` (from its manifest): run again, it checks
  every shard (size, crc32c, records) and rewrites a damaged one with the same bytes."""
  if not manifest:
    return 'run the --mode=tokenize command that wrote the folder again'
  flags = [('data.source', manifest.get('source')), ('data.path', manifest.get('path')),
           ('data.text_field', manifest.get('text_field')),
           ('data.hf_config', manifest.get('hf_config')),
           ('data.hf_split', manifest.get('hf_split')),
           ('data.tokenizer', manifest.get('data_tokenizer')),
           ('data.val_fraction', manifest.get('val_fraction')),
           ('data.shard_documents', manifest.get('shard_documents'))]
  words = ['python', 'main.py', '--mode=tokenize'] + [
      shlex.quote(f'--config.{k}={v}') for k, v in flags if v not in (None, '')] + [
      shlex.quote(f'--out={folder}')]
  return f'run `{" ".join(words)}` (the command that wrote the folder)'


def _rewrite(folder: str, manifest: dict | None) -> str:
  return (f'{repair_command(folder, manifest)}: it checks every shard there (size, content '
          'checksum, records) and rewrites a damaged one')


def sizes(folder: str) -> dict[str, int]:
  """{file name: bytes} of the files directly in `folder` (one listing)."""
  return {name: n for name, (n, _) in listing(folder).items()}


def listing(folder: str) -> dict[str, tuple[int, str | None]]:
  """{file name: (bytes, crc32c)} of the files directly in `folder` (one listing; the crc32c is
  the object's own on gs://, None locally)."""
  return {storage.basename(p): v
          for p, v in storage.glob_checksums(storage.join(folder, '*')).items()}


def crc32c(folder: str, name: str, listed: dict) -> str:
  """A shard's crc32c: the listing's (gs://), else computed from the file (read once)."""
  return listed.get(name, (0, None))[1] or storage.crc32c(storage.join(folder, name))


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


def _check_one(out: str, name: str, counts_name: str, want_docs: int, listed: dict,
               counts: dict) -> tuple[tuple | None, str | None]:
  """((documents, tokens, bytes, crc32c), None) of an intact shard, or (None, why it is
  damaged)."""
  path = storage.join(out, name)
  size = listed[name][0]
  c = _counts_file(out, name, counts_name, counts) if counts_name in listed else None
  if c is not None:
    if c['documents'] != want_docs:
      raise DataError(f'{path} holds {c["documents"]} documents, not the {want_docs} this '
                      'source and data.shard_documents put there: --out holds shards of other '
                      'data or settings. Use another --out.')
    if 'bytes' in c and c['bytes'] != size:
      return None, f'it holds {size} bytes, its counts file says {c["bytes"]}'
    if 'crc32c' in c:
      have = crc32c(out, name, listed)
      if have != c['crc32c']:
        return None, (f'its content checksum (crc32c) is {have}, its counts file says '
                      f'{c["crc32c"]}: bytes changed in place')
      try:
        n = records(path)
      except Exception as e:  # pylint: disable=broad-except  # array_record raises RuntimeError
        return None, f'it cannot be read ({type(e).__name__}: {e})'
      if n != want_docs:
        return None, f'it holds {n} records, not {want_docs}'
      return (want_docs, int(c['tokens']), size, c['crc32c']), None
  # No checksum recorded (counts of older code), no counts file (copied without it) or an
  # unreadable one: the shard is read back whole (array_record checks each chunk's hash), and
  # its counts file written with the checksum of the bytes that read back.
  try:
    n, tokens = count(path)
  except Exception as e:  # pylint: disable=broad-except
    return None, f'it cannot be read ({type(e).__name__}: {e})'
  if n == 0 < want_docs:
    return None, 'it holds no records (truncated)'
  if n != want_docs:
    if c is not None:
      return None, f'it holds {n} records, not {want_docs}'
    raise DataError(f'{path} holds {n} documents, not the {want_docs} this source and '
                    'data.shard_documents put there: --out holds shards of other data or '
                    'settings. Use another --out.')
  if c is not None and int(c['tokens']) != tokens:
    return None, f'it holds {tokens} tokens, its counts file says {c["tokens"]}'
  checksum = crc32c(out, name, listed)
  storage.write(storage.join(out, counts_name), json.dumps(
      {'documents': n, 'tokens': tokens, 'bytes': size, 'crc32c': checksum, **counts}, indent=1,
      sort_keys=True))
  return (n, tokens, size, checksum), None


def check_published(out: str, planned: list[tuple[str, str, int]], listed: dict,
                    counts: dict) -> tuple[dict, dict]:
  """Of the `planned` shards (name, counts file name, documents) found in `listed` ({name:
  (bytes, crc32c)} of --out, `listing`): ({name: (documents, tokens, bytes, crc32c)} of the
  intact ones, {name: why} of the damaged ones). Checked in parallel (thousands of shards on
  gs://)."""
  present = [p for p in planned if p[0] in listed]
  if not present:
    return {}, {}
  with concurrent.futures.ThreadPoolExecutor(min(16, len(present))) as pool:
    results = list(pool.map(lambda p: (p[0], _check_one(out, *p, listed, counts)), present))
  done = {name: found for name, (found, why) in results if found is not None}
  damaged = {name: why for name, (found, why) in results if found is None}
  return done, damaged


def check_shards(folder: str, shards: list[dict], listed: dict, manifest: dict | None = None):
  """Training, before any batch: a DataError naming the shards whose size is not the
  manifest's, or whose crc32c is not, where that is cheap (`listed`: `listing(folder)`; on gs://
  its crc32c, locally computed when the shards total at most LOCAL_CHECK_BYTES). `shards`: the
  manifest's entries (those of older code record no size or checksum)."""
  bad = [f'{s["name"]} ({listed[s["name"]][0]} bytes, written with {s["bytes"]})' for s in shards
         if 'bytes' in s and s['name'] in listed and listed[s['name']][0] != s['bytes']]
  if not bad:
    remote = storage.is_remote(folder)
    total = sum(listed[s['name']][0] for s in shards if s['name'] in listed)
    if remote or total <= LOCAL_CHECK_BYTES:
      sums = [s for s in shards if s.get('crc32c') and s['name'] in listed]
      with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(sums)))) as pool:
        have = list(pool.map(lambda s: crc32c(folder, s['name'], listed), sums))
      bad = [f'{s["name"]} (content checksum crc32c {h}, written with {s["crc32c"]}: bytes '
             'changed in place)' for s, h in zip(sums, have) if h != s['crc32c']]
  if bad:
    raise DataError(f'{folder} holds {len(bad)} damaged shard(s): {", ".join(bad[:3])}'
                    f'{", ..." if len(bad) > 3 else ""} (truncated, overwritten or changed since '
                    f'they were written). Nothing was trained; {_rewrite(folder, manifest)}.')


def unreadable(folder: str, name: str, e: Exception, manifest: dict | None = None) -> DataError:
  """The error of a shard whose record could not be read while training: it names the shard
  and the command that rewrites it (the folder's tokenize command, which finds it damaged)."""
  return DataError(f'{storage.join(folder, name)} cannot be read ({type(e).__name__}: {e}): the '
                   f'shard is damaged; {_rewrite(folder, manifest)}. Checkpoints already written '
                   'are intact: the same training command resumes from the latest once the '
                   'folder is whole again.')
