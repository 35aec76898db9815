"""G2 elementwise: sigmoid gate on the value projection (per KV head)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g2_elementwise'
  g = c.model.gate
  g.position = 'g2'
  return c
