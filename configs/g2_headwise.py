"""G2 headwise: one sigmoid scalar per KV head gates the values."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g2_headwise'
  g = c.model.gate
  g.position = 'g2'
  g.granularity = 'headwise'
  return c
