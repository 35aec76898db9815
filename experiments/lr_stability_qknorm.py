"""Learning-rate tolerance with QK-norm: experiments/lr_stability.py's grid with QK-norm on

The paper's models all use QK-norm (per-head RMSNorm of queries and keys), which is known to
remove one cause of divergence at high learning rates, the growth of attention logits (Wortsman
et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities"). Part of
the stabilising effect the paper gives the gate may then be QK-norm's, or the gate may matter
only without it. Here experiments/lr_stability.py's setting (8 layers of width 64, Bigram-
Backcopy, 200 steps of 8 x 64 tokens, warm-up 20 steps then cosine) and grid of peak rates with
QK-norm on, two seeds a point (seeds 0 and 1 of the four there), to set
beside that experiment's table. Failure, spikes and DIVERGED_ABOVE as there.
"""

from experiments import lr_stability

SEEDS = [0, 1]
VARIANTS = list(lr_stability.VARIANTS)
GRID = dict(lr_stability.GRID)
OVERRIDES = {**lr_stability.OVERRIDES, 'model.qk_norm': True}
STABILITY = True
DIVERGED_ABOVE = lr_stability.DIVERGED_ABOVE
COLUMNS = list(lr_stability.COLUMNS)
PER_SEED = list(lr_stability.PER_SEED)
