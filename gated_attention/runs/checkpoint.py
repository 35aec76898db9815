"""Orbax checkpoints, one file because one object: cadence, integrity, fallback and setting
aside are what Checkpointer's save and restore do over orbax's manager, and they share its state.

What is saved: parameters and optimizer state (sharded, async) and the data iterator's state
(grain); the run's config.json beside them is rundir.py's.

Layout: <workdir>/checkpoints/<step>/{state,data}. The training loop,
the analysis and the notebooks all go through `Checkpointer` (the analysis opens it read-only
and restores the parameters alone). The save cadence is orbax's: every `every` steps, plus the
last step and preemption (PreemptionCheckpointingPolicy: a TPU/GPU cluster's preemption notice
seen by JAX's multi-host sync). Kept: the `keep` latest, and the best by the loop's running loss
level outside that rotation (a divergence cannot rotate the good checkpoints away).

Integrity: every save stores a checksum of each array (a position-weighted sum of its bits,
exact and independent of the sharding) and refuses non-finite state; every restore recomputes
and compares them (a checkpoint without them, e.g. its _CHECKPOINT_METADATA deleted, is restored
with a warning that it is unverified, its values still checked finite). Training: a newest step
that is corrupt, partial or empty is set aside (renamed `<step>.unusable`, never deleted) with a
warning, and the next older one is used. Parameters-only restores (analysis, sampling, export,
long-context, init_from) verify the same way and never change the run directory: the latest
that verifies, with a warning for each bad newer one, or a one-paragraph CheckpointError for a
bad step asked for by number.

On object storage (a gs:// run directory) orbax writes through tensorstore and epath and marks a
finished step with commit_success.txt instead of renaming a temporary folder; setting a step
aside is a server-side copy to `<step>.unusable`, checked, then the original deleted
(storage.move_tree: there is no rename), and there is no free-space check (no such call).

A checkpoint without a `data` item is a warm start (an import): the loop restores its
parameters alone and starts a fresh optimizer and data iterator.
"""

import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import threading

from absl import logging as absl_logging
import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from gated_attention import console
from gated_attention import storage
from gated_attention.errors import CheckpointError, StorageError

CHECKPOINTS_DIR = 'checkpoints'   # in the run directory (rundir.py lists its files)
POSITION = 'position.json'        # <step>/data/: the data iterator's state, one for all processes
_SET_ASIDE = re.compile(r'\d+\.unusable\d*')
_PER_PROCESS = re.compile(r'process_(\d+)-of-(\d+)\.json')   # <step>/data/ before issue 45


@contextlib.contextmanager
def _quiet_orbax():
  """orbax logs a WARNING for every option a read-only manager overrides."""
  old = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    yield
  finally:
    absl_logging.set_verbosity(old)


@jax.jit
def _integrity(x):
  """[checksum, all finite] (uint32) of an array: the sum over elements of its bits x a position
  weight, in wrapping uint32 arithmetic, so it is exact and the same whatever the sharding."""
  bits = (jax.lax.bitcast_convert_type(x, jnp.uint32) if x.dtype == jnp.float32
          else x.astype(jnp.uint32))
  pos = jax.lax.iota(jnp.uint32, max(x.size, 1))[:x.size].reshape(x.shape)
  weights = pos * jnp.uint32(2654435761) + jnp.uint32(1)
  finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.floating) else True
  return jnp.stack([jnp.sum(bits * weights, dtype=jnp.uint32), jnp.uint32(finite)])


def integrity(tree) -> tuple[dict[str, int], list[str]]:
  """(checksum per leaf path, the paths of leaves holding a non-finite value). One leaf at a
  time, so a host (numpy) tree is never on the device whole."""
  sums, bad = {}, []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = jax.tree_util.keystr(path)
    checksum, finite = (int(v) for v in jax.device_get(_integrity(leaf)))
    sums[key] = checksum
    if not finite:
      bad.append(key)
  return sums, bad


def _reason(e: Exception) -> str:
  """'Type: the first line of the message', without orbax's pointer to a TensorStore spec dump
  (whose first line is a `<bound method pybind11...>` repr), at most ~200 characters."""
  first = (str(e).strip().splitlines() or [''])[0]
  first = first.split(' See full TensorStore details', 1)[0].rstrip()
  return f'{type(e).__name__}: {first if len(first) <= 200 else first[:200] + "..."}'


