"""Long context in miniature: baseline vs G1 elementwise through the paper's extension recipe

The paper's Table 5 (Qiu et al. 2025, Sec. 4.4): models pre-trained at 4k tokens with RoPE base
10k continue at 32k with base 1M, then are evaluated beyond 32k with YaRN; the gated models keep
far more of their RULER accuracy (66.60 vs 37.51 at 64k). Here the lengths become ratios: the
`tiny` model (4 layers, hidden 128, QK-norm; 0.9 M parameters) trains 600 steps of 16 x 256 byte
tokens of the built-in corpus, a quarter of whose tokens are RULER-style task documents (the
training mixture, data.mix_*: needle retrieval and variable tracking, 256 tokens each), then
continues 150 steps at 1,024 tokens with base 1e6 (16 sequences a step, so 4x the tokens), and is
evaluated at 256-4,096 tokens (1x-16x its first training length) as it is (`rope`) and with YaRN
x4 over the 1,024 of its continued training (`yarn`): cross-entropy by position bucket on held-out
documents of 4,097 tokens, and exact match on 32 RULER-style prompts per task and length
(held-out haystack). Measured with the two runs side by side on the 2-core machine (and other
jobs for part of the time): training 18 minutes a run, the continued training 35-36, the two
evaluations 39.5 (16-23 minutes per RoPE setting, most of it the RULER prompts at 2-4k tokens).
The RULER columns are 0 for both models at every length, the training length included: the
0.9M-parameter model never learns retrieval within this budget (docs/results.md, "What we
found", says what was tried), so here only the loss by position measures the extension.
"""

SEEDS = [0]
VARIANTS = ['baseline', 'g1_elementwise']
OVERRIDES = {
    'data.seq_len': 256,
    'data.mix_tasks': 'all',
    'data.mix_ratio': 0.25,
    'data.mix_tokens': 256,      # whole windows: every task fits (niah_multivalue needs 244)
    'train.steps': 600,
    'train.eval_every': 300,
    'train.checkpoint_every': 300,
}
EXTEND = 'seq_len=1024,rope_base=1e6,steps=150'
LONG_CONTEXT = {
    'rope': {},
    'yarn': {'model.rope_scaling.type': 'yarn', 'model.rope_scaling.factor': 4,
             'model.rope_scaling.original_max_len': 1024},
}
LONG_CONTEXT_OVERRIDES = {
    'long_context.lengths': '256,512,1024,2048,4096',
    'long_context.examples': 32,
    'long_context.docs': 8,
}
COLUMNS = ['val_loss', 'f_attn_mean', 'm_act_mean', 'gate_score_mean', 'train_minutes']
