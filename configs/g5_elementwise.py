"""G5 elementwise: sigmoid gate on the output of W_O (per model dimension)."""

from configs import base


def get_config(scale: str = 'tiny'):
  c = base.get_config(scale)
  c.variant = 'g5_elementwise'
  g = c.model.gate
  g.position = 'g5'
  return c
