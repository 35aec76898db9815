"""G5 elementwise: sigmoid gate on the output of W_O (per model dimension)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g5_elementwise'
  g = c.model.gate
  g.position = 'g5'
  return c
