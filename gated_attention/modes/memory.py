"""--mode=memory: per-device bytes of parameters, optimizer state and activations; with
--fit_grad_accum, the smallest grad_accum (config's x 1, 2, 4, ...) whose estimate fits; with
--plan=long_context, the estimate of --mode=long_context's evaluation instead."""

import json

from gated_attention.compile import memory
from gated_attention.config import schema
from gated_attention.modes.compile_aot import check  # the same flags, refused the same way


def main(args):
  if args.plan == 'long_context':
    r = memory.long_context_report(args.config)
  elif args.fit_grad_accum or schema.is_auto(args.config.train.grad_accum):
    r = memory.fit_grad_accum(args.config)
  else:
    r = memory.report(args.config)
  print(json.dumps(r, indent=2))
