"""Inside the sink region: what each gate does, two heads per layer, five seeds

The boundary map (experiments/sink_boundary.py) found a setting where the baseline's sink forms
on every seed: the Bigram-Backcopy task with a fixed copy share of 0.1 (data.synthetic.copy_share:
a tenth of the targets follow a trigger, so the copy head has nothing to do on nine queries in
ten), where layer 0 sent 0.85-1.0 of its attention to BOS in every head with one, two or four
heads per layer. Here the paper's Table 4 rows (Qiu et al. 2025, Sec. 4.3) at two heads per layer
(head dim 64, two KV heads), so that the head-shared gate (the elementwise gate averaged over the
query heads) differs from the head-specific one: the baseline, G1 elementwise, headwise and
head-shared, G2 elementwise (on the values), the input-independent gate and NS-sigmoid
(0.5 + 0.5 sigmoid: never below 0.5). Everything else as in the sink experiment: 2 layers, hidden
128, QK-norm off, vocab 32 with 4 triggers and branching 3, 1,000 steps of 16 x 128 tokens at a
constant 1e-2 after 60 warm-up steps, weight decay 0.1. ~1 minute a run alone on the 2-core CPU
(35 runs).
"""

from experiments import sink_synthetic

SEEDS = [0, 1, 2, 3, 4]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise', 'g1_headshared', 'g2_elementwise',
            'g1_input_independent', 'g1_ns_sigmoid']


def _overrides() -> dict:
  """The sink experiment's settings with a fixed copy share of 0.1 (after 'branching') and two
  heads of 64 per layer, in the key order of the dict this file once spelt out, so the runs'
  commands (runner.json's record of a finished run) did not change."""
  o = {}
  for key, value in sink_synthetic.OVERRIDES.items():
    o[key] = value
    if key == 'data.synthetic.branching':
      o['data.synthetic.copy_share'] = 0.1
  o.update({'model.num_heads': 2, 'model.num_kv_heads': 2, 'model.head_dim': 64})  # in place
  return o


OVERRIDES = _overrides()
COLUMNS = ['val_loss', 'f_attn_layers', 'f_attn_max', 'sink_seeds', 'f_attn_max_during',
           'm_act_mean', 'm_act_ratio', 'm_act_bos', 'm_act_origin', 'gate_score_mean',
           'loss_spikes']
PER_SEED = ['f_attn_max']
