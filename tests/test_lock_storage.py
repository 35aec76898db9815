"""The writer lock on object storage (runs/lock.py) against a real GCS API server: one object
with generation preconditions, stale by heartbeat age alone. No JAX program is compiled."""

import json
import threading
import time

import pytest

from gated_attention import storage
from gated_attention.errors import CheckpointError
from gated_attention.runs import lock as lock_lib


def _lock(workdir, **kw):
  return lock_lib.RunLock(workdir, **{'heartbeat_s': 3600.0, 'stale_s': 300.0, **kw})


def test_a_second_trainer_is_refused_naming_the_first(gcs):
  workdir = gcs.url('run')
  first = _lock(workdir)
  first.acquire()
  try:
    with pytest.raises(CheckpointError, match='in use by another trainer.*pid'):
      _lock(workdir).acquire()
    holder = json.loads(storage.read_bytes(storage.join(workdir, 'trainer.lock')))
    assert holder['pid'] == first._mine['pid']  # pylint: disable=protected-access
  finally:
    first.release()
  assert json.loads(storage.read_bytes(storage.join(workdir, 'trainer.lock')))['released']
  second = _lock(workdir)
  second.acquire()                                 # a released lock is free, without a warning
  second.release()


def test_exactly_one_of_simultaneous_trainers_wins(gcs):
  workdir = gcs.url('run')
  locks = [_lock(workdir) for _ in range(6)]
  results, barrier = [None] * len(locks), threading.Barrier(len(locks))

  def take(i):
    barrier.wait()
    try:
      locks[i].acquire()
      results[i] = 'won'
    except CheckpointError:
      results[i] = 'refused'
  threads = [threading.Thread(target=take, args=(i,)) for i in range(len(locks))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert results.count('won') == 1, results
  for lk in locks:
    lk.release()


def _stale_lock(workdir, age_s=1000.0):
  """A lock object whose holder's heartbeat is `age_s` old (a lost node)."""
  old = time.time() - age_s
  storage.Object(storage.join(workdir, 'trainer.lock')).write(
      json.dumps(dict(host='lost-node', pid=7, started=old, heartbeat=old)), if_generation=0)


def test_a_stale_holder_is_taken_over_and_the_old_one_never_saves(gcs):
  workdir = gcs.url('run')
  old = _lock(workdir)
  old.acquire()
  old._stop.set()                                  # pylint: disable=protected-access  # its heartbeat stops
  old._mine['heartbeat'] -= 1000                   # pylint: disable=protected-access
  storage.Object(old.path).write(json.dumps(old._mine),  # pylint: disable=protected-access
                                 if_generation=old._generation)  # pylint: disable=protected-access
  old._generation = storage.Object(old.path).generation()  # pylint: disable=protected-access
  warnings = []
  new = _lock(workdir, stale_s=60.0)
  new.acquire(warn=warnings.append)
  assert len(warnings) == 1 and 'taking over' in warnings[0] and 'heartbeat is' in warnings[0]
  old.refresh()                                    # its next beat finds the lock taken
  assert old.lost and 'now names' in old.lost
  with pytest.raises(CheckpointError, match='lost the lock'):
    old.check()
  old.release()                                    # never releases the new holder's lock
  assert storage.Object(new.path).read() is not None
  assert not json.loads(storage.Object(new.path).read().data).get('released')
  new.refresh()
  assert not new.lost
  new.release()


def test_two_takers_of_one_stale_lock_one_wins(gcs):
  workdir = gcs.url('run')
  _stale_lock(workdir)
  locks = [_lock(workdir, stale_s=60.0) for _ in range(4)]
  results, barrier = [None] * len(locks), threading.Barrier(len(locks))

  def take(i):
    barrier.wait()
    try:
      locks[i].acquire(warn=lambda _: None)
      results[i] = 'won'
    except CheckpointError:
      results[i] = 'refused'
  threads = [threading.Thread(target=take, args=(i,)) for i in range(len(locks))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert results.count('won') == 1, results
  for lk in locks:
    lk.release()


def test_a_fresh_heartbeat_is_not_taken_over_and_beats_keep_it(gcs):
  workdir = gcs.url('run')
  holder = _lock(workdir, heartbeat_s=0.05, stale_s=60.0)
  holder.acquire()
  time.sleep(0.3)                                  # several heartbeats, each conditional
  assert not holder.lost
  beat = json.loads(storage.Object(holder.path).read().data)['heartbeat']
  assert time.time() - beat < 5
  with pytest.raises(CheckpointError, match='in use'):
    _lock(workdir, stale_s=60.0).acquire()
  holder.release()


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(gcs):
  """kill -9 and the same command again on the same machine (same boot id): its pid is gone,
  so the lock is taken over without waiting for the heartbeat to age; a holder of another boot
  (another VM, whatever its host name) only by its heartbeat's age."""
  import subprocess  # pylint: disable=g-import-not-at-top
  workdir = gcs.url('run')
  dead = subprocess.Popen(['true'])
  dead.wait()
  now = time.time()
  me = dict(host='any', pid=dead.pid, started=now, heartbeat=now,
            boot_id=lock_lib._boot_id())  # pylint: disable=protected-access
  storage.Object(storage.join(workdir, 'trainer.lock')).write(json.dumps(me), if_generation=0)
  warnings = []
  taker = _lock(workdir)
  taker.acquire(warn=warnings.append)
  assert 'is not running' in warnings[0]
  taker.release()
  other = gcs.url('other')
  storage.Object(storage.join(other, 'trainer.lock')).write(
      json.dumps(dict(me, boot_id='another-boot')), if_generation=0)
  with pytest.raises(CheckpointError, match='in use'):
    _lock(other).acquire()
