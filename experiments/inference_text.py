"""Inference on natural text: the tiny model, baseline against G1 elementwise and headwise, four seeds

What a sink-free model buys at inference (issue 53), on natural text: the `tiny` model (4 layers,
hidden 128, 4 query / 2 KV heads of 32, QK-norm, RoPE, SwiGLU 384, tied embeddings; 0.90 M
parameters with the G1 gate) trained as Table 1's miniature trains it (experiments/
table1_dense.py, whose runs of these three variants have the same commands and are reused: 300
steps of 16 x 128 byte tokens of the built-in corpus, AdamW at 3e-3 with 30 warm-up steps and
cosine decay, 8 held-out batches), four seeds of each variant so that differences pair by seed. Each run is then evaluated three ways on 16 held-out
documents of 513 bytes (4x the training length): with the full cache (`full`: nothing evicted,
the reference, which past 128 tokens runs beyond the trained positions), and streamed token by
token (StreamingLLM's perplexity evaluation) through a cache of 64 slots holding the last 64
tokens alone (`window`: the first token is evicted at position 64) or the first 4 tokens and the
last 60 (`sinks`: StreamingLLM's attention sinks, the same memory). Positions inside the cache are
assigned by place, so the windowed caches never leave the trained positions. The buckets:
positions 0-64 (nothing evicted: the three agree), 64-128 (evicted, within the training length:
the comparison), 128-256 and 256-512 (beyond it). experiments/inference.py adds the quantized
evaluations and the paired statistics. ~2 minutes a run alone on the 2-core CPU (up to 20 with
the machine shared), the evaluations ~1 minute more.
"""

from experiments import table1_dense

SEEDS = [0, 1, 2, 3]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
OVERRIDES = dict(table1_dense.OVERRIDES)     # its runs, reused: the same commands
COLUMNS = ['val_loss', 'ppl', 'f_attn_mean', 'f_attn_max', 'm_act_mean', 'm_act_ratio',
           'gate_score_mean', 'train_minutes']
LONG_CONTEXT = {
    'full': {},
    'window': {'long_context.window': 64},
    'sinks': {'long_context.window': 60, 'long_context.sinks': 4},
}
LONG_CONTEXT_OVERRIDES = {
    'long_context.lengths': '64,128,256,512',
    'long_context.docs': 16,
    'long_context.batch_size': 8,
    'long_context.chunk': 64,
    'long_context.tasks': '',
    'long_context.examples': 0,
}
# experiments/inference.py: --mode=quantization of every run (--config.quantization.<key>)
QUANTIZATION = {'quantization.settings': 'w8a16,w4a16,w16a8,w8a8,w4a8,w16a4,w4a4',
                'quantization.group_size': 32, 'quantization.num_batches': 8}
