"""G1 elementwise: sigmoid(XW) multiplies each SDPA output element (the paper's best)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_elementwise'
  g = c.model.gate
  g.position = 'g1'
  return c
