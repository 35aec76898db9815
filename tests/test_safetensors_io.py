"""gated_attention/runs/hf/safetensors_io.py against hostile or damaged Hugging Face folders
(issue 37 items 4 and 8): nothing outside --hf is read, and every bad header or index is an
HFFormatError naming the file, not a traceback or a "tensor" read from the header's bytes."""

import json
import os
import struct

import numpy as np
import pytest

from gated_attention.runs.hf import safetensors_io as st
from gated_attention.runs.hf.errors import HFFormatError


def _write(path, tensors):
  st.write_file(str(path), [(n, a.shape, a.dtype, lambda a=a: a) for n, a in tensors.items()])


def _raw(path, header: object, data: bytes = b''):
  raw = json.dumps(header).encode()
  path.write_bytes(struct.pack('<Q', len(raw)) + raw + data)


@pytest.fixture
def tensors():
  rng = np.random.default_rng(0)
  return {'a': rng.standard_normal((3, 4)).astype(np.float32),
          'b': rng.standard_normal((5,)).astype(np.float32)}


def test_a_valid_file_and_index_read_back(tmp_path, tensors):
  _write(tmp_path / 'w.safetensors', tensors)
  (tmp_path / st.INDEX_FILE).write_text(json.dumps({'weight_map': {'a': 'w.safetensors',
                                                                   'b': 'w.safetensors'}}))
  files = st.open_checkpoint(str(tmp_path))
  for name, arr in tensors.items():
    np.testing.assert_array_equal(files[name].get(name), arr)


@pytest.mark.parametrize('target', ['../outside.safetensors', 'sub/w.safetensors', 'link'])
def test_an_index_naming_a_file_outside_is_refused(tmp_path, tensors, target):
  model = tmp_path / 'model'
  (model / 'sub').mkdir(parents=True)
  _write(tmp_path / 'outside.safetensors', tensors)
  _write(model / 'sub' / 'w.safetensors', tensors)
  os.symlink(tmp_path / 'outside.safetensors', model / 'link')
  (model / st.INDEX_FILE).write_text(json.dumps({'weight_map': {'a': target}}))
  with pytest.raises(HFFormatError, match='not a file in'):
    st.open_checkpoint(str(model))


@pytest.mark.parametrize('entry,match', [
    ({'dtype': 'F32', 'shape': [2], 'data_offsets': [-8, 0]}, 'data_offsets'),
    ({'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 800]}, 'data_offsets'),
    ({'dtype': 'F32', 'shape': [-2], 'data_offsets': [0, 8]}, 'shape'),
    ({'dtype': 'F32', 'shape': '2', 'data_offsets': [0, 8]}, 'shape'),
    (['F32', [2], [0, 8]], 'not an object'),
])
def test_bad_tensor_entries_are_refused(tmp_path, entry, match):
  _raw(tmp_path / 'w.safetensors', {'t': entry}, b'\0' * 16)
  with pytest.raises(HFFormatError, match=match):
    st.SafetensorsFile(str(tmp_path / 'w.safetensors'))


def test_overlapping_tensors_are_refused(tmp_path):
  _raw(tmp_path / 'w.safetensors',
       {'x': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},
        'y': {'dtype': 'F32', 'shape': [2], 'data_offsets': [4, 12]}}, b'\0' * 16)
  with pytest.raises(HFFormatError, match="'x' and 'y' overlap"):
    st.SafetensorsFile(str(tmp_path / 'w.safetensors'))


@pytest.mark.parametrize('header', [[1, 2], 'text', 3])
def test_a_header_that_is_not_an_object_is_refused(tmp_path, header):
  _raw(tmp_path / 'w.safetensors', header)
  with pytest.raises(HFFormatError, match='not an object of tensors'):
    st.SafetensorsFile(str(tmp_path / 'w.safetensors'))


@pytest.mark.parametrize('index,match', [('{not json', 'not valid JSON'),
                                         ('{"weight_map": ["a"]}', 'must be a JSON object'),
                                         ('{"weight_map": {"a": 3}}', 'must be a JSON object')])
def test_a_bad_index_is_refused(tmp_path, tensors, index, match):
  _write(tmp_path / 'w.safetensors', tensors)
  (tmp_path / st.INDEX_FILE).write_text(index)
  with pytest.raises(HFFormatError, match=match):
    st.open_checkpoint(str(tmp_path))
