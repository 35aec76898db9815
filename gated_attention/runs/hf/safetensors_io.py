"""The safetensors format, read and written with numpy alone (no torch, no `safetensors`).

A file is: 8 bytes (little-endian u64) header length N, N bytes of JSON
`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`, then the tensors'
bytes, contiguous, offsets relative to the end of the header. bfloat16 is `ml_dtypes.bfloat16`.
A sharded checkpoint adds `model.safetensors.index.json` (`weight_map`: tensor -> file).

Why not the `safetensors` library (the format's reference implementation, 0.8.0 here, whose
numpy API reads and writes bfloat16 as ml_dtypes.bfloat16 too): measured at the 1.7B shapes
(`python -m benchmarks.safetensors_io`, a 3.4 GB bf16 fake release; 2-core shared CPU machine,
warm page cache; benchmarks/safetensors_io.json) it is no better and its writer is worse:
  export (save_hf)      ours 19.1 s, peak 7.23 GiB (bf16) / 27.0 s, 6.75 GiB (fp32, 2 shards);
                        save_file 26.5 s, 9.83 GiB / 34.2 s, 10.1 GiB: it takes a dict of every
                        tensor of a file, so a whole shard (up to 5 GB) is made before writing,
                        where write_file makes one tensor at a time.
  import (load_hf)      ours 19.5-29.4 s, peak 6.64 GiB; safe_open(framework='numpy') 18.5-19.4 s,
                        9.84 GiB (its default mmap backend keeps the read file pages resident),
                        or with backend='pread' 20.1-34.2 s, 6.64 GiB (run-to-run noise of the
                        shared machine exceeds the differences).
Both writers' 310 tensors, read back by the other implementation, are equal bit for bit (fp32
and bf16), and tests/test_hf.py cross-checks files of either against the other. So this module
keeps its own code: no new runtime dependency, one tensor in memory when writing, and its
errors (HFFormatError naming the file and tensor) unchanged.
"""

import glob
import json
import os
import struct

import ml_dtypes
import numpy as np

from gated_attention.runs.hf.errors import HFFormatError

DTYPES = {'F64': np.dtype('<f8'), 'F32': np.dtype('<f4'), 'F16': np.dtype('<f2'),
          'BF16': np.dtype(ml_dtypes.bfloat16)}
NAMES = {v: k for k, v in DTYPES.items()}
INDEX_FILE = 'model.safetensors.index.json'
SINGLE_FILE = 'model.safetensors'
_MAX_HEADER = 100 * 2**20


class SafetensorsFile:
  """One .safetensors file: its header, and tensors read one at a time (`get`)."""

  def __init__(self, path: str):
    self.path = path
    with open(path, 'rb') as f:
      raw = f.read(8)
      n = struct.unpack('<Q', raw)[0] if len(raw) == 8 else -1
      if not 0 < n <= _MAX_HEADER:
        raise HFFormatError(f'{path} is not a safetensors file (header length {n}).')
      try:
        header = json.loads(f.read(n))
      except ValueError as e:
        raise HFFormatError(f'{path}: unreadable safetensors header ({e}).') from e
      size = os.fstat(f.fileno()).st_size
    if not isinstance(header, dict):
      raise HFFormatError(f'{path}: the safetensors header is a JSON {type(header).__name__}, '
                          'not an object of tensors.')
    self.data_start = 8 + n
    metadata = header.pop('__metadata__', None) or {}
    self.metadata = metadata if isinstance(metadata, dict) else {}
    self.entries = header
    spans = []
    for name, e in header.items():
      if not isinstance(e, dict):
        raise HFFormatError(f'{path}: tensor {name!r} is described by a JSON '
                            f'{type(e).__name__}, not an object with dtype, shape, data_offsets.')
      if e.get('dtype') not in DTYPES:
        raise HFFormatError(f'{path}: tensor {name!r} has dtype {e.get("dtype")!r}; only '
                            f'{", ".join(DTYPES)} weights can be read.')
      shape, offsets = e.get('shape'), e.get('data_offsets')
      if not (isinstance(shape, list) and all(_count(d) for d in shape)):
        raise HFFormatError(f'{path}: tensor {name!r} has shape {shape!r}; a shape is a list of '
                            'non-negative integers.')
      if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_count, offsets))
              and offsets[0] <= offsets[1] <= size - self.data_start):
        raise HFFormatError(
            f'{path}: tensor {name!r} has data_offsets {offsets!r}; they must be two integers '
            f'0 <= begin <= end <= {size - self.data_start} (the bytes after the header).')
      spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
      if begin < end:
        raise HFFormatError(f'{path}: tensors {first!r} and {second!r} overlap (their '
                            'data_offsets share bytes); the file is damaged or hand-made.')

  def shape(self, name: str) -> tuple:
    return tuple(self.entries[name]['shape'])

  def get(self, name: str) -> np.ndarray:
    """The tensor in its stored dtype (float16/bfloat16/float32/float64)."""
    e = self.entries[name]
    dtype = DTYPES[e['dtype']]
    begin, end = e['data_offsets']
    count = int(np.prod(e['shape'], dtype=np.int64))
    if end - begin != count * dtype.itemsize:
      raise HFFormatError(f'{self.path}: tensor {name!r} spans {end - begin} bytes, not '
                          f'{count * dtype.itemsize} for shape {e["shape"]} {e["dtype"]}.')
    with open(self.path, 'rb') as f:
      f.seek(self.data_start + begin)
      buf = f.read(end - begin)
    if len(buf) != end - begin:
      raise HFFormatError(f'{self.path} is truncated (tensor {name!r}).')
    return np.frombuffer(buf, dtype).reshape(e['shape'])


