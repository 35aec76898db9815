"""Baseline with sandwich norm: h = h + Norm(Sublayer(Norm(h)))."""

from configs import base


def get_config(scale: str = 'tiny'):
  c = base.get_config(scale)
  c.variant = 'baseline_sandwich_norm'
  c.model.sandwich_norm = True
  return c
