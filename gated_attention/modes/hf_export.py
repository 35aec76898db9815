"""--mode=export --workdir=RUN --out=DIR: a run's checkpoint -> a Hugging Face model directory.

  python main.py --mode=export --workdir=runs/g1 --out=out/g1_hf --max_shard_size=2GB
"""

import json
import re
import sys

from gated_attention import storage
from gated_attention.errors import ConfigError
from gated_attention.runs.hf import interop

_UNITS = {'': 1, 'B': 1, 'KB': 10**3, 'MB': 10**6, 'GB': 10**9, 'TB': 10**12,
          'KIB': 2**10, 'MIB': 2**20, 'GIB': 2**30, 'TIB': 2**40}


def shard_bytes(size: str) -> int:
  """'5GB' / '500MB' / '2GiB' / '123' -> bytes (transformers' units: GB = 10^9, GiB = 2^30)."""
  m = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*', str(size).upper())
  if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
    raise ConfigError(f'--max_shard_size={size!r} is not a size: give bytes or a number with '
                      'KB, MB, GB (powers of 10) or KiB, MiB, GiB, e.g. --max_shard_size=2GB.')
  return int(float(m.group(1)) * _UNITS[m.group(2)])


def main(args):
  if not args.out:
    sys.exit('--mode=export needs --out=DIR, the Hugging Face directory to write.')
  if not storage.is_remote(args.out):
    print(json.dumps(_export(args, args.out), indent=1))
    return
  # Object storage: written into a local folder first (safetensors are written by seeking), then
  # uploaded file by file; nothing is left under --out if the export fails.
  storage.check_reachable(args.out, write=True)
  local = storage.scratch.make('gated_attention_export_')   # a killed export's are removed here
  try:
    summary = _export(args, local + '/hf')
    storage.upload_tree(local + '/hf', args.out)
  finally:
    storage.scratch.remove(local)
  print(json.dumps(summary | {"out_dir": args.out}, indent=1))


def _export(args, out: str) -> dict:
  return interop.export_run(args.workdir, out, step=args.step, dtype=args.export_dtype,
                            max_shard_bytes=shard_bytes(args.max_shard_size),
                            remote_code_dir=args.remote_code_dir)
