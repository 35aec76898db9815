"""Where the Bigram-Backcopy sink forms: a boundary map of the baseline

The sink experiment (experiments/sink_synthetic.py) found one setting in which the baseline grows
an attention sink, and on five seeds it forms on only some of them. This map moves one factor at
a time and trains the baseline on three seeds at each point. The centre: 2 layers of one head,
head dim 128, QK-norm off, vocab 32 with 4 triggers and branching 3, task seed 0 (whose chain puts
a trigger before 0.26 of the targets), 1,000 steps of 16 x 128 tokens at a constant 1e-2 after
60 warm-up steps, weight decay 0.1. First the share of targets that copy (data.synthetic.copy_share
fixes it whatever the chain; task seeds 1-3 draw other chains at their own share). The first runs
showed the sink on every seed at copy shares 0.05-0.15 (the head is dormant on more queries), so
the other factors move away from copy share 0.1: the trigger and vocabulary counts, heads per
layer (the attention width stays 128), QK-norm, the learning rate and its schedule (cosine decay
to 1e-4 after the warm-up: the paper's recipe is warm-up then cosine with weight decay 0.1), and
weight decay. A run "has a sink" when some layer's F-Attn is at least 0.3 at the end (uniform
causal attention at 128 tokens gives 0.035); "F-Attn max during training" is the largest value at
any of the loop's 8 evaluations (a sink that came and went). Measured: ~1 minute a run alone on
the 2-core CPU, 1.7-3.8 minutes with two runs side by side and other jobs (60 runs).
"""

from experiments import sink_synthetic

SEEDS = [0, 1, 2]
VARIANTS = ['baseline']
# The sink experiment's settings (its centre), key for key in its order: the runs' commands
# (and so runner.json's record of a finished run) stay those of the file that spelt them out.
OVERRIDES = dict(sink_synthetic.OVERRIDES)
POINTS = [
    {},                                                     # the centre (copy share 0.26)
    {'data.synthetic.copy_share': 0.05},
    {'data.synthetic.copy_share': 0.1},
    {'data.synthetic.copy_share': 0.15},
] + [dict({'data.synthetic.copy_share': 0.1}, **p) for p in [   # around copy share 0.1
    {'model.num_heads': 2, 'model.num_kv_heads': 2, 'model.head_dim': 64},
    {'model.num_heads': 4, 'model.num_kv_heads': 4, 'model.head_dim': 32},
    {'model.qk_norm': True},
    {'data.synthetic.triggers': 1},
    {'data.synthetic.triggers': 8},
    {'data.synthetic.vocab': 64},
    {'train.learning_rate': 3e-3, 'train.min_learning_rate': 3e-3},
    {'train.learning_rate': 3e-2, 'train.min_learning_rate': 3e-2},
    {'train.min_learning_rate': 1e-4},                      # 1e-2, cosine decay
    {'train.learning_rate': 3e-3, 'train.min_learning_rate': 1e-4},
    {'train.weight_decay': 0.0},
]] + [
    {'data.synthetic.copy_share': 0.25},
    {'data.synthetic.copy_share': 0.4},
    {'data.synthetic.task_seed': 1},                        # chains at their own share
    {'data.synthetic.task_seed': 2},
    {'data.synthetic.task_seed': 3},
]
COLUMNS = ['copy_share', 'val_loss', 'f_attn_layers', 'f_attn_max', 'sink_seeds',
           'f_attn_max_during', 'm_act_mean', 'm_act_ratio', 'm_act_bos', 'm_act_origin',
           'loss_spikes']
PER_SEED = ['f_attn_max']
