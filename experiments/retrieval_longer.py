"""Table 5 in miniature, trained twice as long: 12,000 steps, then the extension recipe

experiments/retrieval_table5.py ran the paper's Table 5 recipe (Qiu et al. 2025, Sec. 4.4) on the
2-pair associative recall runs of retrieval_pairs.py after 6,000 steps: retrieval had formed in
4 of 6 baseline runs and 1 of 6 G1 elementwise runs (two more part-way), too few gated runs to
compare. Here the same twelve runs trained on to 12,000 steps (the learning rate is constant
after the warm-up, so this is the 12,000-step run), so that retrieval forms in most seeds of
both variants, then the same recipe: 750 steps at 256 tokens with RoPE base 1e6
(configs/extend_context.py), evaluated at 64-1,024 tokens as they are (`rope`) and with YaRN x4
over 256 (`yarn`). The extensions from step 6,000 are kept beside each run
(<run>/extended.from_step_6000, moved aside by the runner, not deleted).
One change from retrieval_table5: `train.spike_min_ratio` 1.5 (the default 1.1), which the
extension inherits. The guard's threshold changes which steps are counted as spikes and so when a
checkpoint may be written, not a single update (training/stability.py): in retrieval_table5 two
extensions ended in a 1.1-1.25x blip and had to be resumed by hand with this value.
Train it by copying retrieval_table5's runs into this experiment's runs/, then
`python -m experiments.run experiments/retrieval_longer.py --jobs 2`.
Measured (2026-12-04, 2-core CPU, two runs side by side, the test suite beside them for the first
36 minutes): 11.5-17.8 minutes a pair of runs (6,000 more steps, the extension, two evaluations),
94 minutes of wall time. No run or extension ended spiking.
FORMED_BELOW: retrieval formed when the final validation loss is below 1.17, between guessing
(1.29-1.30) and retrieving (1.03-1.08).
"""

from experiments import retrieval_table5

SEEDS = retrieval_table5.SEEDS
VARIANTS = retrieval_table5.VARIANTS
OVERRIDES = dict(retrieval_table5.OVERRIDES)
OVERRIDES.update({'train.steps': 12000, 'train.spike_min_ratio': 1.5})
EXTEND = retrieval_table5.EXTEND
LONG_CONTEXT = retrieval_table5.LONG_CONTEXT
LONG_CONTEXT_OVERRIDES = retrieval_table5.LONG_CONTEXT_OVERRIDES
COLUMNS = retrieval_table5.COLUMNS
PER_SEED = retrieval_table5.PER_SEED
FORMED_BELOW = 1.17
