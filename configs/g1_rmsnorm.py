"""G1 per-head RMSNorm of the SDPA output (the paper's 'SDPA GroupNorm')."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'g1_rmsnorm'
  g = c.model.gate
  g.position = 'g1'
  g.kind = 'rmsnorm'
  return c
