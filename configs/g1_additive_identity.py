"""G1 additive identity: Y + XW (no non-linearity)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_additive_identity'
  g = c.model.gate
  g.position = 'g1'
  g.mode = 'additive'
  g.activation = 'identity'
  return c
