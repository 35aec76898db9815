"""The sink in a hybrid: where it forms when one layer in four attends, and whether the gate matters

Beyond the paper: Qwen3-Next and Qwen3.5 keep the paper's G1 elementwise gate in the one layer in
four that attends (three Gated DeltaNet layers, then full attention; docs/hybrid.md). Here that
pattern at hybrid_tiny's width (4 layers: DeltaNet, DeltaNet, DeltaNet, attention; partial RoPE on
a quarter of head_dim, zero-centred RMSNorm), with and without the attention output gate, beside
models of the same depth and switches whose four layers all attend (layer_types all
full_attention), on the Bigram-Backcopy setting where the 2-layer baseline sinks on 12 seeds of 12
(experiments/sink_layers.py: copy share 0.1, two heads of 64, QK-norm off, a constant 1e-2).
Sized to the shared 2-core CPU by a pilot (one hybrid baseline run: its attention layer at F-Attn
0.01 at step 100, 0.11 at 300, 0.48 at 400; ~0.5 s a step alone): 400 steps of 8 x 128 tokens,
four seeds a group. A sink is F-Attn >= 0.3 in a layer (rundata.SINK_F_ATTN), defined before the
runs; the gate's effect on the sink is the largest layer's F-Attn, baseline minus G1 elementwise,
paired by seed (the same data and initialisation). In a hybrid F-Attn exists only for its
attention layer (layer 3); the DeltaNet layers' output gate SiLU(z) is reported beside it.
"""

from experiments import sink_gates

SCALE = 'hybrid_tiny'
SEEDS = [0, 1, 2, 3]
VARIANTS = ['baseline', 'g1_elementwise']
ATTENTION = str(('full_attention',) * 4)   # --config.model.layer_types takes a tuple's text
POINTS = [{}, {'model.layer_types': ATTENTION}]
POINT_NAMES = ['hybrid', 'attention']
OVERRIDES = {k: v for k, v in sink_gates.OVERRIDES.items() if k != 'model.num_layers'}
OVERRIDES.update({'train.steps': 400, 'train.batch_size': 8, 'train.eval_every': 100,
                  'train.checkpoint_every': 400})
PAIRED = 'baseline'
PAIRED_METRICS = ['val_loss', 'f_attn_max']
COLUMNS = ['val_loss', 'f_attn_layers', 'sink_layer', 'sink_seeds', 'f_attn_max',
           'f_attn_max_during', 'm_act_ratio', 'gate_score_mean', 'linear_gate_score',
           'train_minutes']
PER_SEED = ['f_attn_max']
