"""gs:// names that GCS or a client on the way cannot carry (issue 50, gated_attention/
storage/names.py): refused in one paragraph before anything is written, with the bucket's
object names compared before and after each case (fake-gcs-server)."""

import os
import subprocess
import sys

import pytest

from gated_attention import storage
from gated_attention.storage import names as storage_names
from gated_attention.storage import objects as storage_objects
from gated_attention.errors import StorageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def objects(gcs) -> list[str]:
  """Every object name in the test's bucket."""
  fs, _ = storage.filesystem(gcs.url())
  return sorted(p[len(gcs.name) + 1:] for p in fs.find(gcs.name, refresh=True))


@pytest.mark.parametrize('bucket', ['my-bucket', 'a_b.c-d', '123', 'x' * 63,
                                    '.'.join(['a' * 63] * 3)])
def test_valid_bucket_names_pass(bucket):
  storage_names.check_bucket(f'gs://{bucket}/run')


@pytest.mark.parametrize('bucket,why', [
    ('b', 'at least 3'), ('ab', 'at least 3'), ('', 'names no bucket'),
    ('x' * 64, 'at most 63'), ('Bucket', 'lowercase'), ('-ab', 'starts and ends'),
    ('ab-', 'starts and ends'), ('a b', 'lowercase'), ('a..b', 'dot-separated'),
    ('192.168.5.4', 'IP address'), ('goog-runs', 'goog'), ('my-google-runs', 'google'),
])
def test_bucket_names_gcs_refuses_are_not_offered_as_buckets_to_create(bucket, why, monkeypatch):
  """`gs://b` was "does not exist: create it", though no bucket name under 3 characters can
  exist. Refused by the rules alone: the server is not asked."""
  def no_server():
    raise AssertionError('the server was asked about a name no bucket can have')
  monkeypatch.setattr(storage_objects, '_gcs_client', no_server)
  with pytest.raises(StorageError, match=f'is not a valid bucket name.*{why}') as e:
    storage.check_reachable(f'gs://{bucket}/run', write=True)
  assert 'does not exist' not in str(e.value) and 'buckets create' not in str(e.value)


BAD_FOLDERS = {
    'hash_and_query': ('runs/run#1?x=2', ["'#'", "'?'"]),
    'percent': ('runs/a%20b', ["'%'"]),
    'pipe': ('runs/a|b', ["'|'"]),
    'glob': ('runs/a*b', ["'*'"]),
    'brackets': ('runs/a[1]', ["'['", "']'"]),
    'newline': ('runs/a\nb', ['control characters']),
    'dot_dot': ('runs/../run', ['".."']),
    'empty_segment': ('runs//run', ['empty']),
    'too_long': ('runs/' + 'x' * 800, ['805 bytes']),
}


@pytest.mark.parametrize('case', list(BAD_FOLDERS))
def test_a_folder_no_client_carries_is_refused_before_anything_is_written(case, gcs):
  """tensorstore reads `#` / `?` as a URL's fragment / query (the arrays of
  gs://bkt/runs/run#1?x=2 went to gs://bkt/runs/run/d/), `%` as an escape and `|` as a pipe;
  gcsfs globs `*`, `?`, `[` when it deletes recursively; ``, `.` and `..` segments are
  collapsed by some clients only. One paragraph naming the characters; not even the probe."""
  storage.write(gcs.url('runs/run/config.json'), '{}')   # another run, next door
  before = objects(gcs)
  name, named = BAD_FOLDERS[case]
  with pytest.raises(StorageError, match='cannot be a run directory') as e:
    storage.check_reachable(gcs.url(name), write=True)
  message = str(e.value)
  for what in named:
    assert what in message, message
  assert 'Nothing was written' in message and f'gs://{gcs.name}/' in message
  assert objects(gcs) == before


@pytest.mark.parametrize('name', ['runs/with space', 'runs/naïve-日本', 'runs/a:b+c@d=e,f~g',
                                  'runs/g1/', 'runs/v1.2_x-y'])
def test_folders_every_client_carries_are_accepted(name, gcs):
  storage.check_reachable(gcs.url(name), write=True)
  assert objects(gcs) == []     # the probe object was deleted


def test_readers_refuse_a_run_directory_whose_arrays_they_would_misread(gcs):
  """A run directory made elsewhere under such a name: orbax would read the arrays of another
  folder (gs://bkt/runs/run/...), so the readers refuse it too."""
  from gated_attention.runs import rundir  # pylint: disable=g-import-not-at-top
  workdir = gcs.url('runs/run#1')
  storage.write(storage.join(workdir, 'config.json'), '{}')
  for read in (rundir.read_config, rundir.checkpoint_steps):
    with pytest.raises(StorageError, match="'#'"):
      read(workdir)


def _main(args, timeout=120):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run([sys.executable, 'main.py'] + args, cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def test_main_refuses_a_gs_workdir_with_hash_or_query_and_writes_nothing(gcs):
  """The issue's command: --workdir='gs://bkt/runs/run#1?x=2' hung for 14 minutes in orbax's
  finalize after writing outside the run directory. Now exit 1, one paragraph, and the
  bucket's object names are what they were (a run next door included); analyze of that path
  is refused the same way."""
  storage.write(gcs.url('runs/run/config.json'), '{}')
  before = objects(gcs)
  workdir = gcs.url('runs/run#1?x=2')
  for args in (['--config=configs/g1_elementwise.py', f'--workdir={workdir}',
                '--config.train.steps=2'],
               ['--mode=analyze', f'--workdir={workdir}']):
    done = _main(args)
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    assert 'Traceback' not in done.stderr
    assert '(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)' in done.stderr
    message = ' '.join(done.stderr.split())
    assert "'#'" in message and "'?'" in message and 'cannot be a run directory' in message
    assert objects(gcs) == before
