"""Baseline with 1.5x the query heads (the paper's 32 -> 48)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'baseline_more_q_heads'
  c.model.num_heads = c.model.num_heads * 3 // 2
  return c
