"""Where a run's files live: a local folder, or object storage (`gs://bucket/path`).
One file, one concern: the file API every module calls (objects with preconditions, gs:// names
and the bounds on waits are already apart: storage_objects.py, storage_names.py, storage_waits.py).

Every file the project writes or reads itself (config.json, metrics, reports, the lock, data
files) goes through these functions; orbax reaches the same storage through etils' epath and
tensorstore. A path with a scheme (`gs://...`) is remote; anything else is local and keeps the
plain os calls, so a local run directory is written byte for byte as before.

Object storage is not a file system, and the callers are written for what it has:
  - no append: an object is written whole. `create(path, data)` writes a new object only if
    none exists (`ifGenerationMatch=0`), so a writer never overwrites another's object;
    metrics are written as numbered chunk objects (training/reporting.py), not appended.
  - no atomic rename: `write(path, data)` is one upload (atomic by itself: readers see the old
    object or the new one, never a part); `move_tree` is copy, check, then delete, and says so.
  - no free-space call and no /proc, memmap or O_EXCL: the checkpointer skips its free-space
    check there, the lock uses object generations (runs/lock.py), data files are read by range.

Clients: gcsfs (fsspec) for files and listings, google-cloud-storage for the preconditions
(`Object`), both reading STORAGE_EMULATOR_HOST when it is set (tests: fake-gcs-server).
`check_reachable(path)` turns a missing bucket, missing credentials or an unreachable endpoint
into one paragraph before any work starts; with `write`, a bucket or folder name that GCS or one
of the clients cannot carry too (storage_names.py).
"""

import contextlib
import glob as glob_lib
import logging
import os
import posixpath
import re

from gated_attention import storage_waits
from gated_attention.errors import StorageError  # noqa: F401  (storage.StorageError, as before)

# gcsfs's default file system asks the storage-control API for every bucket's layout first (a
# gRPC call that waits 60 s where that API is not served, as on an emulator); the plain JSON-API
# file system reads and writes every bucket, hierarchical ones included.
os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
# gcsfs logs each request it gives up on with a traceback (logger.exception) before raising the
# error, which reaches the user as one paragraph (_errors): its log printed a traceback above it.
logging.getLogger('gcsfs').setLevel(logging.CRITICAL)

# How long check_reachable retries a bucket that does not answer before it says so
# (GATED_ATTENTION_STORAGE_TIMEOUT_S overrides it).
REACH_TIMEOUT_S = float(os.environ.get('GATED_ATTENTION_STORAGE_TIMEOUT_S', 30.0))
_SCHEME = re.compile(r'^([a-zA-Z][a-zA-Z0-9+.-]*)://')


def scheme(path: str) -> str | None:
  """'gs' for gs://bucket/x, None for a local path (file:// counts as local)."""
  m = _SCHEME.match(str(path))
  return None if m is None or m.group(1) == 'file' else m.group(1)


def is_remote(path: str) -> bool:
  return scheme(path) is not None


def _local(path: str) -> str:
  return str(path)[len('file://'):] if str(path).startswith('file://') else str(path)


def abspath(path: str) -> str:
  """A local path made absolute; a remote URL without a trailing slash."""
  return path.rstrip('/') if is_remote(path) else os.path.abspath(_local(path))


def join(path: str, *parts: str) -> str:
  if is_remote(path):
    return posixpath.join(path, *parts)
  return os.path.join(path, *parts)


def dirname(path: str) -> str:
  return posixpath.dirname(path.rstrip('/')) if is_remote(path) else os.path.dirname(path)


def basename(path: str) -> str:
  return posixpath.basename(path.rstrip('/')) if is_remote(path) else os.path.basename(path)


# --- remote file systems ---------------------------------------------------------------------

def filesystem(path: str):
  """(fsspec file system, its path without the scheme) of a remote path."""
  import fsspec  # pylint: disable=g-import-not-at-top
  try:
    # No cached listings: other processes (the trainer, other hosts) write the same prefixes, and
    # a cached parent listing would hide what they wrote since.
    fs, fs_path = fsspec.core.url_to_fs(path, use_listings_cache=False)
  except ImportError as e:
    raise StorageError(
        f'{path} is on {scheme(path)}:// storage, which needs its fsspec package ({e}); for '
        'gs:// run: pip install gcsfs google-cloud-storage (requirements.txt pins them).') from e
  return fs, fs_path


