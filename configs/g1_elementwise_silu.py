"""G1 elementwise, multiplicative, SiLU activation."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_elementwise_silu'
  g = c.model.gate
  g.position = 'g1'
  g.activation = 'silu'
  return c
