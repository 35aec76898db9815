"""Table 1 in miniature: every dense config on natural text at one fixed compute, four seeds each

The paper's Table 1 (Qiu et al. 2025, Sec. 4.1; 15A2B MoE, 400B tokens) compares some 20 gating
variants and parameter-matched baselines by perplexity: G1 (after SDPA) elementwise is best, G2
(value) next, G3 (key), G4 (query) and G5 (after o_proj) gain little; headwise, head-shared and
SiLU variants sit between; adding the gate's parameters to the baseline as more query or KV heads
gains far less than the gate. Here every dense config in configs/ at the `tiny` scale (4 layers,
hidden 128, 4 query / 2 KV heads of 32, SwiGLU 384, QK-norm, tied embeddings; the baseline has
837k parameters, 49k of them the embedding), trained at one fixed compute: 300 steps of
16 x 128 byte tokens of the built-in corpus (614k tokens, 0.73 tokens a parameter), AdamW at the
default 3e-3 with 30 warm-up steps (10%) and cosine decay to 3e-5, weight decay 0.1, float32.
Four seeds a variant; a seed fixes the data order (the same batches in every variant) and the
initialisation, so each variant's validation loss is compared with the baseline's paired by seed.
The parameter-matched baselines are the paper's: 1.5x the query heads (6 instead of 4) and twice
the KV heads (4 instead of 2) each add 65.5k parameters, as many as the elementwise G1 gate.
The configs not in the paper's Table 1 (sandwich norm, the analysis variants) run too.
Evaluated on 8 held-out batches (16k tokens, the same windows for every run).
"""

SEEDS = [0, 1, 2, 3]
VARIANTS = ['baseline', 'g1_elementwise', 'baseline_more_q_heads', 'baseline_more_kv_heads',
            'g1_headwise', 'g2_elementwise', 'g3_elementwise', 'g4_elementwise', 'g5_elementwise',
            'g1_headshared', 'g1_input_independent', 'g1_ns_sigmoid', 'g1_elementwise_silu',
            'g1_additive_silu', 'g1_rmsnorm', 'g1_silu_noparam', 'g1_additive_identity',
            'g2_headwise', 'g2_headshared', 'baseline_sandwich_norm']
OVERRIDES = {
    'train.steps': 300,
    'train.warmup_steps': 30,
    'train.eval_every': 300,
    'train.checkpoint_every': 300,
    'data.val_batches': 8,
}
COLUMNS = ['params', 'val_loss', 'ppl', 'f_attn_max', 'm_act_mean', 'gate_score_mean',
           'loss_spikes', 'train_minutes']
PER_SEED = ['val_loss']
# Analysis (experiments/paired.py): each variant against the baseline, paired by seed, and the
# rank agreement with the paper's differences (baseline PPL minus the variant's; 15A2B MoE, 400B
# tokens). The positions' values are the authors' (Table 1; figs/plot_compare.ipynb of
# qiuzh20/gated_attention: baseline 6.026, G1 5.761, G2 5.820, G3 6.016, G4 5.981, G5 6.017);
# headwise, head-shared, input-independent and NS-sigmoid from Table 4 (5.792, 5.801, 5.917,
# 5.900). The other rows of Table 1 are not transcribed here, so they have no paper value.
PAIRED = 'baseline'
PAPER = {'g1_elementwise': 0.265, 'g1_headwise': 0.234, 'g1_headshared': 0.225,
         'g2_elementwise': 0.206, 'g3_elementwise': 0.010, 'g4_elementwise': 0.045,
         'g5_elementwise': 0.009, 'g1_input_independent': 0.109, 'g1_ns_sigmoid': 0.126}
PAPER_LABEL = 'PPL, baseline minus variant, 15A2B MoE'
