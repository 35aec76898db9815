"""--mode=compile --topology=v5p:4x4x4: the train step compiled ahead of time for a TPU slice."""

import json

from gated_attention.compile import aot


def main(args):
  print(json.dumps(aot.report(args.config, args.topology), indent=2))
