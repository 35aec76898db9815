"""G4 elementwise: sigmoid gate on the query projection (per query head)."""

from configs import base


def get_config(scale: str = 'tiny'):
  c = base.get_config(scale)
  c.variant = 'g4_elementwise'
  g = c.model.gate
  g.position = 'g4'
  return c
