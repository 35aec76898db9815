"""G1 NS-sigmoid: 0.5 + 0.5 * sigmoid(XW), a non-sparse gate in [0.5, 1]."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_ns_sigmoid'
  g = c.model.gate
  g.position = 'g1'
  g.activation = 'ns_sigmoid'
  return c