def _written(path: str):
  """Forgets cached listings of `path` in every live file system of its kind: orbax's (etils
  epath's gcsfs instance) caches listings, and would not see a step set aside here."""
  fs, p = filesystem(path)
  for instance in list(getattr(type(fs), '_cache', {}).values()):
    instance.invalidate_cache(p)


def forget_listings(path: str):
  """Listings of `path` are read afresh from now on (a reader in a long-lived process, such as
  a notebook, must see the checkpoints a trainer wrote since it last looked). Local: nothing."""
  if is_remote(path):
    _written(path)


def _timeout(nbytes: int = 0) -> float:
  """The bound on one remote request moving `nbytes` (storage_waits.py): passed to gcsfs, whose
  own retries (6, each up to aiohttp's 5 minutes) would otherwise wait half an hour on an
  endpoint that stopped answering."""
  return storage_waits.request_timeout(nbytes)


def _url(path: str, fs_path: str) -> str:
  return f'{scheme(path)}://{fs_path}'


@contextlib.contextmanager
def _errors(path: str, what: str):
  """A storage client's exception (no credentials, a refused request) as one StorageError."""
  try:
    yield
  except (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
          PermissionError):
    raise
  except StorageError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # gcsfs / google-auth raise many types
    raise StorageError(_explain(path, what, e)) from e


def _whole(e: Exception, limit: int = 1600) -> str:
  """The error on one line, whole: the root cause (`[Errno 111] Connection refused`) is at its
  end, and a cut at 300 characters left "[Errno 11." (issue 50). Only a message longer than
  `limit` loses its middle."""
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  return text if len(text) <= limit else f'{text[:limit // 2]} ... {text[-limit // 2:]}'


def _explain(path: str, what: str, e: Exception) -> str:
  text = _whole(e)
  if isinstance(e, TimeoutError):   # gcsfs's bound (fsspec's FSTimeoutError) has no message
    text = (f'{type(e).__name__}: no answer within {_timeout():g} s (a bound on one request '
            'with its retries: GATED_ATTENTION_STORAGE_REQUEST_S)')
  low = text.lower()
  if ('credential' in low or 'unauthorized' in low or re.search(r'\b401\b', low)
      or 'anonymous caller' in low):
    fix = ('no usable Google Cloud credentials. On a TPU VM or GCE the machine\'s service account '
           'is used (give it roles/storage.objectAdmin on the bucket); elsewhere run `gcloud auth '
           'application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a key file')
  elif re.search(r'\b403\b', low) or 'forbidden' in low or 'permission' in low:
    fix = ('the credentials in use may not do this; grant them roles/storage.objectAdmin on the '
           'bucket (or pass a --workdir in a bucket they can write)')
  elif 'connect' in low or 'timeout' in low or 'timed out' in low or 'resolve' in low:
    fix = ('the storage endpoint cannot be reached; check the network (and STORAGE_EMULATOR_HOST '
           'if you meant an emulator)')
  else:
    fix = 'check the path, the bucket and your credentials'
  return f'Cannot {what} {path}: {text}. Likely cause: {fix}.'


# --- files -----------------------------------------------------------------------------------

def exists(path: str) -> bool:
  if not is_remote(path):
    return os.path.exists(_local(path))
  fs, p = filesystem(path)
  with _errors(path, 'look up'):
    return fs.exists(p, timeout=_timeout())


def isdir(path: str) -> bool:
  if not is_remote(path):
    return os.path.isdir(_local(path))
  fs, p = filesystem(path)
  with _errors(path, 'look up'):
    return fs.isdir(p, timeout=_timeout())


def isfile(path: str) -> bool:
  if not is_remote(path):
    return os.path.isfile(_local(path))
  fs, p = filesystem(path)
  with _errors(path, 'look up'):
    return fs.isfile(p, timeout=_timeout())


def mtime(path: str) -> float:
  """When `path` was last written (seconds since the epoch)."""
  if not is_remote(path):
    return os.path.getmtime(_local(path))
  fs, p = filesystem(path)
  with _errors(path, 'look up'):
    return fs.info(p, timeout=_timeout())['mtime'].timestamp()


def getsize(path: str) -> int:
  if not is_remote(path):
    return os.path.getsize(_local(path))
  fs, p = filesystem(path)
  with _errors(path, 'look up'):
    return int(fs.size(p, timeout=_timeout()))