def _dir_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class PositionMismatch(CheckpointError):
  """An intact checkpoint whose data position does not fit this run's data pipeline."""


class Rotated(CheckpointError):
  """A checkpoint removed while it was read: the run is training, and its trainer rotated it
  away (keep_checkpoints). Not damage: the reader reads the newest one again."""


# A reader of a live run reads the newest checkpoint again at most this many times when the
# trainer removes the one it reads (issue 57).
READ_RACES = 5


@dataclasses.dataclass
class Restored:
  step: int
  state: dict                   # {'params': ..., 'opt_state': ...}; no opt_state if warm
  loop: dict                    # what the loop saved with it (lr scale, the guard's state)
  warm: bool                    # a warm start: parameters only, fresh optimizer and data


# model setting -> (parameter path, axis) whose size it is (the stacked-layer layout)
_SETTING_AXES = {
    'num_layers': ("['blocks']['attn']['wq']", 0),
    'hidden_size': ("['embed']['embedding']", 1),
    'vocab_size': ("['embed']['embedding']", 0),
    'num_heads': ("['blocks']['attn']['wq']", 2),
    'head_dim': ("['blocks']['attn']['wq']", 3),
    'num_kv_heads': ("['blocks']['attn']['wk']", 2),
    'ffn_size': ("['blocks']['ffn']['wi_gate']", -1),
}


def _settings(shapes: dict) -> dict:
  """The model settings read off parameter shapes {keystr: shape} (those present)."""
  out = {}
  for name, (path, axis) in _SETTING_AXES.items():
    shape = shapes.get(path)
    if shape and len(shape) > (axis if axis >= 0 else -axis - 1):
      out[name] = shape[axis]
  return out


@contextlib.contextmanager
def readable(directory: str):
  """A checkpoints directory that cannot be listed (permissions; etils raises from deep in
  orbax) as one CheckpointError; a step folder that vanished while it was listed (a trainer's
  rotation: a reader of a live run) as a `Rotated` one."""
  try:
    yield
  except FileNotFoundError as e:
    name = str(e.filename or '')
    if name.rstrip('/') != directory.rstrip('/') and name.startswith(directory.rstrip('/') + '/'):
      raise Rotated(f'{name} was removed while it was listed') from e
    raise CheckpointError(
        f'Cannot read the checkpoints directory {directory}: {type(e).__name__}: '
        f'{e.strerror or e}{f" ({e.filename})" if e.filename else ""}. Check its permissions '
        '(and the user this runs as), or pass another --workdir.') from e
  except OSError as e:
    raise CheckpointError(
        f'Cannot read the checkpoints directory {directory}: {type(e).__name__}: '
        f'{e.strerror or e}{f" ({e.filename})" if e.filename else ""}. Check its permissions '
        '(and the user this runs as), or pass another --workdir.') from e


def step_dirs(workdir: str) -> list[int]:
  """The step folders under RUN/checkpoints, finished or not, from a listing alone. Where every
  process must decide alike (a multi-process run's start), this and not a CheckpointManager: a
  manager's creation synchronises the processes, and one process could create one while another,
  which saw no checkpoints/ yet, does not (a mismatched barrier)."""
  directory = storage.join(storage.abspath(workdir), CHECKPOINTS_DIR)
  with readable(directory):
    if not storage.isdir(directory):
      return []
    return sorted(int(n) for n in storage.listdir(directory) if n.isdigit())


def saved_stream_count(workdir: str) -> int | None:
  """N where the newest checkpoint with a data position holds one per process of N > 1
  processes (runs saved before issue 45, whose data streams are per process); else None. From
  listings alone (step_dirs)."""
  directory = storage.join(storage.abspath(workdir), CHECKPOINTS_DIR)
  for step in reversed(step_dirs(workdir)):
    data = storage.join(directory, str(step), 'data')
    with readable(directory):
      names = storage.listdir(data) if storage.isdir(data) else []
    count = per_process_count(names)
    if POSITION in names or count is not None:
      return count if POSITION not in names and count > 1 else None
  return None


def per_process_count(names: list[str]) -> int | None:
  """The process count N of the per-process data positions (process_<i>-of-<N>.json) among a
  checkpoint's data files, or None where there are none."""
  counts = {int(m.group(2)) for m in map(_PER_PROCESS.fullmatch, names) if m}
  return max(counts) if counts else None


