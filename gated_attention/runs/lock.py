"""One trainer per run directory: the lock file RUN/trainer.lock.

    lock = RunLock(workdir)
    lock.acquire(warn=print)     # a CheckpointError naming the holder if another trainer has it
    ...
    lock.release()

The file names its holder (host, pid, the process's start time, the machine's boot id, its PID
namespace, when it started) and a heartbeat: a timestamp a background thread refreshes every
`heartbeat_s` seconds (nothing on the training step's path). A second trainer is refused with the
holder's name. A holder that is gone never blocks the next run:

  same host, same PID namespace   its pid is not running, or runs another process (another start
                                  time): gone, whatever the heartbeat says (a kill -9)
  same host, another boot         gone (a reboot; a local lock file only)
  anything else                   its heartbeat is older than `stale_s` seconds (a lost node)

"Same PID namespace" is proved, not assumed: the boot id is shared by every container on a VM
(and the host name often is), and a pid means something only in the namespace that gave it. A
holder's pid is looked up only when its lock records this very PID namespace (the namespace's
id, /proc/self/ns/pid, on this boot) and this process's /proc shows that namespace; a trainer in
another container, or in an `unshare -p` beside it, is judged by its heartbeat alone (issue 50:
it took a live holder's lock at once, "process N is not running").

and the lock is taken over with a warning naming the old holder. A holder that finds its lock
taken over (it was thought lost: a network partition) stops refreshing it and reports `lost`;
the loop refuses to save after that. Multi-host runs take the lock on process 0 only. Readers
(analysis, sampling, export, long-context evaluation) never take it: they open checkpoints
read-only and write nothing there.

On object storage (a gs:// run directory) there is no O_EXCL, rename, link or /proc, and hosts
share nothing: the lock is one object read and written with generation preconditions
(storage.Object). Acquiring creates it only if absent (ifGenerationMatch=0: of two trainers
exactly one wins); each heartbeat rewrites it only if it still has the generation this trainer
wrote last (a failed precondition means it was taken over: `lost`); a holder is stale by the age
of its heartbeat (a host name may be another VM's), or on the very machine and PID namespace
that wrote it (the same boot id and namespace id) once its process is gone, and taking it over is
a write
conditional on the stale holder's generation (of two takers one wins; a holder that beat in
between keeps it). Releasing writes {"released": true} on this trainer's generation (conditional
deletes are not honoured by every GCS server, so none is relied on); a released lock is free.
"""

import json
import os
import socket
import threading
import time

import jax

from gated_attention import storage
from gated_attention.errors import CheckpointError
from gated_attention.runs.rundir import LOCK_FILE

HEARTBEAT_S = 30.0
STALE_S = 300.0
_TAKING = set()   # this process's RunLocks that hold, or are taking, their run directory


def release_all():
  """Frees every lock this process holds or was taking (`release(taking=True)`), for a stop that
  exits at once, where no `finally` runs (main.py's Ctrl-C while a run starts). Without it the
  lock stays behind: the next trainer on this machine takes it over at once (its pid is gone),
  but on object storage another host waits `stale_s` (5 minutes). An error leaves the lock to go
  stale as before."""
  for lock in list(_TAKING):
    try:
      lock.release(taking=True)
    except Exception:  # pylint: disable=broad-except
      pass


def _boot_id() -> str | None:
  try:
    with open('/proc/sys/kernel/random/boot_id') as f:
      return f.read().strip()
  except OSError:
    return None


def _pid_namespace() -> str | None:
  """This process's PID namespace ('pid:[4026531836]', unique on one boot), if this process's
  /proc shows that namespace (/proc/self is this pid: not so after `unshare -p` without
  --mount-proc, where /proc/<pid> would name another namespace's process); else None."""
  try:
    if os.readlink('/proc/self') != str(os.getpid()):
      return None
    return os.readlink('/proc/self/ns/pid')
  except OSError:
    return None


def _pid_is_ours(holder: dict) -> bool:
  """Whether the holder's pid can be looked up here: it recorded this boot and this PID
  namespace (a lock written without them, by older code or elsewhere, cannot be)."""
  boot, namespace = _boot_id(), _pid_namespace()
  return bool(boot and namespace and holder.get('boot_id') == boot
              and holder.get('pid_ns') == namespace)


