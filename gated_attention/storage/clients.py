"""The storage clients as the rest of the storage layer reaches them: gcsfs (fsspec) for files
and listings (`filesystem`), the bound on one request (`timeout`), and a client's exception as
one StorageError paragraph (`errors`, `explain`). What files.py and objects.py share, below both.
"""

import contextlib
import logging
import os
import re

from gated_attention.errors import StorageError
from gated_attention.storage import paths
from gated_attention.storage import waits

# gcsfs's default file system asks the storage-control API for every bucket's layout first (a
# gRPC call that waits 60 s where that API is not served, as on an emulator); the plain JSON-API
# file system reads and writes every bucket, hierarchical ones included.
os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
# gcsfs logs each request it gives up on with a traceback (logger.exception) before raising the
# error, which reaches the user as one paragraph (errors): its log printed a traceback above it.
logging.getLogger('gcsfs').setLevel(logging.CRITICAL)


def filesystem(path: str):
  """(fsspec file system, its path without the scheme) of a remote path."""
  import fsspec  # pylint: disable=g-import-not-at-top
  try:
    # No cached listings: other processes (the trainer, other hosts) write the same prefixes, and
    # a cached parent listing would hide what they wrote since.
    fs, fs_path = fsspec.core.url_to_fs(path, use_listings_cache=False)
  except ImportError as e:
    raise StorageError(
        f'{path} is on {paths.scheme(path)}:// storage, which needs its fsspec package ({e}); for '
        'gs:// run: pip install gcsfs google-cloud-storage (requirements.txt pins them).') from e
  return fs, fs_path


def timeout(nbytes: int = 0) -> float:
  """The bound on one remote request moving `nbytes` (waits.py): passed to gcsfs, whose
  own retries (6, each up to aiohttp's 5 minutes) would otherwise wait half an hour on an
  endpoint that stopped answering."""
  return waits.request_timeout(nbytes)


@contextlib.contextmanager
def errors(path: str, what: str):
  """A storage client's exception (no credentials, a refused request) as one StorageError."""
  try:
    yield
  except (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
          PermissionError):
    raise
  except StorageError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # gcsfs / google-auth raise many types
    raise StorageError(explain(path, what, e)) from e


def _whole(e: Exception, limit: int = 1600) -> str:
  """The error on one line, whole: the root cause (`[Errno 111] Connection refused`) is at its
  end, and a cut at 300 characters left "[Errno 11." (issue 50). Only a message longer than
  `limit` loses its middle."""
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  return text if len(text) <= limit else f'{text[:limit // 2]} ... {text[-limit // 2:]}'


def explain(path: str, what: str, e: Exception) -> str:
  """'Cannot <what> <path>: <the error>. Likely cause: <the fix>.'"""
  text = _whole(e)
  if isinstance(e, TimeoutError):   # gcsfs's bound (fsspec's FSTimeoutError) has no message
    text = (f'{type(e).__name__}: no answer within {timeout():g} s (a bound on one request '
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
