"""G1 input-independent: sigmoid of a zero-initialised learnable [H, d] parameter (starts at 0.5)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_input_independent'
  g = c.model.gate
  g.position = 'g1'
  g.input_dependent = False
  return c
