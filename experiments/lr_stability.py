"""Learning-rate tolerance with seeds: baseline, G1 elementwise and headwise, deep, narrow, no QK-norm

The paper's stability claim (Qiu et al. 2025, Sec. 3, Fig. 1; Sec. 4.1): the gated model trains
without the baseline's loss spikes and at learning rates where the baseline diverges (the
1.7B-48L baseline diverges at 8e-3, batch 4096, where the gated model trains). The one-seed
experiment (experiments/lr_tolerance.py: 4 layers, hidden 128, QK-norm, natural text) saw no
divergence boundary between the variants. Here the setting the paper's observation points to:
depth against width (8 layers of width 64, 2 heads of 32, SwiGLU 192; 452k parameters;
the elementwise gate adds 33k, the headwise 1k; the FFN is not narrowed), QK-norm off (its effect is experiments/lr_stability_qknorm.py), on
the Bigram-Backcopy task (vocab 32, 4 triggers, branching 3, task seed 0: optimal loss 0.547,
unigram entropy 2.796), so that a run that trains and one that fails are far apart in loss,
where on the built-in text a 12-layer model of width 64 trained for 200 steps ended near the
unigram entropy at every rate (pilots below). 200 steps of 8 x 64 tokens, AdamW (b2 0.95, weight
decay 0.1, gradient clipping at 1.0), 20 warm-up steps to the peak rate, then cosine decay to
3e-5; four seeds (the initialisation and the data order) at each peak rate. The grid first
ran from 0.1 to 3.0; 0.01 and 0.03 were added after it (the baseline's lowest loss was at its
lowest rate, 0.1), so that each variant's best rate lies inside the grid.
A run "fails to train" when the guard halts it (100 spike steps in a row, or 10 non-finite steps
in a row; gated_attention/training/stability.py) or when its final validation loss is above the
task's unigram entropy (DIVERGED_ABOVE: it learnt less than the token frequencies). "Spike
steps" are the guard's (loss far above its running level, or above 1.5 ln(vocab) = 5.24).
Pilots (one seed, this machine under load; /tmp, not committed): on text, 12 layers of width 64,
200 steps, val loss 3.04 / 3.25 / 3.45 at 1e-2 / 3e-2 / 1e-1 (baseline), 3.29 / 3.37 at 3e-2 /
1e-1 (G1 elementwise), against a unigram entropy of 3.24; on this task with 128-token sequences
and batch 16 the baseline trained at 0.1 (0.754); at this setting the baseline at 0.3 ended at
1.952 without a spike and G1 elementwise at 0.747, and at 1.0 both variants' loss rose above 9 nats during the warm-up
(baseline 4 spike steps, G1 elementwise 5), the baseline recovering to 2.138, G1 elementwise to
1.312. ~40 s a run on the 2-core machine shared with other jobs.
"""

SEEDS = [0, 1, 2, 3]
VARIANTS = ['baseline', 'g1_elementwise', 'g1_headwise']
GRID = {'train.learning_rate': [0.01, 0.03, 0.1, 0.3, 1.0, 2.0, 3.0]}
OVERRIDES = {
    'data.source': 'synthetic',
    'data.task': 'bigram_backcopy',
    'data.synthetic.vocab': 32,
    'data.synthetic.triggers': 4,
    'data.synthetic.branching': 3,
    'data.seq_len': 64,
    'model.num_layers': 8,
    'model.hidden_size': 64,
    'model.num_heads': 2,
    'model.num_kv_heads': 2,
    'model.head_dim': 32,
    'model.ffn_size': 192,
    'model.qk_norm': False,
    'train.steps': 200,
    'train.batch_size': 8,
    'train.warmup_steps': 20,
    'train.log_every': 10,
    'train.eval_every': 100,
    'train.checkpoint_every': 100,
}
STABILITY = True
DIVERGED_ABOVE = 2.796   # the task's unigram entropy (task seed 0; data_description of a run)
COLUMNS = ['val_loss', 'train_loss', 'loss_spikes', 'f_attn_max', 'm_act_mean',
           'gate_score_mean', 'train_minutes']
PER_SEED = ['val_loss']
