"""--mode=import --hf=DIR --workdir=RUN: a Hugging Face model directory -> a run directory.

  python main.py --mode=import --hf=/data/1B_gate_headwise --workdir=runs/hf_headwise
  python main.py --mode=import --hf=out/g1_hf --workdir=runs/g1_back --config.data.tokenizer=byte
  python main.py --mode=import --hf=gs://b/models/1B_gate_headwise --workdir=gs://b/runs/hw
  python main.py --mode=import --hf=/data/Qwen3.5-35B-A3B --workdir=runs/qwen3_5_35b_a3b

Qwen3-Next and Qwen3.5 (text or multimodal releases) import as hybrids (runs/hf/hybrid_config.py);
the tensors an import leaves (a release's vision tower, its multi-token-prediction head) are named
in one line.
"""

import json
import sys

from gated_attention import storage
from gated_attention.runs.hf import interop


def main(args):
  if not args.hf:
    sys.exit('--mode=import needs --hf=DIR, a Hugging Face model directory.')
  if storage.is_remote(args.hf):
    summary = _import_remote(args)
  else:
    summary = interop.import_run(args.hf, args.workdir, overrides=args.overrides)
  print(json.dumps(summary, indent=1))
  if summary.get('skipped'):    # a release's vision tower / multi-token-prediction head
    print(summary['skipped'])
  if summary['tokenizer']:
    print(f'Tokenizer: {summary["tokenizer"]} (data.tokenizer of the run).')
  else:
    print(f'Note: {args.hf} has no tokenizer.json, so the run records no tokenizer: name the one '
          'the model was trained with when you use it (--config.data.tokenizer=byte, or a '
          'tokenizer.json / .model path), or import again with --config.data.tokenizer=...')


def _import_remote(args) -> dict:
  """--hf on object storage: the directory is downloaded into a local temporary folder (the
  safetensors are read by seeking), imported from there, then deleted. The run's tokenizer is
  the one on object storage (the input pipeline reads it there), not the deleted copy."""
  storage.check_reachable(args.hf, write=False)
  overrides = dict(args.overrides)
  tokenizer = storage.join(args.hf, 'tokenizer.json')
  if 'data.tokenizer' not in overrides and storage.isfile(tokenizer):
    overrides['data.tokenizer'] = tokenizer
  local = storage.scratch.make('gated_attention_import_')   # a killed import's are removed here
  try:
    try:
      storage.download_tree(args.hf, local + '/hf')
    except FileNotFoundError:
      sys.exit(f'--hf={args.hf} holds no files: pass a Hugging Face model directory (one with '
               'config.json and *.safetensors).')
    summary = interop.import_run(local + '/hf', args.workdir, overrides=overrides)
  finally:
    storage.scratch.remove(local)
  return summary | {'source': args.hf}
