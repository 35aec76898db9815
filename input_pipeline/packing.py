"""Concat-and-chunk packing as a checkpointable grain IterDataset."""

import copy

import grain
import numpy as np


class PackIterDataset(grain.IterDataset):
  """Joins the parent's 1-D token arrays into one stream and cuts it into windows [length].

  A document may span windows; nothing is padded or dropped except the final partial
  window of a finite parent.
  """

  def __init__(self, parent: grain.IterDataset, length: int):
    super().__init__(parent)
    self._length = length

  def __iter__(self) -> grain.DatasetIterator:
    return _PackIterator(self._parent.__iter__(), self._length)

  def __str__(self):
    return f'PackIterDataset(length={self._length})'


class _PackIterator(grain.DatasetIterator):
  """State: the parent's state before the current document, and the offset into it.

  Restoring re-reads that one document, so states stay small (no token buffers).
  """

  def __init__(self, parent: grain.DatasetIterator, length: int):
    super().__init__(parent)
    self._length = length
    self._doc = np.zeros(0, np.int32)  # the current document [num_tokens]
    self._pos = 0                      # next token of self._doc to emit
    self._doc_state = copy.deepcopy(self._parent.get_state())

  def _next_doc(self):
    self._doc_state = copy.deepcopy(self._parent.get_state())
    self._doc, self._pos = np.asarray(next(self._parent)), 0

  def __next__(self) -> np.ndarray:
    pieces, need = [], self._length
    while need:
      if self._pos == len(self._doc):
        self._next_doc()  # StopIteration ends a finite parent, dropping a partial window
      take = min(need, len(self._doc) - self._pos)
      pieces.append(self._doc[self._pos:self._pos + take])
      self._pos += take
      need -= take
    return np.concatenate(pieces)

  def get_state(self) -> dict:
    if self._pos == len(self._doc):
      return {'parent': self._parent.get_state(), 'offset': 0}
    return {'parent': self._doc_state, 'offset': self._pos}

  def set_state(self, state: dict):
    self._parent.set_state(state['parent'])
    self._doc, self._pos = np.zeros(0, np.int32), 0
    self._doc_state = copy.deepcopy(state['parent'])
    if state['offset']:
      self._next_doc()
      self._pos = state['offset']


class TaggedPackIterDataset(PackIterDataset):
  """PackIterDataset for documents that say where they come from: each parent element is
  {'tokens': int32 [n], 'source': int, 'epoch': int} (a mixture's, input_pipeline/mixture.py)
  and each window {'tokens': [length], 'source': int8 [length], 'epoch': int32 [length]}: the
  same tokens PackIterDataset cuts, and per token its document's source and source epoch."""

  def __iter__(self) -> grain.DatasetIterator:
    return _TaggedPackIterator(self._parent.__iter__(), self._length)

  def __str__(self):
    return f'TaggedPackIterDataset(length={self._length})'


class _TaggedPackIterator(_PackIterator):
  """_PackIterator's states; the tags ride along with the tokens."""

  def __init__(self, parent: grain.DatasetIterator, length: int):
    super().__init__(parent, length)
    self._tags = (0, 0)

  def _next_doc(self):
    self._doc_state = copy.deepcopy(self._parent.get_state())
    doc = next(self._parent)
    self._doc, self._pos = np.asarray(doc['tokens']), 0
    self._tags = (int(doc['source']), int(doc['epoch']))

  def __next__(self) -> dict:
    tokens, source, epoch, need = [], [], [], self._length
    while need:
      if self._pos == len(self._doc):
        self._next_doc()
      take = min(need, len(self._doc) - self._pos)
      tokens.append(self._doc[self._pos:self._pos + take])
      source.append(np.full(take, self._tags[0], np.int8))
      epoch.append(np.full(take, self._tags[1], np.int32))
      self._pos += take
      need -= take
    return {'tokens': np.concatenate(tokens), 'source': np.concatenate(source),
            'epoch': np.concatenate(epoch)}
