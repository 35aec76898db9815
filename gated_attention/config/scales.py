"""The scales: each one's model and recipe over the schema's defaults (schema.py).

    config = scales.get_config('moe_15a2b')   # what configs/<variant>.py:<scale> starts from

  tiny            a dense model that trains on a 2-core CPU in minutes (the default)
  dense_1p7b_28l  the paper's 1.7B dense model, 28 layers
  dense_1p7b_48l  the paper's 1.7B dense model, 48 layers
  moe_15a2b       the paper's 15B-total / 2B-active MoE (128 experts, top-8)
  moe_tiny        a CPU-sized MoE (8 experts, top-2)
  dense_90m       a 90M-parameter dense model at context 2048 for one accelerator (the sink at
                  accelerator scale: experiments/sink_accelerator.py); needs a BPE tokenizer
"""

import ml_collections

from gated_attention.config import schema

SCALES = ('tiny', 'dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b', 'moe_tiny', 'dense_90m')
PAPER_SCALES = ('dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b')
QWEN_VOCAB = 151_936


def gate_config() -> ml_collections.ConfigDict:
  """The gate spec: GateSpec's fields and defaults (gating.py documents each);
  `position='none'` is the ungated baseline."""
  return ml_collections.ConfigDict(schema.defaults()['model']['gate'])


def moe_config() -> ml_collections.ConfigDict:
  """Mixture-of-Experts settings: MoESpec's fields and defaults (moe.py documents each).
  `num_experts=0` is a dense FFN."""
  return ml_collections.ConfigDict(schema.defaults()['model']['moe'])


def data_config() -> ml_collections.ConfigDict:
  """The `data` section's defaults (schema.Data)."""
  return ml_collections.ConfigDict(schema.defaults(schema.Data))


def model_config(scale: str) -> ml_collections.ConfigDict:
  """The `model` section: ModelConfig's fields and defaults (gated_attention/model/config.py
  declares and documents each), then the scale's values."""
  m = ml_collections.ConfigDict(schema.defaults()['model'])
  if scale == 'tiny':
    m.update(scan_layers=False)
  elif scale == 'dense_1p7b_28l':
    m.update(vocab_size=QWEN_VOCAB, num_layers=28, hidden_size=2048, num_heads=16,
             num_kv_heads=8, head_dim=128, ffn_size=6144, tie_embeddings=True,
             dtype='bfloat16', remat='save_attention')
  elif scale == 'dense_1p7b_48l':
    m.update(vocab_size=QWEN_VOCAB, num_layers=48, hidden_size=1536, num_heads=16,
             num_kv_heads=8, head_dim=128, ffn_size=4608, tie_embeddings=True,
             dtype='bfloat16', remat='save_attention')
  elif scale == 'moe_15a2b':
    m.update(vocab_size=QWEN_VOCAB, num_layers=24, hidden_size=2048, num_heads=32,
             num_kv_heads=4, head_dim=128, ffn_size=0, tie_embeddings=False,
             dtype='bfloat16', remat='save_attention')
    m.moe.update(num_experts=128, top_k=8, expert_ffn_size=768)
  elif scale == 'moe_tiny':
    m.update(ffn_size=0, tie_embeddings=False)
    m.moe.update(num_experts=8, top_k=2, expert_ffn_size=96)
  elif scale == 'dense_90m':  # GPT-2-small-like, Qwen-style (GQA 12/4, QK-norm, SwiGLU)
    m.update(vocab_size=16_384, num_layers=12, hidden_size=768, num_heads=12, num_kv_heads=4,
             head_dim=64, ffn_size=2048, tie_embeddings=True, dtype='bfloat16')
  else:
    raise ValueError(f'Unknown scale {scale!r}; choose one of {", ".join(SCALES)} '
                     '(for example configs/g1_elementwise.py:tiny).')
  return m


def _paper_recipe(c: ml_collections.ConfigDict):
  """The paper's training recipe (Qiu et al. 2025, Sec. 3 / Appendix): 4096-token sequences,
  batch 1024, 1k warm-up steps, cosine to 3e-5; FSDP over all devices."""
  c.data.seq_len = 4096
  c.data.tokenizer = ''         # must be set to Qwen's tokenizer.json for these scales
  c.train.update(batch_size=1024, steps=100_000, warmup_steps=1000, loss_chunk_size=512,
                 learning_rate=4e-3 if c.scale.startswith('dense') else 2e-3,
                 min_learning_rate=3e-5, eval_every=1000, checkpoint_every=1000, log_every=10)
  c.mesh.update(data=1, fsdp=-1, rules='fsdp')


def _accelerator_recipe(c: ml_collections.ConfigDict):
  """dense_90m: 32 x 2048 tokens per step, 4,000 steps (262M tokens), AdamW 1e-3 (500 warm-up
  steps, cosine to 1e-4); a BPE tokenizer trained on the corpus (input_pipeline/bpe.py)."""
  c.data.update(seq_len=2048, tokenizer='', source='builtin_large')
  c.train.update(batch_size=32, steps=4000, warmup_steps=500, learning_rate=1e-3,
                 min_learning_rate=1e-4, eval_every=500, checkpoint_every=1000, log_every=50)


def get_config(scale: str = 'tiny') -> ml_collections.ConfigDict:
  """The schema's defaults with the scale's model and recipe: what every variant file starts
  from (configs/base.py)."""
  scale = scale or 'tiny'
  c = ml_collections.ConfigDict(schema.defaults())
  c.scale = scale
  c.model = model_config(scale)
  if scale in PAPER_SCALES:
    _paper_recipe(c)
  if scale == 'dense_90m':
    _accelerator_recipe(c)
  return schema.allow_auto(c)
