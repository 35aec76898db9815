"""Natural text: baseline vs G1 elementwise and headwise on the built-in corpus, three seeds

A model sized for the 2-core CPU: 4 layers, hidden 256, 4 query / 2 KV heads of 64 (QK-norm, RoPE,
SwiGLU 768, tied embeddings; 3.2 M parameters, 3.5 M with the elementwise gate), 500 steps of 16 x
256 byte tokens (2.0 M tokens; measured 14-16 minutes a run alone on this machine, up to 20 sharing
it), AdamW at 3e-3 with 60 warm-up steps and cosine decay, weight decay 0.1. The analysis runs on 8
held-out batches. The paper's direction (Qiu et al. 2025, Table 1 and Sec. 4): lower perplexity, far
less attention to the first token and smaller massive activations with the gate; whether a sink
forms at all at this size is the first question (the uniform-causal F-Attn at 256 tokens is 0.020).
"""

SEEDS = [0, 1, 2]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
OVERRIDES = {
    'model.hidden_size': 256,
    'model.num_heads': 4,
    'model.num_kv_heads': 2,
    'model.head_dim': 64,
    'model.ffn_size': 768,
    'data.seq_len': 256,
    'train.steps': 500,
    'train.eval_every': 250,
    'train.checkpoint_every': 250,
}
ANALYZE_OVERRIDES = {'data.val_batches': 8}
COLUMNS = ['val_loss', 'ppl', 'f_attn_mean', 'f_attn_max', 'm_act_mean', 'gate_score_mean',
           'loss_spikes', 'train_minutes']
