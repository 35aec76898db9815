"""Which gs:// paths a run can live under: GCS's bucket-naming rules, and the object names every
client on the way (gcsfs, google-cloud-storage, tensorstore under orbax) carries unchanged.

    storage.names.check_bucket('gs://b/run')              # StorageError: not a bucket name
    storage.names.check_folder('gs://bkt/runs/run#1')     # StorageError: '#' ...

Why a folder is refused before anything is written there (issue 50): orbax hands tensorstore
its array paths as URLs, and tensorstore reads a `#` or `?` as the start of a URL's fragment or
query, `%` as an escape and `|` as a driver pipe. `--workdir=gs://bkt/runs/run#1?x=2` wrote
the run's config and metrics under that name but the checkpoint's arrays to
`gs://bkt/runs/run/d/...` (outside the run directory), after which orbax's finalize waited
forever. gcsfs expands `*`, `?` and `[` as glob patterns when it deletes recursively (setting
a checkpoint aside), so such a name could delete another folder's objects. Empty, `.` and `..`
segments are collapsed by gcsfs and tensorstore but not by google-cloud-storage (the lock): two
clients would name two objects. GCS itself refuses CR / LF and names over 1024 bytes.

A local path is never refused here: the file system takes these characters, and orbax writes a
local checkpoint through tensorstore's file driver, which does not parse URLs.
"""

import re

from gated_attention.errors import StorageError

# Characters of an object name that some client on the way reads as something else.
UNSAFE = {'#': "tensorstore: a URL's fragment", '?': "tensorstore: a URL's query; gcsfs: a glob",
          '%': 'tensorstore: an escape, %xx decoded', '|': "tensorstore: a URL's driver pipe",
          '*': 'gcsfs: a glob', '[': 'gcsfs: a glob', ']': 'gcsfs: a glob'}
# Room left under the folder for the run's own names (checkpoints/<step>.orbax-checkpoint-tmp-
# <time>/state/ocdbt.process_<i>/d/<32 hex>, ...): GCS's limit is 1024 bytes per object name.
MAX_FOLDER_BYTES = 1024 - 256
_BUCKET = re.compile(r'^[a-z0-9][a-z0-9_.-]*[a-z0-9]$')
_IP = re.compile(r'^\d{1,3}(\.\d{1,3}){3}$')
_SAFE_EXAMPLE = re.compile(r'[^A-Za-z0-9_./-]+')


def _fail(message: str):
  raise StorageError(message)


def split(path: str) -> tuple[str, str]:
  """(bucket, object name) of gs://bucket/name."""
  bucket, _, name = path[len('gs://'):].partition('/')
  return bucket, name


def bucket_problem(bucket: str) -> str | None:
  """Why `bucket` cannot be a GCS bucket's name (cloud.google.com/storage/docs/buckets#naming),
  or None."""
  if not bucket:
    return 'it names no bucket'
  if len(bucket) < 3:
    return 'a bucket name has at least 3 characters'
  components = bucket.split('.')
  if len(bucket) > (222 if len(components) > 1 else 63):
    return ('a bucket name has at most 63 characters (222 with dots, each dot-separated part at '
            'most 63)')
  if not _BUCKET.match(bucket):
    return ('a bucket name holds only lowercase letters, digits, dashes, underscores and dots, '
            'and starts and ends with a letter or digit')
  if any(not c or len(c) > 63 for c in components):
    return 'each dot-separated part of a bucket name has 1 to 63 characters'
  if _IP.match(bucket):
    return 'a bucket name cannot be an IP address'
  if bucket.startswith('goog') or 'google' in bucket or 'g00gle' in bucket:
    return 'a bucket name cannot start with "goog" or contain "google"'
  return None


def check_bucket(path: str):
  """A StorageError if the bucket of gs:// `path` cannot exist on GCS (so it is not offered as a
  bucket to create)."""
  bucket, _ = split(path)
  why = bucket_problem(bucket)
  if why:
    _fail(f'{path}: {bucket!r} is not a valid bucket name ({why}). Write gs://BUCKET/path with '
          'the name of an existing bucket.')


def name_problems(name: str) -> list[str]:
  """What in the object-name prefix `name` no client carries unchanged ([] if nothing)."""
  problems = [f'{c!r} ({what})' for c, what in UNSAFE.items() if c in name]
  control = sorted({c for c in name if ord(c) < 32 or ord(c) == 127})
  if control:
    problems.append(f'control characters {", ".join(repr(c) for c in control)} (GCS: CR and LF '
                    'refused)')
  segments = name.rstrip('/').split('/') if name.rstrip('/') else []
  odd = sorted({s for s in segments if s in ('', '.', '..')})
  if odd:
    problems.append('empty, "." or ".." segments (gcsfs and tensorstore collapse them, '
                    'google-cloud-storage does not: two names for one folder)')
  if len(name.encode('utf-8')) > MAX_FOLDER_BYTES:
    problems.append(f'{len(name.encode("utf-8"))} bytes (at most {MAX_FOLDER_BYTES}: a GCS name '
                    'holds at most 1024, and the run\'s own names go under it)')
  return problems


def check_folder(path: str, what: str = 'a run directory or output folder'):
  """A StorageError if gs:// `path` (a folder the project writes: a run directory, --out) has a
  bucket GCS cannot have or an object-name prefix some client would not carry unchanged."""
  check_bucket(path)
  bucket, name = split(path)
  problems = name_problems(name)
  if problems:
    safe = _SAFE_EXAMPLE.sub('-', name.strip('/')).strip('-') or 'run'
    safe = re.sub(r'/+', '/', re.sub(r'(^|/)\.{1,2}(?=/|$)', r'\1', safe)).strip('/') or 'run'
    _fail(f'{path} cannot be {what} on object storage: its name holds {"; ".join(problems)}. '
          'Nothing was written. Name it with letters, digits and - _ . / only, e.g. '
          f'gs://{bucket}/{safe}.')
