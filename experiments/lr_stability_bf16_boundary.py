"""Stability in the paper's regime at the boundary: sixteen seeds where some but not all fail

experiments/lr_stability_bf16.py (bfloat16, 1,000 steps, a x1.25 grid; its docstring defines
FAILED and SPIKE, committed before its runs) ran four seeds a point. Issue 54's design asks for 16
seeds of the baseline and G1 elementwise at every point where some but not all seeds fail. In
that study one point is such a point: the baseline at the peak rate 0.125 (3 of 4 seeds failed at
the primary cutoff of 1.0 nats; 0/4 at 0.1, 4/4 from 0.195 on, 3/3 at 0.156); G1 elementwise
failed nowhere on the grid, so it runs at 0.125 beside the baseline, paired by seed. Seeds 0-3
are that study's runs: run this file into its output directory, and the runner skips them (same
run names and commands), so the table counts all sixteen and its Fisher test is over them:

  python -m experiments.run experiments/lr_stability_bf16_boundary.py \\
      --out experiments/out/lr_stability_bf16

24 new runs (12 seeds x 2 variants), about 2.8 min each on the 2-core CPU (the study's 242.9 min
over 88 runs). The failure and spike definitions, the cutoffs and the spikes' warm-up rule are
the study's, imported, not restated.
"""

from experiments import lr_stability_bf16 as _base

SEEDS = list(range(16))
VARIANTS = ['baseline', 'g1_elementwise']
GRID = {'train.learning_rate': [0.125]}
OVERRIDES = dict(_base.OVERRIDES)
STABILITY = True
DIVERGED_ABOVE = _base.DIVERGED_ABOVE
SECOND_CUTOFF = _base.SECOND_CUTOFF
SPIKES_AFTER_WARMUP = True
COLUMNS = list(_base.COLUMNS)
PER_SEED = list(_base.PER_SEED)
