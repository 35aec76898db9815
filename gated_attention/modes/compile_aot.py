"""--mode=compile --topology=v5p:4x4x4: the train step compiled ahead of time for a TPU slice;
with --fit_grad_accum, the smallest grad_accum (config's x 1, 2, 4, ...) whose step fits; with
--plan=long_context, --mode=long_context's scoring step (config.long_context: the largest of
lengths, batch_size, chunk) instead of the train step."""

import json

from gated_attention.compile import aot
from gated_attention.compile import aot_long_context
from gated_attention.config import schema
from gated_attention.errors import ConfigError


def check(args):
  if args.fit_grad_accum and args.plan == 'long_context':
    raise ConfigError('--fit_grad_accum walks the train step\'s grad_accum; --plan=long_context '
                      'plans the evaluation, which has none: lower '
                      '--config.long_context.batch_size instead.')


def main(args):
  if args.plan == 'long_context':
    r = aot_long_context.long_context_report(args.config, args.topology)
  elif args.fit_grad_accum or schema.is_auto(args.config.train.grad_accum):
    r = aot.fit_grad_accum(args.config, args.topology)
  else:
    r = aot.report(args.config, args.topology)
  print(json.dumps(r, indent=2))
