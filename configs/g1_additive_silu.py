"""G1 additive: Y + SiLU(XW)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_additive_silu'
  g = c.model.gate
  g.position = 'g1'
  g.mode = 'additive'
  g.activation = 'silu'
  return c
