"""Time and peak memory of reading and writing safetensors at the 1.7B shapes: the project's
hand-written reader/writer (gated_attention/runs/hf/safetensors_io.py) against the format's
reference implementation, the `safetensors` library (numpy API: `safe_open(framework='numpy')`,
`safetensors.numpy.save_file`; bfloat16 is `ml_dtypes.bfloat16` there too).

  python -m benchmarks.fake_release make --out=/tmp/fake_1b_gate_headwise   # 3.4 GB, bf16
  python -m benchmarks.safetensors_io --src=/tmp/fake_1b_gate_headwise --tmp=/tmp/st_bench \
      --json=/tmp/st_bench.json

Steps, each in a fresh process (its own peak resident memory, ru_maxrss = VmHWM, which counts
the file pages a memory map has touched as well as the process's own memory):
  read  READER           every tensor of the release read once and dropped (the reader alone)
  load  READER           load_hf(src): the bf16 release into float32 parameters (--mode=import's)
  save  BACKEND DTYPE    load_hf (ours, not timed) then save_hf(dtype) (--mode=export's); the
                         written tensors are read back by the *other* implementation, and the
                         two writers' tensors compared bit for bit (the cross_check rows).
READER: ours, library (safe_open's default mmap backend) or library-pread (its pread(2)
backend); BACKEND: ours or library (save_file). The library is swapped in for the module's
SafetensorsFile / write_file, so everything else (validation, layout, sharding at 5 GB) is the
same code. Measured here: benchmarks/safetensors_io.json, and the decision it led to in
gated_attention/runs/hf/safetensors_io.py's docstring. Write under /tmp: a float32 export
of the 1.7B model is 6.9 GB, removed after its step.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

from gated_attention.runs.hf import safetensors_io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ('ours', 'library')          # library: safe_open's default backend, mmap
READERS = BACKENDS + ('library-pread',)  # safe_open(backend='pread'): pread(2), no mapping


class LibraryFile:
  """safetensors_io.SafetensorsFile's interface (path, entries, shape, get) over safe_open."""

  backend = 'mmap'

  def __init__(self, path: str):
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    self.path = path
    self._f = safe_open(path, framework='numpy', backend=self.backend)
    self.entries = {n: {'shape': list(self._f.get_slice(n).get_shape()),
                        'dtype': self._f.get_slice(n).get_dtype()} for n in self._f.keys()}

  def shape(self, name: str) -> tuple:
    return tuple(self.entries[name]['shape'])

  def get(self, name: str) -> np.ndarray:
    return self._f.get_tensor(name)


def library_write_file(path: str, tensors: list, metadata: dict | None = None) -> int:
  """safetensors_io.write_file's interface over safetensors.numpy.save_file: the library takes
  a dict of arrays, so every tensor of the file is made before the first byte is written."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  arrays = {name: np.ascontiguousarray(make(), dtype=dtype) for name, _, dtype, make in tensors}
  save_file(arrays, path, metadata=metadata)
  return sum(a.nbytes for a in arrays.values())


class LibraryPreadFile(LibraryFile):
  backend = 'pread'


def use(backend: str):
  if backend.startswith('library'):
    safetensors_io.SafetensorsFile = LibraryPreadFile if backend.endswith('pread') else LibraryFile
    safetensors_io.write_file = library_write_file


def _peak_rss_gib() -> float:
  return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def _digest(files: dict) -> dict:
  """{name: (dtype, shape, crc of the bytes)}: what "bit for bit" compares."""
  import zlib  # pylint: disable=g-import-not-at-top
  out = {}
  for name, f in files.items():
    x = np.ascontiguousarray(f.get(name))
    out[name] = (str(x.dtype), list(x.shape), zlib.crc32(x.view(np.uint8)))
  return out


def step(kind: str, backend: str, src: str, tmp: str, dtype: str) -> dict:
  from gated_attention.runs.hf import load_hf, save_hf  # pylint: disable=g-import-not-at-top
  result = {'step': kind, 'backend': backend}
  if kind == 'save':               # the parameters, read by our code before the swap
    config, params = load_hf(src)
    result['dtype'] = dtype
  use(backend)
  t0 = time.perf_counter()
  if kind == 'read':
    files = safetensors_io.open_checkpoint(src)
    total = 0
    for name, f in files.items():
      total += f.get(name).nbytes
    result['bytes'] = total
  elif kind == 'load':
    _, params = load_hf(src)
  else:
    out = os.path.join(tmp, f'save_{backend}_{dtype}')
    info = save_hf(config, params, out, dtype=dtype)
    result['files'] = [f for f in info['files'] if f.endswith('.safetensors')]
    result['bytes'] = sum(os.path.getsize(os.path.join(out, f)) for f in result['files'])
  result['seconds'] = round(time.perf_counter() - t0, 1)
  result['peak_rss_gib'] = _peak_rss_gib()
  if kind == 'save':               # the other implementation reads what this one wrote
    del params
    import importlib  # pylint: disable=g-import-not-at-top
    importlib.reload(safetensors_io)
    use('ours' if backend == 'library' else 'library')
    written = _digest(safetensors_io.open_checkpoint(out))
    with open(os.path.join(tmp, f'digest_{dtype}_{backend}.json'), 'w') as f:
      json.dump(written, f)
    shutil.rmtree(out)
  return result


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--src', default='/tmp/fake_1b_gate_headwise')
  ap.add_argument('--tmp', default='/tmp/st_bench')
  ap.add_argument('--json', default=None, help='also write the results here')
  ap.add_argument('--step', default=None, help='internal: one step, "kind,backend,dtype"')
  ap.add_argument('--dtypes', default='bfloat16,float32')
  args = ap.parse_args()
  for path in (args.tmp, args.json or '/tmp'):
    if os.path.abspath(path).startswith(ROOT):
      sys.exit(f'{path} is inside the repository: write under /tmp.')
  if args.step:
    kind, backend, dtype = args.step.split(',')
    print(json.dumps(step(kind, backend, args.src, args.tmp, dtype)), flush=True)
    return
  os.makedirs(args.tmp, exist_ok=True)
  plan = [(k, b, 'bfloat16') for k in ('read', 'load') for b in READERS]
  plan += [('save', b, d) for d in args.dtypes.split(',') for b in BACKENDS]
  results = []
  for kind, backend, dtype in plan:
    done = subprocess.run([sys.executable, '-m', 'benchmarks.safetensors_io', f'--src={args.src}',
                           f'--tmp={args.tmp}', f'--step={kind},{backend},{dtype}'],
                          cwd=ROOT, check=True, capture_output=True, text=True)
    results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps(results[-1]), flush=True)
  for dtype in args.dtypes.split(','):       # both writers' tensors, read by the other reader
    digests = []
    for backend in BACKENDS:
      with open(os.path.join(args.tmp, f'digest_{dtype}_{backend}.json')) as f:
        digests.append(json.load(f))
    same = digests[0] == digests[1]
    results.append({'step': 'cross_check', 'dtype': dtype, 'tensors': len(digests[0]),
                    'bit_identical': same})
    print(json.dumps(results[-1]), flush=True)
  shutil.rmtree(args.tmp)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=2)


if __name__ == '__main__':
  main()
