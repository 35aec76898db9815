"""The hybrid on text: one layer in four attends, with and without the gate, beside all-attention

Beyond the paper: the hybrid of experiments/hybrid_sink.py (hybrid_tiny: 4 layers, three Gated
DeltaNets then an attention layer, hidden 128, 4 query / 2 KV heads of 32, partial RoPE,
zero-centred RMSNorm, QK-norm) and the same model with every layer attending, each with and
without the G1 elementwise gate, on the built-in corpus (byte tokens), four seeds a group. Sized to
the shared 2-core CPU by the sink task's pilot: 300 steps of 8 x 128 tokens (307k tokens) at
hybrid_tiny's recipe (AdamW 3e-3, 60 warm-up steps, cosine decay), the analysis on 8 held-out
batches. At these sizes all-attention models form no sink on text (docs/results.md, the scorecard's
first row), so the question here is the gate's effect on the loss, paired by seed, in a model
where one layer in four attends.
"""

SCALE = 'hybrid_tiny'
SEEDS = [0, 1, 2, 3]
VARIANTS = ['baseline', 'g1_elementwise']
POINTS = [{}, {'model.layer_types': str(('full_attention',) * 4)}]
POINT_NAMES = ['hybrid', 'attention']
OVERRIDES = {'train.steps': 300, 'train.batch_size': 8, 'train.eval_every': 100,
             'train.checkpoint_every': 300}
ANALYZE_OVERRIDES = {'data.val_batches': 8}
PAIRED = 'baseline'
PAIRED_METRICS = ['val_loss', 'f_attn_max']
COLUMNS = ['val_loss', 'ppl', 'f_attn_layers', 'f_attn_max', 'm_act_mean', 'gate_score_mean',
           'linear_gate_score', 'train_minutes']