def summarize_differences(diffs: list[str]) -> str:
  """The first three of shape_differences' lines, and how many more there are."""
  more = f' (and {len(diffs) - 3} more)' if len(diffs) > 3 else ''
  return f'{"; ".join(diffs[:3])}{more}'


_within = threading.local()     # this thread already runs inside a bounded read


def _bounded(what: str):
  """A Checkpointer method that reads a gs:// run's checkpoints, bounded: orbax lists them and
  reads their metadata through gcsfs (no timeout) and their arrays through tensorstore, and a
  storage endpoint that stopped answering kept a restore waiting for as long as it was down
  (issue 57: 308 s, until it answered). The call runs in a thread waited for
  storage.waits.CHECKPOINT_WAIT_S at most; past it, one paragraph (a StorageError) naming what
  stalled; the thread is left behind (main.py then ends the process). A local disk: as it is."""
  def wrap(method):
    @functools.wraps(method)
    def bounded(self, *args, **kwargs):
      if not self.remote or getattr(_within, 'active', False):
        return method(self, *args, **kwargs)

      def inner():
        _within.active = True
        return method(self, *args, **kwargs)
      seconds = storage.waits.CHECKPOINT_WAIT_S
      return storage.waits.call(inner, seconds, _stalled_read(self.directory, what, seconds))
    return bounded
  return wrap


def _stalled_read(directory: str, what: str, seconds: float) -> str:
  return (f'{what[0].upper()}{what[1:]} in {directory} did not finish within {seconds:.0f} s: the '
          'storage stopped answering (or is far slower than it should be). Nothing was changed '
          'there: the checkpoints are intact; once the storage answers, run the same command '
          'again (a training run resumes from the latest checkpoint). '
          '(GATED_ATTENTION_CHECKPOINT_WAIT_S sets this bound.)')


