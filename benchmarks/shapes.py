"""The model shapes of issue 14's throughput comparison, shared by benchmarks/throughput.py (JAX)
and benchmarks/reference_pytorch.py (stock transformers Qwen3), so both time the same model.

Each: 4 layers, QK-norm, RoPE, tied embeddings, vocabulary 384 (the tiny config's), SwiGLU FFN;
`batch` sequences of `seq_len` tokens per training step.
"""

import argparse

SHAPES = {
    'a': dict(num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
              ffn_size=768, batch=16, seq_len=256),
    'b': dict(num_layers=4, hidden_size=512, num_heads=8, num_kv_heads=4, head_dim=64,
              ffn_size=1536, batch=8, seq_len=512),
}
VOCAB = 384
VARIANTS = ('baseline', 'g1_headwise', 'g1_elementwise')
# The gate of each variant: None (ungated) or its granularity (G1, sigmoid, from X).
GATES = {'baseline': None, 'g1_headwise': 'headwise', 'g1_elementwise': 'elementwise'}


def model_fields(shape: str) -> dict:
  """The `model` config fields of a shape (gated_attention/model/config.py names)."""
  s = dict(SHAPES[shape])
  del s['batch'], s['seq_len']
  return dict(s, vocab_size=VOCAB)


def parser(description: str) -> argparse.ArgumentParser:
  """The arguments both benchmarks take (--shape, --steps, --rounds, --variants)."""
  p = argparse.ArgumentParser(description=description)
  p.add_argument('--shape', default='a', choices=sorted(SHAPES))
  p.add_argument('--steps', type=int, default=10, help='steps per variant per round')
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--variants', default=','.join(VARIANTS))
  return p


def variants(p: argparse.ArgumentParser, args) -> list[str]:
  """The --variants list, after checking it and --steps / --rounds (p.error names the fix)."""
  names = args.variants.split(',')
  unknown = sorted(set(names) - set(VARIANTS))
  if unknown or args.steps < 1 or args.rounds < 1:
    p.error(f'--variants from {VARIANTS} (unknown: {unknown}); --steps and --rounds >= 1.')
  return names
