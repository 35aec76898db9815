"""Where the Bigram-Backcopy sink forms: a boundary map, baseline against G1 elementwise

The sink experiment (experiments/sink_synthetic.py) found one setting in which the baseline grows
an attention sink. This map moves one factor at a time away from that centre (2 layers of one
head, head dim 128, QK-norm off, vocab 32 with 4 triggers and branching 3, task seed 0 whose chain
puts a trigger before 0.26 of the targets, 1,000 steps of 16 x 128 tokens at a constant 1e-2 after
60 warm-up steps, weight decay 0.1) and trains the baseline and G1 elementwise at each point on
three seeds. Factors: the share of targets that copy (data.synthetic.copy_share fixes it whatever
the chain; the task seeds 1-3 draw other chains at their own share), the trigger and vocabulary
counts at a fixed share, heads per layer (the attention width stays 128), QK-norm, the learning
rate and its schedule (cosine decay to 1e-4 after the warm-up; the paper's recipe is warm-up then
cosine, weight decay 0.1), and weight decay. A point "has a sink" when some layer's F-Attn is at
least 0.3 at the end (uniform causal attention at 128 tokens gives 0.035); "F-Attn max during
training" is the largest value at any of the loop's 8 evaluations (a sink that came and went).
~1 minute a run on the 2-core CPU with two runs side by side (114 runs: ~2 hours).
"""

SEEDS = [0, 1, 2]
VARIANTS = ['baseline', 'g1_elementwise']
OVERRIDES = {
    'data.source': 'synthetic',
    'data.task': 'bigram_backcopy',
    'data.synthetic.vocab': 32,
    'data.synthetic.triggers': 4,
    'data.synthetic.branching': 3,
    'data.seq_len': 128,
    'model.num_layers': 2,
    'model.num_heads': 1,
    'model.num_kv_heads': 1,
    'model.head_dim': 128,
    'model.qk_norm': False,
    'train.steps': 1000,
    'train.batch_size': 16,
    'train.learning_rate': 1e-2,
    'train.min_learning_rate': 1e-2,  # constant after the warm-up
    'train.eval_every': 125,
    'train.checkpoint_every': 500,
}
POINTS = [
    {},                                                     # the centre (copy share 0.26)
    {'data.synthetic.copy_share': 0.05},
    {'data.synthetic.copy_share': 0.1},
    {'data.synthetic.copy_share': 0.15},
    {'data.synthetic.copy_share': 0.25},
    {'data.synthetic.copy_share': 0.4},
    {'data.synthetic.task_seed': 1},                        # chains at their own share
    {'data.synthetic.task_seed': 2},
    {'data.synthetic.task_seed': 3},
    {'data.synthetic.triggers': 1, 'data.synthetic.copy_share': 0.25},
    {'data.synthetic.triggers': 8, 'data.synthetic.copy_share': 0.25},
    {'model.num_heads': 2, 'model.num_kv_heads': 2, 'model.head_dim': 64},
    {'model.num_heads': 4, 'model.num_kv_heads': 4, 'model.head_dim': 32},
    {'model.qk_norm': True},
    {'train.learning_rate': 3e-3, 'train.min_learning_rate': 3e-3},
    {'train.learning_rate': 3e-2, 'train.min_learning_rate': 3e-2},
    {'train.min_learning_rate': 1e-4},                      # 1e-2, cosine decay
    {'train.learning_rate': 3e-3, 'train.min_learning_rate': 1e-4},
    {'train.weight_decay': 0.0},
]
COLUMNS = ['copy_share', 'val_loss', 'f_attn_layers', 'f_attn_max', 'sink_seeds',
           'f_attn_max_during', 'm_act_mean', 'm_act_ratio', 'm_act_bos', 'm_act_origin',
           'gate_score_mean', 'loss_spikes']
PER_SEED = ['f_attn_max']