class Checkpointer:
  """The orbax CheckpointManager of one workdir: `save`, `restore_latest`, `restore_params`."""

  def __init__(self, workdir: str, *, every: int = 1, keep: int | None = None,
               read_only: bool = False):
    self.directory = storage.join(storage.abspath(workdir), CHECKPOINTS_DIR)
    self.remote = storage.is_remote(self.directory)
    storage.forget_listings(self.directory)   # orbax's gcsfs caches them: see today's steps
    policy = ocp.checkpoint_managers
    level = lambda m: m['loss_level']  # noqa: E731
    preserve = policy.AnyPreservationPolicy([
        policy.LatestN(keep),
        policy.BestN(get_metric_fn=level, reverse=True, n=1,
                     keep_checkpoints_without_metrics=True)])
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for args in (ocp.args.StandardSave, ocp.args.StandardRestore):
      registry.add('state', args, ocp.StandardCheckpointHandler())
    # The data position: one file for every process (data/position.json, process 0 writes it),
    # or per process (process_<i>-of-<n>.json: grain's handler) in runs saved by several
    # processes before issue 45, which go on saving it so.
    registry.add('data', ocp.args.JsonSave, ocp.handlers.JsonCheckpointHandler(filename=POSITION))
    registry.add('data', grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointHandler())
    options = ocp.CheckpointManagerOptions(
        create=not read_only, read_only=read_only, enable_async_checkpointing=not read_only,
        preservation_policy=preserve, best_fn=level, best_mode='min',
        save_decision_policy=policy.AnySavePolicy([
            policy.FixedIntervalPolicy(every), policy.PreemptionCheckpointingPolicy()]))
    self.manager = self._open(options, registry, read_only)
    self._sizes = {}
    self._issued = None        # the step of the last save started by this process
    self._committed = None     # a step known to be written (the one restored, or a finished save)

  @_bounded('listing the checkpoints')
  def _open(self, options, registry, read_only: bool):
    """orbax's manager of the directory (it lists the steps there as it is made)."""
    with _quiet_orbax() if read_only else contextlib.nullcontext():
      return self._listing(lambda: ocp.CheckpointManager(
          self.directory, options=options, handler_registry=registry))

  def _readable(self):
    return readable(self.directory)

  def _listing(self, fn, again=None):
    """fn() (an orbax call that lists the steps), listed again where a step folder vanished
    under it (a trainer's rotation, seen by a reader of a live run), READ_RACES times at most;
    `again` refreshes orbax's listing first."""
    for race in range(READ_RACES + 1):
      try:
        with self._readable():
          return fn()
      except Rotated:
        if race == READ_RACES:
          raise
        if again is not None:
          again()
    raise AssertionError('unreachable')

  @_bounded('listing the checkpoints')
  def all_steps(self) -> list[int]:
    """Steps of the finished checkpoints (unfinished temporaries are not listed)."""
    return sorted(self._listing(self.manager.all_steps, self.manager.reload))

  @_bounded('listing the checkpoints')
  def latest_step(self) -> int | None:
    return self._listing(self.manager.latest_step, self.manager.reload)

  @_bounded('reading the checkpoints\' metrics')
  def best_step(self, before: int | None = None) -> int | None:
    """The checkpoint with the lowest running loss level (the loop's, saved with it), among
    those before step `before`; warm starts and older checkpoints without it rank last."""
    ranked = []
    for step in self.all_steps():
      if before is None or step < before:
        metrics = self.manager.metrics(step) or {}
        ranked.append((metrics.get('loss_level', float('inf')), -step, step))
    return min(ranked)[2] if ranked else None

  def wait(self):
    """Blocks until the pending asynchronous save is written, for at most
    storage.waits.CHECKPOINT_WAIT_S: orbax's wait has no timeout, and a storage endpoint that
    stopped answering kept it (and the process) waiting for as long as it was down. Past the
    bound, a StorageError of one paragraph (orbax's threads are left behind)."""
    with self._save_errors():
      storage.waits.call(self.manager.wait_until_finished, *self._save_bound())

  def _save_bound(self) -> tuple[float, str]:
    """A wait on orbax's save: (storage.waits.CHECKPOINT_WAIT_S, the paragraph past it)."""
    seconds = storage.waits.CHECKPOINT_WAIT_S
    return seconds, (
        f'Saving a checkpoint to {self.directory} did not finish within {seconds:.0f} s: the '
        'storage stopped answering (or is far slower than it should be). The checkpoints '
        'before it are intact; once the storage answers, run the same command again to resume '
        'from the latest one. (GATED_ATTENTION_CHECKPOINT_WAIT_S sets this bound.)')

  def should_save(self, step: int) -> bool:
    """Every `every` steps, or when the cluster signals a preemption."""
    return self.manager.should_save(step)

  def has_data(self, step: int) -> bool:
    return storage.isdir(storage.join(self.directory, str(step), 'data'))

  @contextlib.contextmanager
  def _save_errors(self):
    """A failed asynchronous save, whichever orbax call raises it, as one CheckpointError; a
    stalled storage as its StorageError. The block has a hard deadline too (storage.waits:
    orbax's synchronous part of a save, which no other thread can interrupt, may wait on a
    stalled endpoint): past the bound and a grace period, one paragraph and exit status 1."""
    seconds = storage.waits.CHECKPOINT_WAIT_S + storage.waits.GRACE_S
    hard = (f'Saving a checkpoint to {self.directory} did not finish within {seconds:.0f} s: the '
            'storage stopped answering. The checkpoints before it are intact; once the storage '
            'answers, run the same command again to resume from the latest one. '
            '(GATED_ATTENTION_CHECKPOINT_WAIT_S sets this bound.)')
    try:
      with storage.waits.deadline(seconds, hard):
        yield
    except (CheckpointError, StorageError):
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(
          f'Saving a checkpoint to {self.directory} failed: {type(e).__name__}: {e}\nThe '
          'checkpoints before it are intact; fix the cause (disk space, permissions) and run the '
          'same command again to resume from the latest one.') from e

  def check_for_errors(self):
    """Raises a CheckpointError if an asynchronous save failed. orbax keeps the error of a
    failed save in its finalize thread (its check_for_errors misses it) until that thread is
    joined, so a save that has finished is joined here (at once). Bounded as `wait` is: orbax's
    check also waits for its metadata writes, without a timeout, and the loop calls it at every
    step (a frozen endpoint held a trainer there until the save's hard deadline, past the
    closing that releases the lock). The bound's thread costs about 0.06 ms a step."""
    def check():
      self.manager.check_for_errors()
      if not self.manager.is_saving_in_progress():
        self.manager.wait_until_finished()
    with self._save_errors():
      storage.waits.call(check, *self._save_bound())

  def _check_disk_space(self):
    """Refuses a save the disk cannot hold: less free space than the last checkpoint took. It
    first waits for the save in flight (the next save would wait for it anyway): until that one
    is committed, the latest step is the one before it, or none (a fast loop reached its second
    save before the first was written, and the check measured nothing)."""
    self.wait()
    latest = self.latest_step()
    if latest is None or self.remote:   # object storage has no free-space call (and no limit)
      return
    if latest not in self._sizes:
      self._sizes[latest] = _dir_bytes(os.path.join(self.directory, str(latest)))
    need, free = self._sizes[latest], shutil.disk_usage(self.directory).free
    if free < need:
      raise CheckpointError(
          f'Only {free / 2**20:.1f} MiB are free on the disk of {self.directory}, and the last '
          f'checkpoint took {need / 2**20:.1f} MiB: the next save would fail. Free space (or '
          f'move the run), then run the same command again: it resumes from step {latest}.')

  def last_committed_step(self) -> int | None:
    """The newest step this process knows to be written, from memory alone (it never waits
    on the storage: cluster/liveness.py asks it from another thread while a collective hangs)."""
    if self._issued is not None and not self.manager.is_saving_in_progress():
      return self._issued
    return self._committed

  def _save(self, step: int, state: dict, items: dict, metrics, loop_state):
    self.check_for_errors()
    self._check_disk_space()     # waits for the save in flight: it is written now
    self._committed = self._issued if self._issued is not None else self._committed
    sums, bad = integrity(state)
    if bad:
      raise CheckpointError(f'Refusing to save checkpoint {step}: {len(bad)} array(s) hold '
                            f'non-finite values, e.g. {bad[:3]}.')
    with self._save_errors():  # it first waits for the previous save, which may have failed
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      **items),
                        force=True, metrics=metrics,
                        custom_metadata={'checksums': sums, 'loop': loop_state or {}})
    self._issued = step

  def save(self, step: int, state: dict, data_iter, *, metrics: dict | None = None,
           loop_state: dict | None = None, per_process_stream: bool = False):
    """Starts an async save of `state` (a pytree) and the data iterator's position (one for
    all processes, or with `per_process_stream` each process's own); `metrics`
    ({'loss_level': ...}) ranks it for the best-checkpoint rule, `loop_state` is restored with
    it (JSON)."""
    data = (grain.checkpoint.CheckpointSave(data_iter) if per_process_stream
            else ocp.args.JsonSave(data_iter.get_state()))
    self._save(step, state, {'data': data}, metrics, loop_state)

  def save_params(self, step: int, params: dict):
    """A warm-start checkpoint: the parameters alone (imports), kept outside the best-checkpoint
    ranking (no loss level; orbax warns of that)."""
    with _quiet_orbax():
      self._save(step, {'params': params}, {}, None, None)

  def _checksums(self, step: int) -> dict | None:
    """The checksums saved with checkpoint `step` (None without its _CHECKPOINT_METADATA or
    with one written before checksums existed)."""
    try:
      with _quiet_orbax():   # a read-only manager warns of every item it has no handler for
        custom = self.manager.metadata(step).custom_metadata
    except Exception:  # pylint: disable=broad-except  # a missing or unreadable metadata file
      return None
    return (custom or {}).get('checksums')

  def _verify(self, step: int, state: dict, warn=print):
    """Finite values always; the checksums where the checkpoint has them (a warning that it is
    unverified where it has none: deleted metadata, or written before checksums existed)."""
    want = self._checksums(step)
    got, bad = integrity(state)
    if bad:
      raise CheckpointError(f'non-finite values in {bad[:3]}')
    if want is None:
      meta = storage.join(self.directory, str(step), '_CHECKPOINT_METADATA')
      why = ('its _CHECKPOINT_METADATA is missing' if not storage.exists(meta)
             else 'it has no checksums (written by older code?)')
      warn(f'Warning: checkpoint {step} in {self.directory} is unverified: {why}, so its arrays '
           'cannot be checked against the checksums taken when it was saved (its values are '
           'finite).')
      return
    wrong = [k for k in got if k in want and want[k] != got[k]]
    if wrong or not set(got) <= set(want):
      raise CheckpointError(f'checksum mismatch in {(wrong or sorted(set(got) - set(want)))[:3]}')

  def _restore(self, step: int, abstract_state: dict, data_iter, warn=print) -> Restored:
    if not storage.isdir(storage.join(self.directory, str(step), 'state')):
      raise CheckpointError('empty or partial: it holds no state')
    if not self.has_data(step):
      params = self._read_params(step, abstract_state['params'])
      self._verify(step, {'params': params}, warn)
      return Restored(step, {'params': params}, {}, warm=True)
    position = self._data_position(step)
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state)))
    except Exception as e:  # orbax raises many types
      raise CheckpointError(_reason(e)) from e
    self._verify(step, out['state'], warn)
    # Only a verified checkpoint moves the data iterator: a rejected one leaves it where it was
    # (issue 50: a run whose newer checkpoints were all set aside read another run's data).
    try:
      data_iter.set_state(position)
    except Exception as e:  # pylint: disable=broad-except  # grain raises many types
      raise PositionMismatch(f'its data position does not fit this data pipeline '
                             f'({_reason(e)})') from e
    loop = self.manager.metadata(step).custom_metadata.get('loop') or {}
    return Restored(step, out['state'], loop, warm=False)

  def _data_position(self, step: int) -> dict:
    """The data iterator's state saved with checkpoint `step`: the one for all processes, or
    (runs saved by several processes before issue 45) this process's own, read and parsed before
    anything is restored."""
    data = storage.join(self.directory, str(step), 'data')
    try:
      names = storage.listdir(data)
      if POSITION in names:
        name = POSITION
      else:
        count = per_process_count(names)
        index = 0 if count == 1 else jax.process_index()
        if count is None:
          raise CheckpointError(f'its data holds no position ({names})')
        if count > 1 and count != jax.process_count():
          raise PositionMismatch(f'its data positions are those of {count} processes, each its '
                                 f'own stream; this run has {jax.process_count()}')
        name = f'process_{index}-of-{count}.json'
      return json.loads(storage.read_text(storage.join(data, name)))
    except CheckpointError:
      raise
    except Exception as e:  # pylint: disable=broad-except  # unreadable, truncated, not JSON
      raise CheckpointError(f'its data position is unreadable ({_reason(e)})') from e


  def set_aside(self, step: int) -> str:
    """Moves an unusable step out of orbax's view (kept for inspection, never deleted): a rename,
    or on object storage a checked copy and then the original's deletion."""
    src = storage.join(self.directory, str(step))
    dst, n = f'{src}.unusable', 1
    while storage.exists(dst):
      n += 1
      dst = f'{src}.unusable{n}'
    if jax.process_index() == 0:
      storage.move_tree(src, dst)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f'set_aside_{step}')
    self.manager.reload()
    return dst

  @_bounded('reading a checkpoint\'s metadata')
  def shape_differences(self, step: int, abstract_params: dict) -> list[str]:
    """How the parameters saved in checkpoint `step` differ in names or shapes from
    `abstract_params` ([] if they agree, or if the checkpoint's metadata cannot be read: then
    the restore itself decides). A model of another shape is not a damaged checkpoint."""
    from etils import epath  # pylint: disable=g-import-not-at-top
    try:
      with _quiet_orbax():
        tree = ocp.StandardCheckpointHandler().metadata(
            epath.Path(storage.join(self.directory, str(step), 'state')))
      saved = getattr(tree, 'tree', tree)['params']
    except Exception:  # pylint: disable=broad-except  # damaged metadata: not a shape question
      return []
    def shapes(tree):
      return {jax.tree_util.keystr(p): tuple(getattr(leaf, 'shape', ()))
              for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
    have, want = shapes(saved), shapes(abstract_params)
    diffs = [f'params{k}: saved {have.get(k, "absent")}, this config {want.get(k, "absent")}'
             for k in sorted(set(have) | set(want)) if have.get(k) != want.get(k)]
    if diffs:   # the model settings behind the shapes, where they can be read off them
      s_have, s_want = _settings(have), _settings(want)
      named = [f'model.{k}: checkpoint {s_have[k]}, this config {s_want[k]}'
               for k in s_have if k in s_want and s_have[k] != s_want[k]]
      diffs = named + diffs if named else diffs
    return diffs

  def check_shapes(self, step: int, abstract_params: dict):
    diffs = self.shape_differences(step, abstract_params)
    if diffs:
      raise CheckpointError(
          f'Checkpoint {step} in {self.directory} holds a model of other shapes than this config: '
          f'{summarize_differences(diffs)}. The checkpoint is intact and was left as it is. The '
          'config differs from the one the run was trained with (is its config.json missing or '
          'replaced?): resume with the run\'s own settings (the same --config and --config.model.* '
          'overrides), or train the new shape in a new --workdir, with '
          f'--config.train.init_from={storage.dirname(self.directory)} only if the shapes agree.')

  @_bounded('restoring the latest checkpoint')
  def restore_latest(self, abstract_state: dict, data_iter, *, warn=print) -> Restored | None:
    """The newest intact checkpoint, onto the shardings of `abstract_state`; unusable newer ones
    are set aside with a warning. None if there is none. A checkpoint of another model shape is
    refused (a CheckpointError naming the differences), never set aside."""
    steps, unusable = self.all_steps(), []
    for step in reversed(steps):
      self.check_shapes(step, abstract_state['params'])
      try:
        with console.without_event_loop_noise(), _quiet_orbax():
          restored = self._restore(step, abstract_state, data_iter, warn)
        self._committed = step
        return restored
      except PositionMismatch as e:   # intact, but not for this pipeline: never set aside
        raise CheckpointError(
            f'Checkpoint {step} in {self.directory}: {e}. The checkpoint is intact and was left '
            'as it is: resume with the settings it was saved with.') from None
      except CheckpointError as e:
        moved = self.set_aside(step)
        unusable.append(f'{step} ({e}; now {storage.basename(moved)})')
        warn(f'Warning: checkpoint {step} is unusable ({e}); set aside as {moved} (not '
             'deleted); trying the previous one.')
    if unusable or self.set_aside_steps():
      # Starting over here would write new checkpoints and metrics over the old run's: a person
      # decides (docs/faults.md: why this refuses rather than starting over).
      what = (f'every checkpoint is unusable: {"; ".join(unusable)}' if unusable else
              'it has no usable checkpoint, only ones set aside as unusable: '
              f'{", ".join(self.set_aside_steps())}')
      raise CheckpointError(
          f'{storage.dirname(self.directory)}: {what}. Nothing was restored or trained, and the '
          'set-aside checkpoints are kept for inspection. To train this run from step 0 again, '
          f'move or delete {self.directory} and the run\'s metrics, or give a new --workdir.')
    return None

  def set_aside_steps(self) -> list[str]:
    """The names of the checkpoints set aside as unusable (<step>.unusable[N])."""
    if not storage.isdir(self.directory):
      return []
    return sorted(n for n in storage.listdir(self.directory) if _SET_ASIDE.fullmatch(n))

  @_bounded('restoring a checkpoint')
  def restore_step(self, step: int, abstract_state: dict, data_iter) -> Restored:
    """Checkpoint `step` (verified), e.g. the best one, for a rollback."""
    return self._restore(step, abstract_state, data_iter)

  def _read_params(self, step: int, abstract_params: dict) -> dict:
    """The parameters of checkpoint `step` alone, unverified (the optimizer state is not read).
    A reader of its own: orbax binds an item to the handler of its first use (a partial restore's
    PyTree handler here, the standard one for saves). Errors: a CheckpointError of one line."""
    if not storage.isdir(storage.join(self.directory, str(step), 'state')):
      raise CheckpointError('empty or partial: it holds no state')
    item = {'params': abstract_params}
    with _quiet_orbax():   # the reader lists every step as it opens: listed again where one
      options = ocp.CheckpointManagerOptions(read_only=True)   # vanishes (a rotation; not damage)
      reader = self._listing(lambda: ocp.CheckpointManager(
          self.directory, options=options, item_names=('state', 'data')))
    try:
      with console.without_event_loop_noise(), _quiet_orbax():
        out = reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True)))
    except Exception as e:  # orbax raises many types (a TensorStore spec dump for a bad file)
      shape = any(w in str(e).lower() for w in ('shape', 'structure', 'mismatch', 'keys'))
      hint = ('; is the saved config.json the one it was trained with?' if shape
              else '; its files are damaged or incomplete')
      raise CheckpointError(f'{_reason(e)}{hint}') from e
    finally:
      reader.close()
    return out['state']['params']

  def _verified_params(self, step: int, abstract_params: dict, warn) -> dict:
    params = self._read_params(step, abstract_params)
    self._verify(step, {'params': params}, warn)
    return params

  @_bounded('reading a checkpoint\'s parameters')
  def restore_params(self, step: int, abstract_params: dict, *, warn=print) -> dict:
    """The parameters of checkpoint `step` alone, verified like a training restore (finite
    values, the checksums saved with it). Read-only: nothing in the run directory is changed; a
    bad checkpoint is a one-paragraph CheckpointError naming the intact-looking others."""
    try:
      return self._verified_params(step, abstract_params, warn)
    except (CheckpointError, OSError) as e:
      if isinstance(e, Rotated) or self._gone(step, step):
        raise CheckpointError(
            f'Checkpoint {step} in {self.directory} was removed while it was read: the run is '
            'training and rotated it away (its checkpoints are fine). The checkpoints there '
            f'now: {self.all_steps() or "none"}; read one of those (--step=N), or the latest '
            '(no --step).') from None
      others = [s for s in self.all_steps() if s != step]
      raise CheckpointError(
          f'Checkpoint {step} in {self.directory} is unusable ({e}). Its files were left as they '
          f'are. Other checkpoints: {others or "none"}; pick one (e.g. --step=N where the mode '
          'takes it), or resume training in the run directory, which sets a bad newest checkpoint '
          'aside and continues from the one before.') from None

  @_bounded('reading the latest checkpoint\'s parameters')
  def restore_latest_params(self, abstract_params: dict, *, warn=print) -> tuple[int, dict]:
    """(step, parameters) of the newest checkpoint that verifies; a bad newer one is skipped
    with a warning naming what was wrong (read-only: never set aside or changed). A run that is
    training may remove the checkpoint being read (its rotation): the reader says so and reads
    the newest one again, READ_RACES times at most (issue 57: it called them damaged, blamed the
    config, and gave up while the trainer wrote newer ones)."""
    for race in range(READ_RACES + 1):
      try:
        return self._latest_params(abstract_params, warn)
      except Rotated as e:
        if race == READ_RACES:
          raise CheckpointError(
              f'The checkpoints in {self.directory} were removed while they were read '
              f'{READ_RACES + 1} times in a row ({e}): the run is training and rotates them '
              'faster than they can be read here. Read a step it keeps (--step=N), or once it '
              'stops; nothing was changed.') from None
        warn(f'Note: {e}: the run is training and rotated it away (the checkpoints are fine); '
             'reading the newest one again.')
        self._listing(self.manager.reload)
    raise AssertionError('unreachable')

  def _gone(self, step: int, newest: int) -> bool:
    """Whether checkpoint `step` was removed, or is being removed, since a read that began when
    `newest` was the newest: a fresh listing lacks it, or shows a newer save (the trainer
    rotates after each), or its folder is gone."""
    storage.forget_listings(self.directory)
    try:
      self._listing(self.manager.reload)
      steps = self.all_steps()
    except Rotated:
      return True
    return (step not in steps or (steps and steps[-1] > newest)
            or not storage.isdir(storage.join(self.directory, str(step))))

  def _latest_params(self, abstract_params: dict, warn) -> tuple[int, dict]:
    """restore_latest_params's one pass over a fresh listing; a Rotated error where the
    checkpoint it reads was removed meanwhile (its warnings, such as "unverified", are dropped
    then: they were about a checkpoint half deleted)."""
    steps = self.all_steps()
    for step in reversed(steps):
      said = []
      try:
        self.check_shapes(step, abstract_params)
        params = self._verified_params(step, abstract_params, said.append)
      except (CheckpointError, OSError) as e:   # OSError: a file listed, then removed
        if isinstance(e, Rotated) or self._gone(step, steps[-1]):
          raise Rotated(f'checkpoint {step} was removed while it was read') from None
        if 'other shapes than this config' in str(e):
          raise
        warn(f'Warning: checkpoint {step} in {self.directory} is unusable ({e}); reading the one '
             'before it (the run directory is left as it is).')
        continue
      if said and self._gone(step, steps[-1]):
        raise Rotated(f'checkpoint {step} was removed while it was read')
      for line in said:
        warn(line)
      return step, params
    raise CheckpointError(f'No usable checkpoint in {self.directory}: checkpoints {steps} all '
                          'failed verification (warnings above).')

  def close(self):
    if storage.waits.abandoned():   # a save stuck on storage: waiting or closing joins it again
      return
    try:
      self.wait()
    finally:
      if not storage.waits.abandoned():
        self.manager.close()
