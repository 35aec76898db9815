"""G1 headwise: one sigmoid scalar per head multiplies the SDPA output."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_headwise'
  g = c.model.gate
  g.position = 'g1'
  g.granularity = 'headwise'
  return c
