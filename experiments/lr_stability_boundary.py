"""Learning-rate tolerance at the boundary: sixteen seeds at the peak rate 3.0

At experiments/lr_stability.py's peak rate 3.0 (8 layers of width 64, no QK-norm) the guard
halted the baseline on 4 of 4 seeds and G1 elementwise on 2 of 4 (Fisher's exact test p = 0.43:
four seeds cannot tell). Here the same setting at that rate alone on sixteen seeds: 4-15 first,
then 0-3 again (the runs of lr_stability.py retrained here, so that this table counts all
sixteen and its Fisher test is over them); failure, spikes and DIVERGED_ABOVE as there.
"""

from experiments import lr_stability

SEEDS = list(range(16))
VARIANTS = ['baseline', 'g1_elementwise']
GRID = {'train.learning_rate': [3.0]}
OVERRIDES = dict(lr_stability.OVERRIDES)
STABILITY = True
DIVERGED_ABOVE = lr_stability.DIVERGED_ABOVE
COLUMNS = list(lr_stability.COLUMNS)
PER_SEED = list(lr_stability.PER_SEED)
