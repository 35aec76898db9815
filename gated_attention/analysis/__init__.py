"""The attention-sink analysis: F-Attn, M-Act, gate scores, SDPA sparsity, perplexity.

  metrics.py   pooling the per-batch statistics of `Transformer(..., inspect=True)`; the report
  analyze.py   --mode=analyze: a run's checkpoint on held-out batches -> RUN/analysis/
  compare.py   --mode=compare: the paper's table and side-by-side figures for several runs
  plots.py     the figures (matplotlib, Agg)
  (opening a run read-only: gated_attention.runs.load)

Submodules import JAX lazily enough for `compare` to stay cheap; import what you need:
  from gated_attention.runs import load; run = load.load_run('runs/g1')
"""
