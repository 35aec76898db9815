"""G3 elementwise: sigmoid gate on the key projection (per KV head)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g3_elementwise'
  g = c.model.gate
  g.position = 'g3'
  return c
