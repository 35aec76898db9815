"""Baseline with 4 more experts, both total and activated (MoE scales only)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'baseline_more_experts'
  if c.model.moe.num_experts == 0:
    raise ValueError(f'baseline_more_experts needs an MoE scale (moe_15a2b, moe_tiny), not {scale!r}.')
  c.model.moe.num_experts += 4
  c.model.moe.top_k += 4
  return c
