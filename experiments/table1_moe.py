"""Table 1 in miniature, the MoE: moe_tiny with the baseline, 4 more experts and the G1 gates

The paper's Table 1 is a Mixture-of-Experts table (15A2B: 128 experts, top-8). Here the CPU-sized
`moe_tiny` (4 layers, hidden 128, 4 query / 2 KV heads of 32, 8 experts of width 96, top-2,
softmax router, global-batch load balancing and z-loss, untied embeddings) with the baseline, the
baseline with 4 more experts (both total and activated: 12 experts, top-6; the paper's row), and
the G1 elementwise and headwise gates, at experiments/table1_dense.py's compute: 300 steps of
16 x 128 byte tokens, AdamW at 3e-3 with 30 warm-up steps then cosine, four seeds, each variant
paired with the baseline by seed.
"""

from experiments import table1_dense

SCALE = 'moe_tiny'
SEEDS = list(table1_dense.SEEDS)
VARIANTS = ['baseline', 'g1_elementwise', 'baseline_more_experts', 'g1_headwise']
OVERRIDES = dict(table1_dense.OVERRIDES)
COLUMNS = list(table1_dense.COLUMNS)
PER_SEED = list(table1_dense.PER_SEED)
PAIRED = 'baseline'
PAPER = {'g1_elementwise': 0.265, 'g1_headwise': 0.234}
PAPER_LABEL = table1_dense.PAPER_LABEL
