"""Sink at accelerator scale: a 90M-parameter model at context 2048 on natural text (one GPU/TPU)

The paper's natural-text sink (Qiu et al. 2025, Sec. 4.3; at small scale, Gu et al. 2025: ~60M
LLaMA-style models at context 2048 show it after 1-2k steps), at the `dense_90m` scale: 12 layers,
hidden 768, 12 query / 4 KV heads of 64, QK-norm, SwiGLU 2048, tied embeddings, bfloat16
compute (88.1M parameters; 95.2M with the elementwise gate), a 16,384-token byte-level BPE
trained offline on the training split, context 2048, 32 sequences per step, 4,000 steps
(262M tokens), AdamW 1e-3 with 500 warm-up steps and cosine to 1e-4, weight decay 0.1.
Data: `builtin_large`, the Python standard library and the installed packages' source (287 MB
in this project's full test environment, ~90M BPE tokens: a run makes ~3 epochs; fewer packages
installed mean more epochs, `describe()` in the train log gives the size).

Expected on one H200 (not measured yet: no accelerator was at hand when this was written):
0.64 GFLOP per token (model.train_flops_per_token), 0.17 EFLOP per run, ~10 minutes per run at
300 TFLOP/s (30% of the bf16 dense peak), so the three runs, their evaluations and the analysis
fit in about an hour. One command, from the repository root:

  python -m input_pipeline.bpe --source=builtin_large --vocab_size=16384 --max_megabytes=100 \
      --out=runs/bpe16k/tokenizer.json && \
  python -m experiments.run experiments/sink_accelerator.py --results docs/results.md
"""

SCALE = 'dense_90m'
SEEDS = [0]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
OVERRIDES = {'data.tokenizer': 'runs/bpe16k/tokenizer.json'}
ANALYZE_OVERRIDES = {'train.batch_size': 8, 'data.val_batches': 4}
COLUMNS = ['val_loss', 'ppl', 'f_attn_mean', 'f_attn_max', 'f_attn_layers', 'm_act_mean',
           'gate_score_mean', 'loss_spikes', 'train_minutes']
