"""Massive activations on natural text: where the peak is born, and what the gate does to it

The paper (Qiu et al. 2025, Sec. 4.3, Table 4) finds the baseline's largest hidden-state values
(M-Act 1053 in the 15A2B MoE) cut to 94 by the G1 elementwise gate, the massive activation being
the partner of the attention sink on the first token. On the Bigram-Backcopy task
(experiments/sink_synthetic.py) M-Act is in the thousands for every variant; this experiment asks
whether that holds on natural text under the paper's recipe (warm-up, cosine decay to 3e-5,
weight decay 0.1, AdamW b2 0.95) as the peak learning rate rises through the range in which the
paper trains (2e-3 to 8e-3) and past it: the default `tiny` model (4 layers, hidden 128, QK-norm)
on the built-in corpus, 400 steps of 16 x 128 byte tokens, three seeds. Each run's analysis
locates the peak: the layer and site (attention output, after the attention residual, FFN
output, after the FFN residual) where it is born, its token (the first token or not), and its
size against the median |h| of that layer's output (Sun et al. 2024 call activations massive at
about 1,000 times the median). ~2 minutes a run on the 2-core CPU with two runs side by side.
"""

SEEDS = [0, 1, 2]
VARIANTS = ['baseline', 'g1_elementwise']
OVERRIDES = {
    'train.steps': 400,
    'train.eval_every': 200,
    'train.checkpoint_every': 200,
}
GRID = {'train.learning_rate': [3e-3, 1e-2, 3e-2]}
ANALYZE_OVERRIDES = {'data.val_batches': 8}
COLUMNS = ['val_loss', 'f_attn_max', 'm_act_mean', 'm_act_layers', 'm_act_ratio', 'm_act_bos',
           'm_act_origin', 'gate_score_mean', 'loss_spikes']
PER_SEED = ['m_act_mean']
