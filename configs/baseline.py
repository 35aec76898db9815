"""Baseline: no gate (standard softmax attention)."""

from configs import base


def get_config(scale: str = 'tiny'):
  c = base.get_config(scale)
  c.variant = 'baseline'
  return c
