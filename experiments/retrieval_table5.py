"""Table 5 in miniature: retrieval beyond a continued context, with and without YaRN

The paper's Table 5 (Qiu et al. 2025, Sec. 4.4), baseline against G1 elementwise, on a task where
retrieval forms in this miniature.

The runs of experiments/retrieval_pairs.py (multi-query associative recall with 2 pairs a
document at 64 tokens, six seeds a variant; after 3,000 steps retrieval had formed in 4 of 6
baseline runs and none of the G1 elementwise runs), trained on to 6,000 steps (the learning rate
is constant after the warm-up, so this is the 6,000-step run), then continued with
retrieval_extension.py's recipe: 750 steps at 256 tokens with RoPE base 1e6 (configs/extend_context.py), then evaluated at
64-1,024 tokens (1x-16x the first training length, up to 4x the continued one) as they are
(`rope`) and with YaRN x4 over 256 (`yarn`): the retrieval probes' exact match by length (64
probes a length) and loss by position. Every seed is continued and listed; the ones whose
retrieval has not formed by step 6,000 (validation loss near 1.30, exact match near 50%, i.e.
guessing one of the two values) answer the probes by guessing here too.
Train it by copying retrieval_pairs' runs into this experiment's runs/ (or it trains them again:
same commands), then `python -m experiments.run experiments/retrieval_table5.py --jobs 2`.
Measured (2026-12-04, 2-core CPU, two runs side by side, the test suite beside them for half the
time): 9-13 minutes a run (3,000 more steps, the extension, two evaluations), 189 minutes summed,
about 75 minutes of wall time. Two baseline extensions (seeds 1 and 4) ended with a loss blip in
their last 50 steps (1.12x and 1.23x the running level), so the guard kept their step-500
checkpoint ("extension interrupted"); they were resumed from it with
`--config=configs/from_run.py:RUN/extended --workdir=RUN/extended
--config.train.spike_min_ratio=1.5` (the same losses, step by step, then saved at 750) and the
runner run again, which evaluated them.
"""

from experiments import retrieval_extension, retrieval_pairs

SEEDS = retrieval_pairs.SEEDS
VARIANTS = retrieval_pairs.VARIANTS
OVERRIDES = dict(retrieval_pairs.OVERRIDES)
OVERRIDES['train.steps'] = 6000
EXTEND = retrieval_extension.EXTEND
LONG_CONTEXT = retrieval_extension.LONG_CONTEXT
LONG_CONTEXT_OVERRIDES = retrieval_extension.LONG_CONTEXT_OVERRIDES
COLUMNS = ['val_loss', 'f_attn_max', 'gate_score_mean', 'loss_spikes', 'train_minutes']
PER_SEED = ['val_loss']
