"""The scales: each one's model and recipe over the schema's defaults (schema.py).

    config = scales.get_config('moe_15a2b')   # what configs/<variant>.py:<scale> starts from

  tiny            a dense model that trains on a 2-core CPU in minutes (the default)
  dense_1p7b_28l  the paper's 1.7B dense model, 28 layers
  dense_1p7b_48l  the paper's 1.7B dense model, 48 layers
  moe_15a2b       the paper's 15B-total / 2B-active MoE (128 experts, top-8)
  moe_tiny        a CPU-sized MoE (8 experts, top-2)
  dense_90m       a 90M-parameter dense model at context 2048 for one accelerator (the sink at
                  accelerator scale: experiments/sink_accelerator.py); needs a BPE tokenizer
Beyond the paper, the hybrids that ship its gate (three Gated DeltaNet layers, then one
attention layer; partial RoPE, zero-centred RMSNorm; model/deltanet.py). The variant file
decides the attention layers' gate: configs/g1_elementwise.py:<scale> is the published model
(its G1 elementwise gate, [q_h | g_h] per head), configs/baseline.py:<scale> the same ungated.
  hybrid_tiny         tiny's width and depth (4 layers: 3 DeltaNet + 1 attention), trains on a
                      CPU in minutes
  qwen3_next_80b_a3b  Qwen3-Next-80B-A3B: 48 layers, 512 experts top-10 + a gated shared expert
  qwen3_5_27b         Qwen3.5-27B: 64 layers, dense
  qwen3_5_35b_a3b     Qwen3.5-35B-A3B: 40 layers, 256 experts top-8 + a gated shared expert
The published shapes are the config.json values of the released models' text decoders (the
defaults of transformers 5.24's Qwen3NextConfig and Qwen3_5MoeTextConfig; Qwen3.5-27B's
text_config); tests/test_configs.py counts their parameters against transformers'.
"""

import ml_collections

from gated_attention.config import schema

HYBRID_SCALES = ('hybrid_tiny', 'qwen3_next_80b_a3b', 'qwen3_5_27b', 'qwen3_5_35b_a3b')
SCALES = ('tiny', 'dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b', 'moe_tiny',
          'dense_90m') + HYBRID_SCALES
PAPER_SCALES = ('dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b')
PUBLISHED_HYBRIDS = HYBRID_SCALES[1:]
QWEN_VOCAB = 151_936
QWEN3_5_VOCAB = 248_320
# Three Gated DeltaNet layers, then one attention layer (transformers' full_attention_interval 4)
HYBRID_PERIOD = ['linear_attention'] * 3 + ['full_attention']


def _hybrid(m: ml_collections.ConfigDict, **deltanet):
  """The hybrid switches of Qwen3-Next / Qwen3.5 on a `model` section: the layer pattern,
  RoPE on a quarter of head_dim (base 10M), zero-centred RMSNorm, the G1 gate packed
  [q_h | g_h] per head (for export), the Gated DeltaNet's shapes."""
  m.layer_types = HYBRID_PERIOD * (m.num_layers // len(HYBRID_PERIOD))
  m.update(rope_fraction=0.25, norm_zero_centered=True)
  m.gate.packing = 'head'
  m.deltanet.update(deltanet)


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
  elif scale == 'hybrid_tiny':  # tiny's shapes; DeltaNet 2 key / 4 value heads of 32
    m.update(scan_layers=False)
    _hybrid(m, num_key_heads=2, num_value_heads=4, key_head_dim=32, value_head_dim=32)
  elif scale in PUBLISHED_HYBRIDS:
    published = {
        'qwen3_next_80b_a3b': dict(vocab_size=QWEN_VOCAB, num_layers=48, hidden_size=2048,
                                   num_heads=16, num_kv_heads=2),
        'qwen3_5_27b': dict(vocab_size=QWEN3_5_VOCAB, num_layers=64, hidden_size=5120,
                            num_heads=24, num_kv_heads=4, ffn_size=17_408),
        'qwen3_5_35b_a3b': dict(vocab_size=QWEN3_5_VOCAB, num_layers=40, hidden_size=2048,
                                num_heads=16, num_kv_heads=2),
    }[scale]
    m.update(head_dim=256, ffn_size=0, tie_embeddings=False, rope_base=10_000_000.0,
             dtype='bfloat16', remat='save_attention')
    m.update(published)
    _hybrid(m, num_key_heads=16, num_value_heads=48 if scale == 'qwen3_5_27b' else 32,
            key_head_dim=128, value_head_dim=128)
    if scale != 'qwen3_5_27b':   # every layer's FFN: routed experts + one gated shared expert
      m.moe.update(num_experts=512 if scale == 'qwen3_next_80b_a3b' else 256,
                   top_k=10 if scale == 'qwen3_next_80b_a3b' else 8, expert_ffn_size=512,
                   num_shared_experts=1, shared_expert_gate=True, renormalize=True)
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
                 learning_rate=2e-3 if c.model.moe.num_experts else 4e-3,
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
  if scale in PAPER_SCALES or scale in PUBLISHED_HYBRIDS:
    _paper_recipe(c)
  if scale == 'dense_90m':
    _accelerator_recipe(c)
  return schema.allow_auto(c)
