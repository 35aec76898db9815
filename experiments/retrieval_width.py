"""Retrieval in miniature, a first step of the setting search: does width make it form?

experiments/retrieval_extension.py's multi-query associative recall formed in 2 of 6 baseline
runs and 0 of 6 G1 elementwise runs at width 64 (6,000 steps), too few for the paper's Table 5
comparison (Qiu et al. 2025, Sec. 4.4). The Zoology study of MQAR (Arora et al. 2023) finds model
width the main factor in whether attention models solve it. Here the same task and recipe at width
128 (4 heads of 32, 2 KV heads, SwiGLU 384), 3,000 steps, three seeds a variant: a run that
retrieves ends near validation loss 1.39-1.55, one that does not near 1.84 (the task's value
guessing, retrieval_extension.py). One seed of the baseline at width 128 did not retrieve within
1,500-2,000 steps in the earlier probes. Measured (2026-12-04): 7.4 minutes a run two at a time
on the 2-core CPU; none of the 6 runs retrieved (validation loss 1.839-1.857 at step 3,000), where
width 64 had retrieved on 1 of 4 runs by step 3,000: width alone does not make it form here.
"""

from experiments import retrieval_extension

SEEDS = [0, 1, 2]
VARIANTS = ['baseline', 'g1_elementwise']
OVERRIDES = dict(retrieval_extension.OVERRIDES)
OVERRIDES.update({'model.hidden_size': 128, 'model.num_heads': 4, 'model.ffn_size': 384,
                  'train.steps': 3000})
COLUMNS = ['val_loss', 'f_attn_max', 'gate_score_mean', 'loss_spikes', 'train_minutes']
PER_SEED = ['val_loss']
