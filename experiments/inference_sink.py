"""Inference on the sink task: streaming without the first token, and quantization, baseline against G1 elementwise and headwise, four seeds

What a sink-free model buys at inference (issue 53) where the baseline's sink is certain: the
setting of experiments/sink_gates.py and sink_layers.py (Bigram-Backcopy with copy share 0.1,
2 layers of two heads of 64, QK-norm off, 1,000 steps of 16 x 128 tokens at a constant 1e-2),
where the baseline's layer 0 sends 0.77-0.95 of its attention to the first token (BOS) on 12 of
12 seeds and G1 elementwise on 2 of 12. The same runs (the commands are sink_gates.py's, so its
trained runs are reused: `--out` its output directory), four seeds of the baseline, G1
elementwise and G1 headwise. Each is evaluated three ways on 16 held-out documents of the task
generated at 513 tokens (4x the training length): the full cache (`full`), and streamed token by
token (StreamingLLM's perplexity evaluation) through 64 slots holding the last 64 tokens alone
(`window`: BOS is evicted at position 64) or BOS and the next 3 tokens plus the last 60
(`sinks`, StreamingLLM's four sink tokens, the same memory); positions by place in the cache.
The task needs only the last few tokens (the bigram and the token before a trigger), so a
window loses nothing the task needs: whatever the loss rises by once BOS is evicted is the price
of the sink. experiments/inference.py adds the quantized evaluations and the paired statistics.
"""

from experiments import inference_text, sink_gates

SEEDS = [0, 1, 2, 3]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
OVERRIDES = dict(sink_gates.OVERRIDES)
COLUMNS = ['val_loss', 'f_attn_layers', 'f_attn_max', 'sink_seeds', 'm_act_mean', 'm_act_ratio',
           'm_act_bos', 'gate_score_mean']
PER_SEED = ['f_attn_max']
LONG_CONTEXT = dict(inference_text.LONG_CONTEXT)   # the same three caches as on natural text
LONG_CONTEXT_OVERRIDES = {
    'long_context.lengths': '64,128,256,512',
    'long_context.docs': 16,
    'long_context.batch_size': 8,
    'long_context.chunk': 64,
    'long_context.examples': 0,
}
# experiments/inference.py: --mode=quantization of every run, as on natural text
QUANTIZATION = dict(inference_text.QUANTIZATION)
