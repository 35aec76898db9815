"""Sink in miniature: what each gate does to a Bigram-Backcopy attention sink

Baseline and six gates on the Bigram-Backcopy task (Guo et al. 2024; input_pipeline/synthetic.py),
2 layers with one head each (hidden 128, head dim 128), QK-norm off, 1,000 steps of 16 x 128
tokens at a constant learning rate of 1e-2, five seeds (three until 2026-12-02). Found by a search on the 2-core CPU
(one seed each; F-Attn from the training loop's evaluations): the baseline's layer 0 sent
0.58-0.59 of its attention to the first token (BOS) from step 375 on (layers 0 / 1: 0.58 / 0.03
at step 1,000), with a residual-state peak at BOS (max |h| 4,634 at layer 0's FFN output), in 4.8
minutes; g1_elementwise with the same settings stayed at 0.00-0.03 in layer 0 (0.02 / 0.01 at
step 1,000, gate score 0.08). Two heads per layer gave no lasting sink (0.17 at step 1,000 at
lr 3e-3; 0.68 at step 250 at lr 1e-2, gone to 0.08 by step 1,250), and QK-norm held it off:
with two heads F-Attn stayed at or below 0.11 at lr 3e-3 or 1e-2; with one head (the setting
here, QK-norm on as in the paper) it climbed to 0.30 only by step 875. With one head per layer
the head-shared gate averages over a single head, so g1_headshared computes what g1_elementwise
does: it is left out here (experiments/sink_gates.py has it, at two heads per layer); G2's
per-KV-head gate covers that head. On five seeds the baseline's sink forms on only three at this
setting (docs/results.md); experiments/sink_boundary.py maps where it forms on every seed.
"""

SEEDS = [0, 1, 2, 3, 4]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise', 'g2_elementwise', 'g1_ns_sigmoid',
            'g1_input_independent']
OVERRIDES = {
    'data.source': 'synthetic',
    'data.task': 'bigram_backcopy',
    'data.synthetic.vocab': 32,      # 4 triggers among 32 tokens: a quarter of the queries copy
    'data.synthetic.triggers': 4,
    'data.synthetic.branching': 3,   # sparse transitions: the copy matters (optimal loss ~0.55)
    'data.seq_len': 128,             # one BOS-first document per sequence
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
COLUMNS = ['val_loss', 'f_attn_layers', 'f_attn_max', 'sink_seeds', 'f_attn_max_during',
           'm_act_mean', 'm_act_ratio', 'm_act_bos', 'm_act_origin', 'gate_score_mean',
           'loss_spikes', 'train_minutes']
PER_SEED = ['f_attn_max']
