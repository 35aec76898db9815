"""G1 elementwise head-shared: the elementwise gate averaged over query heads."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_headshared'
  g = c.model.gate
  g.position = 'g1'
  g.head_shared = True
  return c
