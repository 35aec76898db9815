"""--mode=memory: per-device bytes of parameters, optimizer state and activations."""

import json

from gated_attention.compile import memory


def main(args):
  print(json.dumps(memory.report(args.config), indent=2))
