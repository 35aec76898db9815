"""Sinks by layer: the baseline and G1 elementwise inside the sink region, twelve seeds each

The paper reports that the SDPA-output gate removes the attention sink (Qiu et al. 2025, Sec. 4.3,
Fig. 2: first-token attention 46.7% -> 4.8%). experiments/sink_gates.py measured it on five seeds
by the largest layer's F-Attn; a gate could instead move the sink to a later layer, and an
independent rerun of that setting found G1 elementwise's layer 1 at 0.35 on one seed of two.
Here each seed's sink is counted per layer (F-Attn >= 0.3 in that layer of the final analysis),
with the formation rate's 95% Wilson interval, on twelve seeds of each: the sink_gates setting
(Bigram-Backcopy, copy share 0.1, 2 layers with two heads of 64, QK-norm off, 1,000 steps of
16 x 128 tokens at a constant 1e-2). ~1 minute a run alone on the 2-core CPU (24 runs).
"""

from experiments import sink_gates

SEEDS = list(range(12))
VARIANTS = ['baseline', 'g1_elementwise']
OVERRIDES = dict(sink_gates.OVERRIDES)
COLUMNS = ['val_loss', 'f_attn_layers', 'sink_layers', 'sink_layer', 'sink_seeds',
           'f_attn_max', 'f_attn_max_during', 'm_act_ratio', 'gate_score_mean', 'loss_spikes',
           'train_minutes']
PER_SEED = ['f_attn_max']
