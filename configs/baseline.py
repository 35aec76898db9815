"""Baseline: no gate (standard softmax attention)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'baseline'
  return c