def listdir(path: str) -> list[str]:
  """Names directly inside `path` (sorted); [] where there is nothing."""
  if not is_remote(path):
    try:
      return sorted(os.listdir(_local(path)))
    except FileNotFoundError:
      return []
  fs, p = filesystem(path)
  with _errors(path, 'list'):
    try:
      entries = fs.ls(p, detail=False, refresh=True, timeout=_timeout())
    except FileNotFoundError:
      return []
  return sorted({posixpath.basename(e.rstrip('/')) for e in entries} - {''})


def entries(path: str) -> dict[str, bool]:
  """{name: whether it is a file} of what is directly inside the folder `path`, from one
  listing; {} where there is nothing, or where `path` is a file. On object storage a "folder"
  is a prefix: a name can be one only because some object lies under it."""
  if not is_remote(path):
    try:
      with os.scandir(_local(path)) as it:
        return {e.name: e.is_file() for e in it}
    except (FileNotFoundError, NotADirectoryError):
      return {}
  fs, p = filesystem(path)
  with _errors(path, 'list'):
    try:
      found = fs.ls(p, detail=True, refresh=True, timeout=_timeout())
    except FileNotFoundError:
      return {}
  out = {}
  for e in found:
    name = posixpath.basename(e['name'].rstrip('/'))
    if name and e['name'].rstrip('/') != p.rstrip('/'):
      out[name] = out.get(name, False) or e.get('type') == 'file'
  return out


def glob(pattern: str) -> list[str]:
  """Files matching `pattern` (`**` recursive), sorted; remote ones as full URLs."""
  if not is_remote(pattern):
    pattern = os.path.expanduser(_local(pattern))
    return sorted(p for p in glob_lib.glob(pattern, recursive=True) if os.path.isfile(p))
  fs, p = filesystem(pattern)
  with _errors(pattern, 'list'):
    found = fs.glob(p, detail=True, timeout=_timeout())
  return sorted(_url(pattern, k) for k, v in found.items() if v.get('type') == 'file')


def glob_sizes(pattern: str) -> dict[str, int]:
  """{file: bytes} of the files matching `pattern`, from one listing where remote."""
  if not is_remote(pattern):
    return {p: os.path.getsize(p) for p in glob(pattern)}
  fs, p = filesystem(pattern)
  with _errors(pattern, 'list'):
    found = fs.glob(p, detail=True, timeout=_timeout())
  return {_url(pattern, k): int(v['size']) for k, v in sorted(found.items())
          if v.get('type') == 'file'}


def makedirs(path: str):
  """Local: os.makedirs; remote: nothing (a prefix exists once an object is under it)."""
  if not is_remote(path):
    os.makedirs(_local(path), exist_ok=True)


def open_file(path: str, mode: str = 'rb'):
  """A file object for reading (remote: reads by range; seek works)."""
  if not is_remote(path):
    return open(_local(path), mode)  # pylint: disable=unspecified-encoding
  if 'r' not in mode:
    raise ValueError('open_file reads; write objects whole with write() or create().')
  fs, p = filesystem(path)
  with _errors(path, 'open'):
    return fs.open(p, mode)


def read_bytes(path: str) -> bytes:
  if not is_remote(path):
    with open(_local(path), 'rb') as f:
      return f.read()
  fs, p = filesystem(path)
  with _errors(path, 'read'):
    return fs.cat_file(p, timeout=_timeout())


def read_text(path: str) -> str:
  return read_bytes(path).decode('utf-8')


def write(path: str, data: bytes | str):
  """Writes the whole file at once. Local: a temporary file renamed over it (readers never see a
  part); remote: one upload (the object is replaced whole)."""
  data = data.encode('utf-8') if isinstance(data, str) else data
  if not is_remote(path):
    path = _local(path)
    tmp = f'{path}.tmp'
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)
    return
  fs, p = filesystem(path)
  with _errors(path, 'write'):
    fs.pipe_file(p, data, timeout=_timeout(len(data)))