def _gone_here(holder: dict, where: str = '') -> str | None:
  """Why the holder, whose pid is ours to look up (_pid_is_ours), is gone; None if it runs."""
  pid = holder.get('pid')
  if not isinstance(pid, int) or not _running(pid):
    return f'process {pid}{where} is not running'
  start = _process_start(pid)
  if holder.get('process_start') and start and start != holder['process_start']:
    return f'pid {pid}{where} is now another process'
  return None


def _process_start(pid: int) -> str | None:
  """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), which tells
  a reused pid from the holder; None where /proc is not there."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:       # another user's process
    return True
  return True


def _holder(data: bytes) -> dict:
  """A lock object's JSON as a dict ({} if unreadable)."""
  try:
    holder = json.loads(data)
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) else {}


def _when(t) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t)) if t else '?'


def describe(holder: dict) -> str:
  """'host H, pid P, started T (heartbeat N s ago)'."""
  beat = holder.get('heartbeat')
  age = f'; heartbeat {time.time() - beat:.0f} s ago' if isinstance(beat, (int, float)) else ''
  return (f'host {holder.get("host", "?")}, pid {holder.get("pid", "?")}, started '
          f'{_when(holder.get("started"))}{age}')


class RunLock:
  """The trainer's lock on one run directory (a no-op on processes other than 0)."""

  def __init__(self, workdir: str, *, heartbeat_s: float = HEARTBEAT_S,
               stale_s: float = STALE_S):
    self.workdir = storage.abspath(workdir)
    self.path = storage.join(self.workdir, LOCK_FILE)
    self.remote = storage.is_remote(self.path)
    self._object = storage.Object(self.path) if self.remote else None
    self._generation = 0        # object storage: the generation this trainer wrote last
    self.heartbeat_s, self.stale_s = heartbeat_s, stale_s
    self.held = False
    self.lost = None            # why the lock is no longer ours (set by the heartbeat thread)
    self._mine = None
    self._stop = threading.Event()
    self._thread = None
    self._refreshing = threading.Lock()   # the heartbeat thread's beats and check()'s
    self._heard = 0.0           # when a heartbeat was last written (or the lock taken)
    self._unheard = None        # why the last heartbeat could not be written
    self._unsure = []           # heartbeats sent whose answer was lost: the server may yet
                                # write them (object storage), so they are still ours

  # -- the file ---------------------------------------------------------------------------------

  def read(self) -> dict | None:
    """The holder recorded in the lock file; None if there is none; {} if unreadable."""
    if self.remote:
      version = self._object.read()
      return None if version is None else _holder(version.data)
    try:
      with open(self.path) as f:
        holder = json.load(f)
      return holder if isinstance(holder, dict) else {}
    except FileNotFoundError:
      return None
    except (OSError, ValueError):
      return {}

  def _write_new(self, holder: dict) -> bool:
    """Creates the lock file holding `holder`; False if one exists."""
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, 'w') as f:
      json.dump(holder, f)
    return True

  def stale(self, holder: dict) -> str | None:
    """Why `holder` is gone, or None while it may still be training."""
    if not holder:              # unreadable, or being written this instant: by its age alone
      try:
        age = time.time() - os.path.getmtime(self.path)
      except OSError:
        return 'the lock file is gone'
      return f'an unreadable lock file {age:.0f} s old' if age > self.stale_s else None
    if holder.get('host') == socket.gethostname():
      if holder.get('boot_id') and _boot_id() and holder['boot_id'] != _boot_id():
        return 'its host has rebooted since'
      if _pid_is_ours(holder):
        return _gone_here(holder)
      # the same host name and boot, another PID namespace (a container): its heartbeat decides
    beat = holder.get('heartbeat')
    if not isinstance(beat, (int, float)):
      return 'it has no heartbeat'
    if time.time() - beat > self.stale_s:
      return (f'its heartbeat is {time.time() - beat:.0f} s old (more than {self.stale_s:.0f} s: '
              'a lost node)')
    return None

  # -- acquire, heartbeat, release --------------------------------------------------------------

  def acquire(self, warn=print):
    """Takes the lock (process 0), or raises a CheckpointError naming the trainer holding it."""
    if jax.process_index() != 0:
      return
    storage.makedirs(self.workdir)
    now = time.time()
    mine = dict(host=socket.gethostname(), pid=os.getpid(), started=now, heartbeat=now,
                process_start=_process_start(os.getpid()), boot_id=_boot_id(),
                pid_ns=_pid_namespace())
    self._mine = mine           # what the lock holds once written: release(taking=True) frees it
    _TAKING.add(self)
    try:
      taken = (self._acquire_object if self.remote else self._acquire_file)(mine, warn)
    except BaseException:       # refused (another trainer's lock is left alone), or a Ctrl-C
      self.release(taking=True)   # that landed after the lock was written, before it was held
      raise
    if not taken:
      _TAKING.discard(self)
      raise CheckpointError(f'Could not take the lock file {self.path}: other trainers keep '
                            'taking it; make sure only one trainer runs in this directory.')
    self._mine, self.held, self._heard = mine, True, time.time()
    self._stop.clear()
    self._thread = threading.Thread(target=self._beat, name='run-lock-heartbeat', daemon=True)
    self._thread.start()

  def _in_use(self, holder: dict) -> CheckpointError:
    return CheckpointError(
        f'--workdir={self.workdir} is in use by another trainer ({describe(holder)}; lock '
        f'file {self.path}). A run directory takes one trainer at a time: wait for that one '
        'to finish, stop it, or pass another --workdir. If it is gone (a lost node), its lock '
        f'is taken over once its heartbeat is more than {self.stale_s:.0f} s old; deleting '
        'the lock file does it now. (Evaluation modes read a run without the lock.)')

  def _acquire_file(self, mine: dict, warn) -> bool:
    for _ in range(5):
      if self._write_new(mine):
        return True
      holder = self.read()
      if holder is None:
        continue                # released meanwhile
      why = self.stale(holder)
      if why is None:
        raise self._in_use(holder)
      if self._take_over(holder):
        warn(f'Warning: taking over the lock of {self.workdir} from a trainer that is gone '
             f'({describe(holder)}: {why}).')
    return False

  def _acquire_object(self, mine: dict, warn) -> bool:
    """Object storage: create if absent, else take a released or stale holder's generation."""
    data = json.dumps(mine)
    for _ in range(5):
      self._generation = self._object.write(data, if_generation=0)
      if self._generation:
        return True
      version = self._object.read()
      if version is None:
        continue                # deleted meanwhile
      holder = _holder(version.data)
      why = 'released' if holder.get('released') else self.stale_object(holder, version.age_s)
      if why is None:
        raise self._in_use(holder)
      self._generation = self._object.write(data, if_generation=version.generation)
      if self._generation:      # of several takers, the one whose precondition held
        if why != 'released':
          warn(f'Warning: taking over the lock of {self.workdir} from a trainer that is gone '
               f'({describe(holder)}: {why}).')
        return True
    return False

  def stale_object(self, holder: dict, age_s: float) -> str | None:
    """On object storage: why `holder` is gone, or None. By its heartbeat's age; or, in the
    very machine and PID namespace that wrote it (the same boot id and namespace: a host name
    alone may be another VM, a boot id another container), when its process is gone (a trainer
    killed and started again at once)."""
    if _pid_is_ours(holder):
      why = _gone_here(holder, ' on this machine')
      if why:
        return why
    beat = holder.get('heartbeat')
    if not isinstance(beat, (int, float)):   # unreadable or hand-written: by the object's age
      return (f'an unreadable lock object {age_s:.0f} s old' if age_s > self.stale_s else None)
    if time.time() - beat > self.stale_s:
      return (f'its heartbeat is {time.time() - beat:.0f} s old (more than {self.stale_s:.0f} s: '
              'a lost node)')
    return None

  def _take_over(self, holder: dict) -> bool:
    """Moves a stale lock file out of the way, unless it changed meanwhile (another trainer
    took it over first)."""
    aside = f'{self.path}.stale.{os.getpid()}'
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return False
    try:
      with open(aside) as f:
        moved = json.load(f)
    except (OSError, ValueError):
      moved = {}
    if moved != holder and moved:  # a fresh lock of another trainer: put it back
      try:
        os.link(aside, self.path)
      except FileExistsError:
        pass
    os.remove(aside)
    return moved == holder or not moved

  def _beat(self):
    while not self._stop.wait(self.heartbeat_s):
      self.refresh()

  def refresh(self):
    """Rewrites the heartbeat (the background thread; before a save that has not heard one for
    long: `check`). Each write is bounded (storage.waits.REQUEST_S); one that fails is tried
    again at the next beat."""
    with self._refreshing:
      if not self.held or self.lost:
        return
      if self.remote:
        self._refresh_object()
      else:
        self._refresh_file()

  def _refresh_file(self):
    holder = self.read()
    if holder == {}:            # being written this instant (or unreadable): the next beat sees
      return
    if holder != self._mine:
      self.lost = (f'the lock file {self.path} now names {describe(holder)}' if holder
                   else f'the lock file {self.path} was removed')
      return
    mine = dict(self._mine, heartbeat=time.time())
    tmp = f'{self.path}.{os.getpid()}.tmp'
    try:
      with open(tmp, 'w') as f:
        json.dump(mine, f)
      os.replace(tmp, self.path)
      self._mine, self._heard, self._unheard = mine, time.time(), None
    except OSError as e:        # a full disk: the next beat tries again
      self._unheard = f'{type(e).__name__}: {e}'

  def _refresh_object(self):
    mine = dict(self._mine, heartbeat=time.time())
    try:
      generation = self._object.write(json.dumps(mine), if_generation=self._generation)
      if not generation:        # the precondition failed: someone else wrote the lock, or the
        version = self._object.read()   # server carried out a beat whose answer was lost
        if version is not None and _holder(version.data) in [mine] + self._unsure:
          generation = self._object.write(json.dumps(mine), if_generation=version.generation)
      if generation:
        self._generation, self._mine, self._heard, self._unheard = (generation, mine,
                                                                    time.time(), None)
        self._unsure = []
        return
      holder = None if version is None else _holder(version.data)
    except storage.StorageError as e:  # the network: the next beat tries again
      self._unheard = str(e)
      self._unsure = (self._unsure + [mine])[-8:]
      return
    self.lost = (f'the lock object {self.path} now names {describe(holder)}'
                 if holder and not holder.get('released') else
                 f'the lock object {self.path} was removed or released by another process')

  def check(self):
    """Raises a CheckpointError if another trainer took the lock over (before a save), or if
    this one cannot show it still holds it: no heartbeat written for so long that another
    trainer may take the lock over by now (and one more try, bounded, fails too)."""
    unsafe = self.stale_s - min(self.heartbeat_s, self.stale_s / 2)   # silent for that long
    if self.held and not self.lost and time.time() - self._heard > unsafe:
      self.refresh()
    if self.lost:
      raise CheckpointError(
          f'This trainer lost the lock of {self.workdir}: {self.lost}. Another trainer took the '
          'run over (this one was thought gone: its heartbeat stopped); stopping without saving.')
    silent = time.time() - self._heard
    if self.held and silent > unsafe:
      storage.waits.closing('lock heartbeat')
      raise CheckpointError(
          f'This trainer could not write the heartbeat of its lock {self.path} for {silent:.0f} s '
          f'({self._unheard or "no answer"}); after {self.stale_s:.0f} s another trainer may take '
          'the run over, so it stops without saving. The checkpoints already written are intact: '
          'run the same command again once the storage answers.')

  def release(self, taking: bool = False):
    """Removes the lock file if it is still ours. `taking`: also when acquire was interrupted
    (it may have written the lock without knowing so): the lock is freed if it holds this
    trainer's record, which no other trainer's ever equals."""
    _TAKING.discard(self)
    self._stop.set()
    if self._thread is not None:  # a beat in flight ends within its request's bound
      self._thread.join(storage.waits.request_timeout() + 1.0)
      self._thread = None
    if self.held and not self.lost and self.remote:
      released = json.dumps({'released': True, 'by': self._mine})
      try:                      # a conditional write: never another trainer's lock
        if not self._object.write(released, if_generation=self._generation):
          version = self._object.read()   # a beat whose answer was lost, carried out since
          if version is not None and _holder(version.data) in [self._mine] + self._unsure:
            self._object.write(released, if_generation=version.generation)
      except storage.StorageError:
        pass                    # it goes stale by its heartbeat's age
    elif taking and not self.held and self.remote and self._mine is not None:
      try:
        version = self._object.read()
        if version is not None and _holder(version.data) == self._mine:
          self._object.write(json.dumps({'released': True, 'by': self._mine}),
                             if_generation=version.generation)
      except storage.StorageError:
        pass
    elif ((self.held or taking) and not self.lost and not self.remote and self._mine is not None
          and self.read() == self._mine):
      try:
        os.remove(self.path)
      except OSError:
        pass
    self.held = False
