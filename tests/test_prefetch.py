"""prefetch.py: batches come out in order, read ahead in a thread, and the saved state is the
position after the last batch *consumed*, so a resumed or rolled-back run sees the same batches."""

import json
import threading

import pytest

from gated_attention.training.prefetch import DevicePrefetch
from gated_attention.input_pipeline import build_data
from tests.test_input_pipeline import assert_batches_equal, corpus, corpus_cfg, take  # noqa: F401


def _data(corpus):  # noqa: F811
  return build_data(corpus_cfg(corpus, shuffle_buffer=8), global_batch_size=4, seed=3)


class _ToDevice:
  """Stands in for Setup.global_batch: records which thread moved each batch."""

  def __init__(self):
    self.threads = []

  def __call__(self, batch):
    self.threads.append(threading.current_thread().name)
    return dict(batch)


@pytest.mark.parametrize('depth', [0, 1, 3])
def test_prefetch_keeps_order_and_the_consumed_state(corpus, depth):  # noqa: F811
  plain = _data(corpus).train_iter
  to_device = _ToDevice()
  batches = DevicePrefetch(_data(corpus).train_iter, to_device, depth)
  expected = take(plain, 12)
  assert_batches_equal(take(batches, 5), expected[:5])
  plain_after_5 = _data(corpus).train_iter
  take(plain_after_5, 5)
  state = json.loads(json.dumps(batches.get_state()))     # what a checkpoint holds
  assert state == json.loads(json.dumps(plain_after_5.get_state()))
  if depth:   # the parent has been read ahead by the thread
    assert all(t.startswith('device_prefetch') for t in to_device.threads)
    batches.start_prefetch()
    for f in list(batches._pending):  # pylint: disable=protected-access
      f.result()
    assert len(to_device.threads) == 5 + depth
  else:
    assert to_device.threads == ['MainThread'] * 5
  resumed = DevicePrefetch(_data(corpus).train_iter, _ToDevice(), depth)
  resumed.set_state(state)                                # a resumed run
  assert_batches_equal(take(resumed, 7), expected[5:])
  batches.set_state(state)                                # a rollback on the same iterator
  assert_batches_equal(take(batches, 7), expected[5:])
  for it in (batches, resumed):
    it.shutdown()
