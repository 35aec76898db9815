"""Baseline with twice the KV heads (the paper's 4 -> 8)."""

from gated_attention.config import scales


def get_config(scale: str = 'tiny'):
  c = scales.get_config(scale)
  c.variant = 'baseline_more_kv_heads'
  c.model.num_kv_heads *= 2
  return c
