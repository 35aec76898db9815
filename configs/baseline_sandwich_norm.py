"""Baseline with sandwich norm: h = h + Norm(Sublayer(Norm(h)))."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'baseline_sandwich_norm'
  c.model.sandwich_norm = True
  return c
