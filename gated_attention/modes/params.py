"""--mode=params: the parameter counts of a config, as one JSON object."""

import json

from gated_attention.model import transformer
from gated_attention.model.config import ModelConfig


def main(args):
  print(json.dumps(transformer.param_report(ModelConfig.from_config(args.config.model))))
