"""The storage layer: where a run's files live, a local folder or object storage
(`gs://bucket/path`). This package's face is the one way in: callers write
`from gated_attention import storage` and call `storage.write(...)`, `storage.Object(...)`,
`storage.waits.call(...)`, `storage.scratch.make(...)`; its modules are its own.

    paths.py     paths as strings: a scheme or local, join / dirname / basename
    clients.py   what the others share: gcsfs's file system, the bound on one request, a client's
                 error as one paragraph
    files.py     the file API (read, write, create, list, glob, copy, move, upload, download)
    objects.py   objects with generation preconditions (`Object`), the checks before any work
                 (`check_reachable`, `check_folder`, `check_writable`)
    names.py     the gs:// names GCS and every client carry unchanged (`storage.names`)
    waits.py     the bound on every wait for storage (`storage.waits`)
    scratch.py   a process's local temporary folders, a killed one's removed (`storage.scratch`)

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
of the clients cannot carry too (names.py). docs/storage.md has the design and its cases.
"""

from gated_attention.errors import StorageError
from gated_attention.storage import names
from gated_attention.storage import scratch
from gated_attention.storage import waits
from gated_attention.storage.clients import filesystem
from gated_attention.storage.files import copy_tree
from gated_attention.storage.files import crc32c
from gated_attention.storage.files import create
from gated_attention.storage.files import download_tree
from gated_attention.storage.files import entries
from gated_attention.storage.files import exists
from gated_attention.storage.files import forget_listings
from gated_attention.storage.files import getsize
from gated_attention.storage.files import glob
from gated_attention.storage.files import glob_checksums
from gated_attention.storage.files import glob_sizes
from gated_attention.storage.files import isdir
from gated_attention.storage.files import isfile
from gated_attention.storage.files import listdir
from gated_attention.storage.files import makedirs
from gated_attention.storage.files import move_tree
from gated_attention.storage.files import mtime
from gated_attention.storage.files import open_file
from gated_attention.storage.files import read_bytes
from gated_attention.storage.files import read_text
from gated_attention.storage.files import remove
from gated_attention.storage.files import remove_tree
from gated_attention.storage.files import upload_file
from gated_attention.storage.files import upload_tree
from gated_attention.storage.files import write
from gated_attention.storage.objects import Object
from gated_attention.storage.objects import Version
from gated_attention.storage.objects import check_folder
from gated_attention.storage.objects import check_reachable
from gated_attention.storage.objects import check_writable
from gated_attention.storage.paths import abspath
from gated_attention.storage.paths import basename
from gated_attention.storage.paths import dirname
from gated_attention.storage.paths import is_remote
from gated_attention.storage.paths import join
from gated_attention.storage.paths import scheme

__all__ = [
    'Object', 'StorageError', 'Version', 'abspath', 'basename', 'check_folder', 'check_reachable',
    'check_writable', 'copy_tree', 'crc32c', 'create', 'dirname', 'download_tree', 'entries', 'exists',
    'filesystem', 'forget_listings', 'getsize', 'glob', 'glob_checksums', 'glob_sizes', 'is_remote', 'isdir',
    'isfile', 'join', 'listdir', 'makedirs', 'move_tree', 'mtime', 'names', 'open_file',
    'read_bytes', 'read_text', 'remove', 'remove_tree', 'scheme', 'scratch', 'upload_file',
    'upload_tree', 'waits', 'write',
]
