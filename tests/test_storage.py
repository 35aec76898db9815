"""gated_attention/storage/ against a real GCS API server (fake-gcs-server) and a local
folder: the same calls, the same answers."""

import os

import pytest

from gated_attention import storage
from gated_attention.storage import objects as storage_objects


@pytest.fixture(params=['local', 'gcs'])
def root(request, tmp_path):
  if request.param == 'local':
    return str(tmp_path / 'root')
  return request.getfixturevalue('gcs').url('root')


def test_files_listing_and_glob(root):
  storage.makedirs(root)
  storage.write(storage.join(root, 'a.txt'), 'hello')
  storage.write(storage.join(root, 'sub', 'b.jsonl') if storage.is_remote(root) else
                _mk(root, 'sub', 'b.jsonl'), b'{"x": 1}\n')
  assert storage.read_text(storage.join(root, 'a.txt')) == 'hello'
  assert storage.isfile(storage.join(root, 'a.txt'))
  assert not storage.isfile(storage.join(root, 'sub'))
  assert storage.isdir(storage.join(root, 'sub'))
  assert storage.getsize(storage.join(root, 'a.txt')) == 5
  assert storage.listdir(root) == ['a.txt', 'sub']
  assert storage.listdir(storage.join(root, 'missing')) == []
  found = storage.glob(storage.join(root, '**', '*.jsonl'))
  assert found == [storage.join(root, 'sub', 'b.jsonl')]
  with storage.open_file(storage.join(root, 'sub', 'b.jsonl')) as f:
    f.seek(2)
    assert f.read(3) == b'x":'
  storage.write(storage.join(root, 'a.txt'), 'again')       # replaced whole
  assert storage.read_bytes(storage.join(root, 'a.txt')) == b'again'
  storage.remove(storage.join(root, 'a.txt'))
  assert not storage.exists(storage.join(root, 'a.txt'))


def _mk(root, *parts):
  os.makedirs(os.path.join(root, *parts[:-1]), exist_ok=True)
  return os.path.join(root, *parts)


def test_create_only_if_absent(root):
  storage.makedirs(root)
  path = storage.join(root, 'once')
  assert storage.create(path, 'first')
  assert not storage.create(path, 'second')
  assert storage.read_text(path) == 'first'


def test_move_tree_copies_then_deletes(root):
  storage.makedirs(root)
  src = storage.join(root, '20')
  for name in ('a', 'b'):
    storage.write(_mk(src, 'state', name) if not storage.is_remote(root) else
                  storage.join(src, 'state', name), name * 3)
  dst = storage.join(root, '20.unusable')
  storage.move_tree(src, dst)
  assert not storage.exists(storage.join(src, 'state', 'a'))
  assert storage.read_text(storage.join(dst, 'state', 'b')) == 'bbb'


def test_remove_tree_deletes_a_folder_a_file_and_nothing(root):
  storage.makedirs(root)
  tree = storage.join(root, 'ckpt')
  for name in ('a', 'b'):
    storage.write(_mk(tree, '0', name) if not storage.is_remote(root) else
                  storage.join(tree, '0', name), name)
  kept = storage.join(root, 'kept.txt')
  storage.write(kept, 'k')
  storage.remove_tree(tree)
  assert not storage.exists(tree) and storage.listdir(root) == ['kept.txt']
  storage.remove_tree(storage.join(root, 'missing'))          # nothing there: no error
  storage.remove_tree(kept)
  assert storage.listdir(root) == []


def test_object_generations(gcs):
  obj = storage.Object(gcs.url('lock'))
  assert obj.read() is None and obj.generation() == 0
  assert obj.write('one', if_generation=0)
  first = obj.read()
  assert first.data == b'one' and first.generation == obj.generation() > 0
  assert not obj.write('two', if_generation=0)                    # exists
  assert obj.write('two', if_generation=first.generation)
  assert not obj.write('three', if_generation=first.generation)   # stale generation
  assert obj.read().data == b'two'
  # (fake-gcs-server ignores a precondition on DELETE, so nothing here relies on one: the lock
  # is released by a conditional write, runs/lock.py.)
  assert obj.delete(if_generation=obj.generation())
  assert obj.read() is None


def test_check_reachable_names_a_missing_bucket(gcs):
  storage.check_reachable(gcs.url('run'), write=True)
  with pytest.raises(storage.StorageError, match='does not exist.*gcloud storage buckets create'):
    storage.check_reachable('gs://no-such-bucket-here/run', write=True)


def test_check_reachable_names_an_unreachable_endpoint(monkeypatch):
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', 'http://127.0.0.1:9')   # nothing listens there
  monkeypatch.setattr(storage_objects, 'REACH_TIMEOUT_S', 2.0)
  storage_objects._gcs_client.cache_clear()  # pylint: disable=protected-access
  try:
    with pytest.raises(storage.StorageError, match='cannot be reached') as e:
      storage.check_reachable('gs://bucket/run', write=True)
    # the whole error, its root cause last (issue 50: it was cut at "[Errno 11.")
    assert '[Errno 111] Connection refused' in str(e.value), str(e.value)
  finally:
    storage_objects._gcs_client.cache_clear()  # pylint: disable=protected-access


def test_entries_tell_files_from_folders(root):
  """One listing: a file, a "folder" (on gs://, a prefix with an object under it), nothing."""
  storage.makedirs(root)
  storage.write(storage.join(root, 'a.jsonl'), 'x')
  storage.write(storage.join(root, 'b.jsonl', 'inner') if storage.is_remote(root) else
                _mk(root, 'b.jsonl', 'inner'), 'y')
  assert storage.entries(root) == {'a.jsonl': True, 'b.jsonl': False}
  assert storage.entries(storage.join(root, 'missing')) == {}
  assert storage.entries(storage.join(root, 'a.jsonl')) == {}


def test_a_test_server_refuses_a_port_another_server_answers_on(gcs):
  """tests/gcs_server.py: a fake-gcs-server started on a port another one already serves (a
  free port taken before it bound it) is refused, not taken for its own: the clients would talk
  to the other server (pytest-xdist's workers each run one)."""
  from tests import gcs_server  # pylint: disable=g-import-not-at-top
  with pytest.raises(gcs_server.PortTaken, match=f'port {gcs.server.port}'):
    gcs_server.Server(gcs.server.port)
