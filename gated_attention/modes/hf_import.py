"""--mode=import --hf=DIR --workdir=RUN: a Hugging Face model directory -> a run directory."""

import json
import sys

from gated_attention.runs.hf import interop


def main(args):
  if not args.hf:
    sys.exit('--mode=import needs --hf=DIR, a local Hugging Face model directory.')
  print(json.dumps(interop.import_run(args.hf, args.workdir, overrides=args.overrides), indent=1))
