"""Learning-rate tolerance: baseline vs G1 elementwise as the peak learning rate rises

The paper's stability claim (Qiu et al. 2025, Sec. 3, Fig. 1; Sec. 4.4): the gated model trains
without the loss spikes of the baseline and tolerates larger learning rates (the 1.7B-48L baseline
diverges at 8e-3 where the gated model trains). Here: the default `tiny` model (4 layers, hidden
128, QK-norm) on the built-in corpus, 400 steps of 16 x 128 byte tokens, one seed per learning rate
(the default is 3e-3; the grid starts above it), warm-up 60 steps then cosine. "loss spikes" are the
steps the training loop's guard flags (gated_attention/training/stability.py: far above the running loss
level, or worse than uniform guessing); a run that diverges (100 spike steps in a row, or 10 non-
finite steps in a row) is halted by the guard and counted in the "seeds done" column, not in the
means.
"""

SEEDS = [0]
VARIANTS = ['baseline', 'g1_elementwise']
GRID = {'train.learning_rate': [1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0]}
OVERRIDES = {
    'train.steps': 400,
    'train.eval_every': 200,
    'train.checkpoint_every': 200,
}
COLUMNS = ['val_loss', 'train_loss', 'loss_spikes', 'f_attn_mean', 'm_act_mean',
           'gate_score_mean', 'train_minutes']