def create(path: str, data: bytes | str) -> bool:
  """Writes `path` only if it does not exist; False if it does (local: O_EXCL; remote: an upload
  with ifGenerationMatch=0, so of two writers exactly one succeeds)."""
  data = data.encode('utf-8') if isinstance(data, str) else data
  if not is_remote(path):
    try:
      fd = os.open(_local(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    return True
  from gated_attention import storage_objects  # pylint: disable=g-import-not-at-top
  return bool(storage_objects.Object(path).write(data, if_generation=0))


def remove(path: str):
  if not is_remote(path):
    os.remove(_local(path))
    return
  fs, p = filesystem(path)
  with _errors(path, 'delete'):
    fs.rm_file(p, timeout=_timeout())
  _written(path)


def remove_tree(path: str):
  """Deletes a file or a directory with everything under it (remote: every object under the
  prefix); nothing there is not an error."""
  if not is_remote(path):
    import shutil  # pylint: disable=g-import-not-at-top
    local = _local(path)
    if os.path.isdir(local) and not os.path.islink(local):
      shutil.rmtree(local)
    elif os.path.lexists(local):
      os.remove(local)
    return
  fs, p = filesystem(path)
  _written(path)   # listings cached before another writer (orbax) added objects there
  with _errors(path, 'delete'):
    if fs.exists(p, timeout=_timeout()):
      fs.rm(p, recursive=True, timeout=_timeout())
  _written(path)


def copy_tree(src: str, dst: str):
  """Copies every file under `src` to the same place under `dst` (remote: server-side copies)."""
  if not is_remote(src):
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.copytree(_local(src), _local(dst))
    return
  fs, s = filesystem(src)
  _, d = filesystem(dst)
  with _errors(src, 'copy'):
    for f in fs.find(s, timeout=_timeout()):
      fs.copy(f, d + f[len(s):], timeout=_timeout())


def upload_tree(local_dir: str, remote: str):
  """Copies every file under the local folder `local_dir` to the same place under `remote`
  (streamed, not read whole into memory: safetensors files of several GB)."""
  fs, r = filesystem(remote)
  with _errors(remote, 'upload to'):
    for d, _, files in os.walk(local_dir):
      for name in sorted(files):
        path = os.path.join(d, name)
        fs.put_file(path, posixpath.join(r, os.path.relpath(path, local_dir).replace(os.sep, '/')),
                    timeout=_timeout(os.path.getsize(path)))


def download_tree(remote: str, local_dir: str):
  """Copies every object under `remote` to the same place under the local folder `local_dir`
  (streamed to disk, not read whole into memory)."""
  fs, r = filesystem(remote)
  with _errors(remote, 'download'):
    found = fs.find(r, detail=True, timeout=_timeout())
    if not found:
      raise FileNotFoundError(f'{remote} holds no files.')
    for f, info in found.items():
      dst = os.path.join(local_dir, *f[len(r):].strip('/').split('/'))
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      fs.get_file(f, dst, timeout=_timeout(int(info.get('size') or 0)))


def _sizes(path: str) -> dict[str, int]:
  fs, p = filesystem(path)
  found = fs.find(p, detail=True, timeout=_timeout())
  return {f[len(p):]: int(i['size']) for f, i in found.items()}


def move_tree(src: str, dst: str):
  """Moves a directory. Local: one rename. Remote (no rename on object storage): every object
  copied server-side, the copy checked (the same names and sizes), then the originals deleted; a
  process killed in between leaves both, never neither."""
  if not is_remote(src):
    os.rename(_local(src), _local(dst))
    return
  copy_tree(src, dst)
  with _errors(src, 'move'):
    if _sizes(src) != _sizes(dst):
      raise StorageError(f'Copying {src} to {dst} did not give the same objects; {src} is left '
                         'as it was.')
    fs, s = filesystem(src)
    fs.rm(s, recursive=True, timeout=_timeout())
  _written(src)
  _written(dst)


# --- one local file published whole (input_pipeline/tokenized.py's shards) ------------------

def upload_file(local_path: str, path: str):
  """Copies the finished local file `local_path` to `path`, published whole: remote, one object
  upload (streamed, not read into memory; the object appears only once the upload completes,
  never a part of it); local, a copy under a temporary name renamed to `path`."""
  if not is_remote(path):
    import shutil  # pylint: disable=g-import-not-at-top
    target = _local(path)
    tmp = f'{target}.tmp{os.getpid()}'
    shutil.copyfile(local_path, tmp)
    os.replace(tmp, target)
    return
  fs, p = filesystem(path)
  with _errors(path, 'upload to'):
    fs.put_file(local_path, p, timeout=_timeout(os.path.getsize(local_path)))
  _written(path)


# Objects read and written with generation preconditions, and the checks of a path before any
# work, are storage_objects.py's (split by concern; it uses the helpers above): reached here as
# storage.Object, storage.check_reachable ...
_OBJECTS = ('Object', 'Version', '_gcs_client', 'check_folder', 'check_reachable', 'check_writable')


def __getattr__(name: str):
  if name in _OBJECTS:
    from gated_attention import storage_objects  # pylint: disable=g-import-not-at-top
    return getattr(storage_objects, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
