"""G4 elementwise: sigmoid gate on the query projection (per query head)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g4_elementwise'
  g = c.model.gate
  g.position = 'g4'
  return c
