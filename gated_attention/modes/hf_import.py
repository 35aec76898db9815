"""--mode=import --hf=DIR --workdir=RUN: a Hugging Face model directory -> a run directory.

  python main.py --mode=import --hf=/data/1B_gate_headwise --workdir=runs/hf_headwise
  python main.py --mode=import --hf=out/g1_hf --workdir=runs/g1_back --config.data.tokenizer=byte
"""

import json
import sys

from gated_attention.runs.hf import interop


def main(args):
  if not args.hf:
    sys.exit('--mode=import needs --hf=DIR, a local Hugging Face model directory.')
  summary = interop.import_run(args.hf, args.workdir, overrides=args.overrides)
  print(json.dumps(summary, indent=1))
  if summary['tokenizer']:
    print(f'Tokenizer: {summary["tokenizer"]} (data.tokenizer of the run).')
  else:
    print(f'Note: {args.hf} has no tokenizer.json, so the run records no tokenizer: name the one '
          'the model was trained with when you use it (--config.data.tokenizer=byte, or a '
          'tokenizer.json / .model path), or import again with --config.data.tokenizer=...')
