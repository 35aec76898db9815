"""The file API every module calls (through the face, gated_attention/storage/__init__.py): the
same calls on a local folder and on object storage. Local paths keep the plain os calls, so a
local run directory is written byte for byte as before; remote ones go through gcsfs
(clients.py), each request bounded and its error one paragraph.
"""

import glob as glob_lib
import os
import posixpath

from gated_attention.errors import StorageError
from gated_attention.storage import objects
# What this module shares with objects.py, by the names it has always used here (the face
# exports the public ones: storage.filesystem, storage.is_remote, storage.scheme).
from gated_attention.storage.clients import errors as _errors
from gated_attention.storage.clients import filesystem
from gated_attention.storage.clients import timeout as _timeout
from gated_attention.storage.paths import is_remote
from gated_attention.storage.paths import local as _local
from gated_attention.storage.paths import scheme


# --- remote file systems ---------------------------------------------------------------------

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


def _url(path: str, fs_path: str) -> str:
  return f'{scheme(path)}://{fs_path}'


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


def glob_checksums(pattern: str) -> dict[str, tuple[int, str | None]]:
  """{file: (bytes, crc32c)} of the files matching `pattern`, from one listing. Remote: the
  object's crc32c as the storage keeps it (base64 of the big-endian value, free to read: GCS
  computes it when the object is written); local: None (a file has none: `crc32c` computes it)."""
  if not is_remote(pattern):
    return {p: (os.path.getsize(p), None) for p in glob(pattern)}
  fs, p = filesystem(pattern)
  with _errors(pattern, 'list'):
    found = fs.glob(p, detail=True, timeout=_timeout())
  return {_url(pattern, k): (int(v['size']), v.get('crc32c') or None)
          for k, v in sorted(found.items()) if v.get('type') == 'file'}


def crc32c(path: str) -> str:
  """The crc32c of a file's bytes, in GCS's form (base64 of the big-endian value): computed by
  reading it locally; a remote object's is read from its metadata (GCS computed it)."""
  if is_remote(path):
    fs, p = filesystem(path)
    with _errors(path, 'read the metadata of'):
      value = fs.info(p, timeout=_timeout()).get('crc32c')
    if not value:
      raise StorageError(f'{path} has no crc32c in its metadata (the storage keeps none).')
    return value
  import google_crc32c  # pylint: disable=g-import-not-at-top
  checksum = google_crc32c.Checksum()
  with open(_local(path), 'rb') as f:
    for block in iter(lambda: f.read(1 << 22), b''):
      checksum.update(block)
  return crc32c_text(checksum.digest())


def crc32c_text(digest: bytes) -> str:
  """A crc32c's 4 big-endian bytes as GCS writes them (base64)."""
  import base64  # pylint: disable=g-import-not-at-top
  return base64.b64encode(digest).decode()


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
  return bool(objects.Object(path).write(data, if_generation=0))


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
