"""G2 elementwise head-shared: the value gate averaged over KV heads."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g2_headshared'
  g = c.model.gate
  g.position = 'g2'
  g.head_shared = True
  return c
