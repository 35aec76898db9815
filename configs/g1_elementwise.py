"""G1 elementwise: sigmoid(XW) multiplies each SDPA output element (the paper's best)."""

from configs import base


def get_config(scale: str = 'tiny'):
  c = base.get_config(scale)
  c.variant = 'g1_elementwise'
  g = c.model.gate
  g.position = 'g1'
  return c
