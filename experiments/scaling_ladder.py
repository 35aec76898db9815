"""Scaling in miniature: baseline, G1 elementwise and headwise at four sizes over 32x, three seeds

The paper's claim that the gate "improves scaling properties" (Qiu et al. 2025, Sec. 1 and 4.1:
lower loss at every scale of its 1.7B dense and 15A2B MoE models, and training that tolerates
larger learning rates and batches) has no miniature in this project yet. Here the same recipe at
four sizes on the built-in natural-text corpus (byte tokens): non-embedding parameters (N, Kaplan
et al. 2020) 24.8k, 98.8k, 323k and 788k for the baseline (2 layers of width 32 and 64, 3 of
96, 4 of 128; heads of 16-32 with GQA, SwiGLU at 3x width, QK-norm, tied embeddings; the
elementwise gate adds 8% to N, the headwise one under 1%), each trained on 4 tokens per baseline
non-embedding parameter (99k-3.15M tokens: 97-3,077 steps of 8 x 128 tokens; far below
Chinchilla's 20, the same ratio at every size, so compute grows as N^2), AdamW at 3e-3 with a
warm-up of 10% of the steps and cosine decay to 10%, weight decay 0.1. Analysed on 16 held-out
batches (16k tokens). SCALING adds the loss-against-size and loss-against-FLOPs figure, a power
law per variant with its bootstrap interval, and each size's baseline - gated gap, paired by
seed, with its trend per decade (experiments/scaling.py).
Measured on the 2-core CPU, two runs side by side: 0.1, 0.2, 2 and 8 minutes a run at the four
sizes (11 with the test suite running beside them); the baseline and G1 elementwise (24 runs)
took 34 minutes of wall time, headwise (12 runs) another ~35 with other work on the machine.
"""

SEEDS = [0, 1, 2]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
SCALING = True


def _size(layers, width, heads, kv_heads, head_dim, steps):
  return {'model.num_layers': layers, 'model.hidden_size': width, 'model.num_heads': heads,
          'model.num_kv_heads': kv_heads, 'model.head_dim': head_dim, 'model.ffn_size': 3 * width,
          'train.steps': steps, 'train.warmup_steps': max(steps // 10, 1),
          'train.eval_every': steps, 'train.checkpoint_every': steps}


# steps = 4 x the baseline's non-embedding parameters / 1,024 tokens a step
POINTS = [_size(2, 32, 2, 1, 16, 97), _size(2, 64, 2, 1, 32, 386), _size(3, 96, 3, 1, 32, 1263),
          _size(4, 128, 4, 2, 32, 3077)]
OVERRIDES = {
    'data.seq_len': 128,
    'train.batch_size': 8,
    'train.learning_rate': 3e-3,
    'train.min_learning_rate': 3e-4,
}
ANALYZE_OVERRIDES = {'data.val_batches': 16}
COLUMNS = ['params', 'train_tokens', 'train_flops', 'val_loss', 'f_attn_max', 'm_act_mean',
           'm_act_ratio', 'gate_score_mean', 'gate_sparse', 'loss_spikes', 'train_minutes']
PER_SEED = ['val_loss']
POINT_NAMES = ['n25k', 'n99k', 'n323k', 'n788k']
