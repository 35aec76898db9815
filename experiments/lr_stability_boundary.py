"""Learning-rate tolerance at the boundary: twelve more seeds at the peak rate 3.0

At experiments/lr_stability.py's peak rate 3.0 (8 layers of width 64, no QK-norm) the guard
halted the baseline on 4 of 4 seeds and G1 elementwise on 2 of 4 (Fisher's exact test p = 0.43:
four seeds cannot tell). Here the same setting at that rate alone on seeds 4-15, so that with
those four each variant has sixteen; failure, spikes and DIVERGED_ABOVE as there.
"""

from experiments import lr_stability

SEEDS = list(range(4, 16))
VARIANTS = ['baseline', 'g1_elementwise']
GRID = {'train.learning_rate': [3.0]}
OVERRIDES = dict(lr_stability.OVERRIDES)
STABILITY = True
DIVERGED_ABOVE = lr_stability.DIVERGED_ABOVE
COLUMNS = list(lr_stability.COLUMNS)
PER_SEED = list(lr_stability.PER_SEED)
