"""The analysis: statistics and figures of a model's attention sink, massive activations, gate
scores and SDPA sparsity. It imports the model only; modes/ opens runs and calls it.

  metrics.py         pooling the per-batch statistics of `inspect(model, ...)`; the report
  analyze.py         --mode=analyze's options, report.json and figures (RUN/analysis/)
  compare.py         --mode=compare's table and side-by-side figures for several runs
  plots.py           the figures (matplotlib, Agg)
  attention_maps.py  attention_map(model, tokenizer, text) and token labels (the notebook)

Opening a run: `from gated_attention.runs import rundir; run = rundir.load_run('runs/g1')`.
"""
