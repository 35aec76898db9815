"""Window shuffling as a checkpointable grain IterDataset.

Like grain.experimental.WindowShuffleIterDataset, but each window is permuted by one numpy
call: grain's per-element index_shuffle costs milliseconds per element for small windows.
"""

import copy
import itertools

import grain
import numpy as np


class WindowShuffleIterDataset(grain.IterDataset):
  """Reads `window_size` elements at a time and yields them in a random order of (seed, window)."""

  def __init__(self, parent: grain.IterDataset, *, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = window_size, seed

  def __iter__(self) -> grain.DatasetIterator:
    return _WindowShuffleIterator(self._parent.__iter__(), self._window_size, self._seed)

  def __str__(self):
    return f'WindowShuffleIterDataset(window_size={self._window_size})'


class _WindowShuffleIterator(grain.DatasetIterator):
  """State: the parent's state at the start of the current window, its index, the position in it.

  Restoring re-reads that one window.
  """

  def __init__(self, parent: grain.DatasetIterator, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = window_size, seed
    self._window, self._pos, self._index = [], 0, -1  # no window read yet
    self._start_state = None

  def _fill(self, index: int):
    self._index, self._pos = index, 0
    self._start_state = copy.deepcopy(self._parent.get_state())
    items = list(itertools.islice(self._parent, self._window_size))
    order = np.random.default_rng((self._seed, index)).permutation(len(items))
    self._window = [items[i] for i in order]

  def __next__(self):
    if self._pos == len(self._window):
      self._fill(self._index + 1)
      if not self._window:
        raise StopIteration
    self._pos += 1
    return self._window[self._pos - 1]

  def get_state(self) -> dict:
    if self._pos == len(self._window):  # between windows
      return {'parent': copy.deepcopy(self._parent.get_state()), 'window_index': self._index + 1,
              'pos': 0}
    return {'parent': copy.deepcopy(self._start_state), 'window_index': self._index, 'pos': self._pos}

  def set_state(self, state: dict):
    self._parent.set_state(state['parent'])
    self._window, self._pos, self._index = [], 0, state['window_index'] - 1
    if state['pos']:
      self._fill(state['window_index'])
      self._pos = state['pos']
