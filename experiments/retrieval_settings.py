"""Retrieval in miniature, the setting search's second step: depth, heads, QK-norm, pairs

experiments/retrieval_extension.py's multi-query associative recall formed in 2 of 6 baseline runs
and 0 of 6 G1 elementwise runs (6,000 steps), and width 128 made it no likelier
(experiments/retrieval_width.py: 0 of 6 by step 3,000). Retrieval needs an induction circuit
(Olsson et al. 2022): a previous-token head, then a head that matches on it. Four one-factor
changes from retrieval_extension's model, each for two seeds of the baseline, 3,000 steps:
a third layer (more places for either head), four heads of 16 (more heads that can become the
previous-token head), QK-norm off (QK-norm bounds the attention logits that a sharp
previous-token head needs, so it can slow the phase change), and 2 pairs a document instead of 4
(an easier map to learn, but a smaller reward for retrieving over guessing: ln 2 against ln 4 per
answer). A run that retrieves ends far below the guessing plateau (validation loss near 1.84 at
4 pairs; 2 pairs have another plateau, so compare within a point). Measured (2026-12-04, 2-core
CPU, two runs side by side): 4.3-5.7 minutes a run, 40 minutes summed. Only 2 pairs made one of
the two seeds retrieve (seed 1: 1.065 by step 1,000; seed 0: 1.295); the third layer (1.882,
2.011), four heads (1.839, 1.838) and QK-norm off (1.892, 1.852) left both seeds guessing.
"""

from experiments import retrieval_extension

SEEDS = [0, 1]
VARIANTS = ['baseline']
OVERRIDES = dict(retrieval_extension.OVERRIDES)
OVERRIDES.update({'train.steps': 3000})
POINTS = [{'model.num_layers': 3},
          {'model.num_heads': 4, 'model.num_kv_heads': 4},
          {'model.qk_norm': False},
          {'data.synthetic.pairs': 2}]
POINT_NAMES = ['l3', 'h4', 'noqkn', 'p2']
COLUMNS = ['val_loss', 'f_attn_max', 'gate_score_mean', 'loss_spikes', 'train_minutes']
PER_SEED = ['val_loss']
