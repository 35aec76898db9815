"""Local temporary folders of one process: TensorBoard's event files and the libraries' logs of a
run on object storage (copied there whole), an export's or an import's files on their way.

    local = storage.scratch.make('gated_attention_logs_')  # sweeps dead processes' folders first
    ...
    storage.scratch.remove(local)

A process removes its folders when it ends normally; a kill -9 (or a hard exit on a stalled
endpoint) used to leave them in /tmp for good (issue 50). Each folder holds an owner file that
its process keeps locked (flock) while it lives, and the next `make` of the same kind removes
every folder whose lock can be taken: its process is gone. A lock says more than a pid would:
it holds across PID namespaces (containers sharing /tmp) and is released by the kernel however
the process ends. The owner file is written (its pid) only once locked, so a folder being made
this instant (an empty owner file) is never taken for a dead one's.
"""

import fcntl
import os
import shutil
import tempfile

_OWNER = '.owner'
_mine: dict[str, int] = {}     # this process's folders -> the descriptor holding the lock


def make(prefix: str) -> str:
  """A new local folder /tmp/<prefix>XXXX owned by this process (after sweeping `prefix`)."""
  sweep(prefix)
  path = tempfile.mkdtemp(prefix=prefix)
  fd = os.open(os.path.join(path, _OWNER), os.O_CREAT | os.O_RDWR, 0o600)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # a new file: nobody else holds it
  os.write(fd, str(os.getpid()).encode())
  _mine[path] = fd
  return path


def files(path: str) -> list[str]:
  """The names of the files in the folder, without its owner file."""
  return sorted(n for n in os.listdir(path) if n != _OWNER)


def remove(path: str):
  """Removes one of this process's folders (nothing if it is gone)."""
  fd = _mine.pop(path, None)
  shutil.rmtree(path, ignore_errors=True)
  if fd is not None:
    os.close(fd)


def remove_all():
  """Removes every folder of this process (a hard exit: nothing else will)."""
  for path in list(_mine):
    remove(path)


def sweep(prefix: str) -> list[str]:
  """Removes the folders /tmp/<prefix>* whose process is gone; returns them."""
  root, removed = tempfile.gettempdir(), []
  try:
    names = os.listdir(root)
  except OSError:
    return removed
  for name in names:
    path = os.path.join(root, name)
    if not name.startswith(prefix) or path in _mine or os.path.islink(path):
      continue
    try:
      fd = os.open(os.path.join(path, _OWNER), os.O_RDWR)
    except OSError:            # not a folder of ours (older code wrote none): left alone
      continue
    try:
      if not os.fstat(fd).st_size:
        continue               # its owner is between creating the file and writing it
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:            # locked: its process lives
      os.close(fd)
      continue
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)
    removed.append(path)
  return removed
