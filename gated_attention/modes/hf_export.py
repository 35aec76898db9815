"""--mode=export --workdir=RUN --out=DIR: a run's checkpoint -> a Hugging Face model directory."""

import json
import sys

from gated_attention.runs.hf import interop


def main(args):
  if not args.out:
    sys.exit('--mode=export needs --out=DIR, the Hugging Face directory to write.')
  print(json.dumps(interop.export_run(args.workdir, args.out, step=args.step,
                                      dtype=args.export_dtype,
                                      remote_code_dir=args.remote_code_dir), indent=1))
