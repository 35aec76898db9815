"""What every variant file starts from: `base.get_config(scale)`.

The run config's fields, defaults and comments are declared once, in the library
(gated_attention/config/schema.py; the `model` section by gated_attention/model/config.py), and
the scales' models and recipes in gated_attention/config/scales.py:

  tiny            a dense model that trains on a 2-core CPU in minutes (the default)
  dense_1p7b_28l  the paper's 1.7B dense model, 28 layers
  dense_1p7b_48l  the paper's 1.7B dense model, 48 layers
  moe_15a2b       the paper's 15B-total / 2B-active MoE (128 experts, top-8)
  moe_tiny        a CPU-sized MoE (8 experts, top-2)
  dense_90m       a 90M-parameter dense model at context 2048 for one accelerator

A variant file (configs/g1_elementwise.py) sets a few fields of `get_config(scale)`'s config.
"""

from gated_attention.config.scales import SCALES, get_config  # pylint: disable=unused-import
