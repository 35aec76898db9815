"""G1 NS-sigmoid: 0.5 + 0.5 * sigmoid(XW), a non-sparse gate in [0.5, 1]."""

from configs import base


def get_config(scale: str = 'tiny'):
  c = base.get_config(scale)
  c.variant = 'g1_ns_sigmoid'
  g = c.model.gate
  g.position = 'g1'
  g.activation = 'ns_sigmoid'
  return c
