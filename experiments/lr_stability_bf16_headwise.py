"""Stability in the paper's regime, G1 headwise: experiments/lr_stability_bf16.py's grid, two seeds

The issue's design gives G1 headwise fewer seeds than the baseline and G1 elementwise. The same
settings, failure and spike definitions as experiments/lr_stability_bf16.py (see its docstring,
committed before its runs), with the baseline's seeds 0 and 1 beside G1 headwise's. Run it into
that experiment's output directory so that the baseline's runs are the same ones, not retrained
(same run names and commands: the runner skips them):

  python -m experiments.run experiments/lr_stability_bf16_headwise.py \\
      --out experiments/out/lr_stability_bf16
"""

from experiments import lr_stability_bf16 as _base

SEEDS = [0, 1]
VARIANTS = ['baseline', 'g1_headwise']
GRID = dict(_base.GRID)
OVERRIDES = dict(_base.OVERRIDES)
STABILITY = True
DIVERGED_ABOVE = _base.DIVERGED_ABOVE
SECOND_CUTOFF = _base.SECOND_CUTOFF
SPIKES_AFTER_WARMUP = True
COLUMNS = list(_base.COLUMNS)
PER_SEED = list(_base.PER_SEED)
