"""The next batches, fetched and put on the devices while the current step runs.

    batches = DevicePrefetch(data.train_iter, setup.global_batch, depth=config.data.device_prefetch)
    batch = next(batches)         # global jax arrays, already on the devices
    batches.get_state()           # the data position after the last batch *returned*

One background thread reads the next `depth` batches from the data iterator and puts each on
the devices (`to_device`, e.g. train.Setup.global_batch, which keeps the batch sharding of the
train step) while the loop runs the step on the current one. Batches come out in the iterator's
order, so a run sees exactly the batches it would without prefetching.

Checkpoints save `get_state()`: the iterator's state right after the last batch the loop
consumed, recorded by the thread when it read that batch, not the state after the prefetched
ones (which the parent iterator has already passed). `set_state` (a restore or a rollback) drops
the prefetched batches and moves the parent there. `depth=0` reads synchronously in `__next__`.
It is a grain DatasetIterator, so grain's orbax handler saves and restores it like the parent.

`bound=(seconds, paragraph)`: a batch not read within `seconds` (data on object storage whose
endpoint stopped answering; issue 57) is given up with a StorageError of `paragraph`, the
reading thread left behind (storage/waits.py: the process is then ended by main.py).
"""

import collections
import concurrent.futures
import copy
import queue
import threading

import grain

from gated_attention import storage


class _DaemonWorker:
  """One daemon thread running submitted calls in order (ThreadPoolExecutor's, as `submit` and
  `shutdown`): a read left stuck on a stalled storage must not keep Python from exiting
  (concurrent.futures joins its threads at exit)."""

  def __init__(self):
    self._tasks = queue.SimpleQueue()
    self._thread = threading.Thread(target=self._work, name='device_prefetch', daemon=True)
    self._thread.start()

  def _work(self):
    while True:
      task = self._tasks.get()
      if task is None:
        return
      future, fn = task
      if not future.set_running_or_notify_cancel():
        continue
      try:
        future.set_result(fn())
      except BaseException as e:  # pylint: disable=broad-except  # the caller's, via the future
        future.set_exception(e)

  def submit(self, fn) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    self._tasks.put((future, fn))
    return future

  def shutdown(self, wait: bool = True, cancel_futures: bool = False):
    del cancel_futures   # the caller drops its futures
    self._tasks.put(None)
    if wait:
      self._thread.join()


class DevicePrefetch(grain.DatasetIterator):
  """Batches of `parent` passed through `to_device`, up to `depth` of them read ahead."""

  def __init__(self, parent: grain.DatasetIterator, to_device, depth: int = 2, *,
               bound: tuple[float, str] | None = None):
    super().__init__(parent)
    self._bound = bound
    if depth < 0:
      raise ValueError(f'prefetch depth must be >= 0, got {depth}.')
    self._to_device, self._depth = to_device, depth
    self._pool = _DaemonWorker() if depth else None
    self._pending = collections.deque()   # futures of (device batch, parent state after it)
    self._state = copy.deepcopy(parent.get_state())

  def _read(self):
    batch = next(self._parent)
    return self._to_device(batch), copy.deepcopy(self._parent.get_state())

  def _fill(self):
    while self._pool is not None and len(self._pending) < self._depth:
      self._pending.append(self._pool.submit(self._read))

  def __next__(self):
    if self._pool is None:
      if self._bound is not None:
        batch, self._state = storage.waits.call(self._read, *self._bound)
      else:
        batch, self._state = self._read()
      return batch
    self._fill()
    try:
      batch, state = self._pending[0].result(
          timeout=None if self._bound is None else self._bound[0])
    except concurrent.futures.TimeoutError:
      raise storage.waits.give_up(self._bound[1]) from None
    self._pending.popleft()
    self._state = state
    self._fill()                          # read the following batches while this one is used
    return batch

  def start_prefetch(self) -> None:
    self._fill()

  def get_state(self) -> dict:
    return copy.deepcopy(self._state)

  def set_state(self, state: dict) -> None:
    self._drain()
    self._parent.set_state(state)
    self._state = copy.deepcopy(state)

  def _drain(self):
    """Waits for the batches being read and drops them (their errors too)."""
    while self._pending:
      concurrent.futures.wait([self._pending.popleft()])

  def shutdown(self):
    """Stops the thread (the parent stays open). A read left waiting on a stalled storage is
    not waited for."""
    if storage.waits.abandoned() and self._pool is not None:
      self._pending.clear()
      self._pool.shutdown(wait=False, cancel_futures=True)
      self._pool = None
      return
    self._drain()
    if self._pool is not None:
      self._pool.shutdown()
      self._pool = None

  def __str__(self):
    return f'DevicePrefetch(depth={self._depth})'