def open_checkpoint(model_dir: str) -> dict:
  """{tensor name: SafetensorsFile holding it} for a single or sharded checkpoint."""
  index = os.path.join(model_dir, INDEX_FILE)
  if os.path.isfile(index):
    try:
      with open(index, 'rb') as f:
        parsed = json.load(f)
    except ValueError as e:
      raise HFFormatError(f'{index} is not valid JSON ({e}).') from e
    weight_map = (parsed.get('weight_map') if isinstance(parsed, dict) else None) or {}
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
      raise HFFormatError(f'{index}: "weight_map" must be a JSON object of tensor name -> file '
                          'name.')
    files = {fn: SafetensorsFile(_inside(model_dir, fn, index))
             for fn in sorted(set(weight_map.values()))}
    out = {}
    for name, fn in weight_map.items():
      if name not in files[fn].entries:
        raise HFFormatError(f'{index} maps {name!r} to {fn}, which does not hold it.')
      out[name] = files[fn]
    return out
  paths = sorted(glob.glob(os.path.join(model_dir, '*.safetensors')))
  if not paths:
    raise HFFormatError(f'{model_dir} has no *.safetensors weights (PyTorch .bin checkpoints are '
                        'not read: convert them with transformers\' save_pretrained first).')
  out = {}
  for path in paths:
    st = SafetensorsFile(path)
    for name in st.entries:
      if name in out:
        raise HFFormatError(f'tensor {name!r} is in both {out[name].path} and {path}.')
      out[name] = st
  return out


def _count(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _inside(model_dir: str, name: str, index: str) -> str:
  """The weights file `name` of the index, refused unless it is a file directly in model_dir
  (no '..', no other folder, no link leading out): an import reads nothing else."""
  path = os.path.join(model_dir, name)
  root = os.path.realpath(model_dir)
  if (os.path.basename(name) != name or name in ('', '.', '..')
      or os.path.dirname(os.path.realpath(path)) != root):
    raise HFFormatError(f'{index} maps tensors to {name!r}, which is not a file in {model_dir}; '
                        'an import reads only the weights files inside --hf. Fix the index.')
  return path


def plan_shards(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
  """Tensors (in order) split greedily into files of at most `max_shard_bytes` (a larger
  tensor gets a file of its own)."""
  shards, current, used = [], [], 0
  for name, nbytes in sizes:
    if current and used + nbytes > max_shard_bytes:
      shards.append(current)
      current, used = [], 0
    current.append(name)
    used += nbytes
  if current:
    shards.append(current)
  return shards


def write_file(path: str, tensors: list, metadata: dict | None = None) -> int:
  """Writes `tensors` [(name, shape, dtype, make)] to `path`, calling `make()` for each array
  only when its bytes are written (so one tensor at a time is in memory). Returns data bytes."""
  header, offset = {}, 0
  for name, shape, dtype, _ in tensors:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header[name] = {'dtype': NAMES[dtype], 'shape': list(shape),
                    'data_offsets': [offset, offset + nbytes]}
    offset += nbytes
  if metadata:
    header = {'__metadata__': metadata, **header}
  raw = json.dumps(header, separators=(',', ':')).encode()
  raw += b' ' * (-len(raw) % 8)                 # the data starts 8-byte aligned
  with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(raw)))
    f.write(raw)
    for name, shape, dtype, make in tensors:
      arr = np.ascontiguousarray(make(), dtype=dtype)
      if arr.shape != tuple(shape):
        raise AssertionError(f'{name}: made {arr.shape}, planned {tuple(shape)}')
      arr.tofile(f)
  return offset
