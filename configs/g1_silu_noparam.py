"""G1 parameter-free SiLU of the SDPA output: Y' = SiLU(Y)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_silu_noparam'
  g = c.model.gate
  g.position = 'g1'
  g.kind = 'silu_noparam'
  return c
