"""Objects on gs:// read and written with generation preconditions (the run's lock, the metrics
chunks: `Object`), and the checks of a path before any work (`check_reachable`, `check_folder`,
`check_writable`). A part of the storage layer: callers reach these names through its face, as
storage.Object, storage.check_reachable ..."""

import dataclasses
import functools
import os
import tempfile

from gated_attention.errors import StorageError
from gated_attention.storage import clients
from gated_attention.storage import names
from gated_attention.storage import paths

# How long check_reachable retries a bucket that does not answer before it says so
# (GATED_ATTENTION_STORAGE_TIMEOUT_S overrides it).
REACH_TIMEOUT_S = float(os.environ.get('GATED_ATTENTION_STORAGE_TIMEOUT_S', 30.0))


# --- objects with generations (preconditions) ------------------------------------------------

@functools.lru_cache(maxsize=None)
def _gcs_client():
  from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top
  if os.environ.get('STORAGE_EMULATOR_HOST'):
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
    return gcs.Client(project=os.environ.get('GOOGLE_CLOUD_PROJECT', 'emulator'),
                      credentials=AnonymousCredentials())
  return gcs.Client()


def _request_bounds(nbytes: int = 0) -> dict:
  """google-cloud-storage's timeout (one attempt) and retry (all attempts) within the bound on
  one request (waits.py); its defaults are 60 s an attempt, retried for 120 s."""
  from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
  bound = clients.timeout(nbytes)
  return dict(timeout=min(60.0, bound), retry=retry.DEFAULT_RETRY.with_timeout(bound))


def _bucket_and_name(path: str) -> tuple[str, str]:
  if paths.scheme(path) != 'gs':
    raise StorageError(f'{path}: only gs:// object storage is supported for this (a local path, '
                       'or gs://bucket/path).')
  bucket, _, name = path[len('gs://'):].partition('/')
  return bucket, name


@dataclasses.dataclass
class Version:
  data: bytes
  generation: int        # changes with every write of the object; 0: it does not exist
  age_s: float = 0.0     # seconds since it was written (the server's clock against ours)


class Object:
  """One object on gs:// read and written with generation preconditions: a write that names the
  generation it expects fails (returns False) if another writer changed the object meanwhile."""

  def __init__(self, path: str):
    self.path = path
    self.bucket, self.name = _bucket_and_name(path)

  def _blob(self):
    with clients.errors(self.path, 'reach'):
      return _gcs_client().bucket(self.bucket).blob(self.name)

  def read(self) -> Version | None:
    """The object's bytes and generation; None if it does not exist."""
    import datetime  # pylint: disable=g-import-not-at-top
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    blob = self._blob()
    with clients.errors(self.path, 'read'):
      try:
        data = blob.download_as_bytes(**_request_bounds())
      except exceptions.NotFound:
        return None
    age = 0.0
    if blob.updated is not None:
      age = (datetime.datetime.now(datetime.timezone.utc) - blob.updated).total_seconds()
    return Version(data, int(blob.generation), age)

  def generation(self) -> int:
    """The current generation (0: the object does not exist)."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    blob = self._blob()
    with clients.errors(self.path, 'look up'):
      try:
        blob.reload(**_request_bounds())
      except exceptions.NotFound:
        return 0
    return int(blob.generation)

  def write(self, data: bytes | str, *, if_generation: int) -> int:
    """Writes the object if its generation is `if_generation` (0: it must not exist). The new
    generation if written (true), 0 if the precondition failed."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    data = data.encode('utf-8') if isinstance(data, str) else data
    blob = self._blob()
    with clients.errors(self.path, 'write'):
      try:
        blob.upload_from_string(data, if_generation_match=if_generation,
                                **_request_bounds(len(data)))
      except exceptions.PreconditionFailed:
        return 0
    return int(blob.generation)

  def delete(self, *, if_generation: int) -> bool:
    """Deletes the object if its generation is `if_generation`; False otherwise. (GCS checks
    the precondition; fake-gcs-server does not, so no caller's correctness depends on it.)"""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    blob = self._blob()
    with clients.errors(self.path, 'delete'):
      try:
        blob.delete(if_generation_match=if_generation, **_request_bounds())
      except (exceptions.PreconditionFailed, exceptions.NotFound):
        return False
    return True


# --- before any work -------------------------------------------------------------------------

def check_reachable(path: str, *, write: bool):
  """Raises a one-paragraph StorageError if `path`'s bucket is missing, the credentials are
  missing or refused, or the endpoint cannot be reached; with `write`, also if an object cannot
  be written there (a probe object, deleted at once). Nothing for a local path."""
  if not paths.is_remote(path):
    return
  if paths.scheme(path) != 'gs':
    clients.filesystem(path)     # an fsspec protocol without its package: named by filesystem()
    return
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
  names.check_bucket(path)    # a name no bucket can have is not one to create
  if write:                            # a folder written to: names every client carries as is
    names.check_folder(path)
  bucket, name = _bucket_and_name(path)
  try:
    client = _gcs_client()
    b = client.bucket(bucket)
    found = b.exists(timeout=REACH_TIMEOUT_S,
                     retry=retry.DEFAULT_RETRY.with_timeout(REACH_TIMEOUT_S))
  except exceptions.Forbidden:
    found = True          # may not read the bucket's metadata; the probe below decides
  except Exception as e:  # pylint: disable=broad-except
    raise StorageError(clients.explain(path, 'reach', e)) from e
  if not found:
    raise StorageError(
        f'The bucket gs://{bucket} of {path} does not exist. Create it (gcloud storage buckets '
        f'create gs://{bucket} --location=<your TPU or GPU region>) or fix the path.')
  if write:
    probe = Object(f'gs://{bucket}/{name.rstrip("/") + "/" if name else ""}'
                   f'.write_probe.{os.getpid()}')
    probe.write(b'', if_generation=0)
    probe.delete(if_generation=probe.generation())


def check_folder(path: str, what: str = 'a run directory or output folder'):
  """A one-paragraph StorageError if the gs:// folder `path` has a bucket GCS cannot have or a
  name some client would not carry unchanged (names.py: `#`, `?`, `%` ...); nothing for
  a local path. Readers of a run check it too: orbax would read another folder's arrays."""
  if paths.scheme(path) == 'gs':
    names.check_folder(path, what)


def check_writable(directory: str, what: str, fix: str):
  """Raises a one-paragraph StorageError if `what` cannot be written into the local folder
  `directory` (created if missing): a read-only filesystem, a full disk, no permission. Found by
  writing and removing a probe file, before the work that would write there. Remote paths: the
  bucket check (check_reachable)."""
  if paths.is_remote(directory):
    check_reachable(directory, write=True)
    return
  try:
    os.makedirs(paths.local(directory), exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix='.write_probe.', dir=paths.local(directory))
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise StorageError(f'Cannot write {what} to {directory}: {reason}'
                       f'{f" ({e.filename})" if e.filename else ""}. {fix}') from e
