"""An alias kept for config files written before the schema moved into the library:
`from configs import base; c = base.get_config(scale)` still works inside the repository.

New config files start from the library, as every variant file here does:

    from gated_attention.config import scales
    c = scales.get_config(scale)    # the schema's defaults with the scale's model and recipe

so they load from an installed package too (`gated-attention --config=...`), where there is no
top-level `configs` package (gated_attention/config/scales.py lists the scales).
"""

from gated_attention.config.scales import SCALES, get_config  # pylint: disable=unused-import
