"""Stability in the paper's regime with QK-norm on (the paper's models use it): two seeds a point

experiments/lr_stability_bf16.py's settings, grid, failure and spike definitions (see its
docstring, committed before its runs) with model.qk_norm on, for the baseline, G1 elementwise and
G1 headwise, seeds 0 and 1: whether the half-failure rates move with QK-norm, which removes one
known cause of divergence at high rates (attention-logit growth; Wortsman et al. 2023).
"""

from experiments import lr_stability_bf16 as _base

SEEDS = [0, 1]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
GRID = dict(_base.GRID)
OVERRIDES = {**_base.OVERRIDES, 'model.qk_norm': True}
STABILITY = True
DIVERGED_ABOVE = _base.DIVERGED_ABOVE
SECOND_CUTOFF = _base.SECOND_CUTOFF
SPIKES_AFTER_WARMUP = True
COLUMNS = list(_base.COLUMNS)
PER_SEED = list(_base.PER_SEED)
