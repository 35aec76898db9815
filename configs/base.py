"""Shared base config: every variant file starts from `get_config(scale)`.

Scales (the config-string argument, `configs/g1_elementwise.py:<scale>`):
  tiny            a dense model that trains on a 2-core CPU in minutes (the default)
  dense_1p7b_28l  the paper's 1.7B dense model, 28 layers
  dense_1p7b_48l  the paper's 1.7B dense model, 48 layers
  moe_15a2b       the paper's 15B-total / 2B-active MoE (128 experts, top-8)
  moe_tiny        a CPU-sized MoE (8 experts, top-2)
  dense_90m       a 90M-parameter dense model at context 2048 for one accelerator (the sink at
                  accelerator scale: experiments/sink_accelerator.py); needs a BPE tokenizer
"""

import ml_collections

SCALES = ('tiny', 'dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b', 'moe_tiny', 'dense_90m')
QWEN_VOCAB = 151_936


def gate_config() -> ml_collections.ConfigDict:
  """The gate spec. `position='none'` is the ungated baseline (see gating.py)."""
  return ml_collections.ConfigDict(dict(
      position='none',          # none | g1 (SDPA out) | g2 (value) | g3 (key) | g4 (query) | g5 (W_O out)
      kind='gate',              # gate | rmsnorm (per-head RMSNorm of Y) | silu_noparam (SiLU(Y)); the last two G1 only
      granularity='elementwise',  # elementwise | headwise (one scalar per head)
      head_shared=False,        # average the per-head gate over heads and apply it to every head
      shared_reduce='score',    # head-shared: average post-activation scores ('score') or logits ('logit')
      mode='multiplicative',    # multiplicative: Y * act(XW) | additive: Y + act(XW)
      activation='sigmoid',     # sigmoid | silu | ns_sigmoid (0.5 + 0.5 sigmoid) | identity
      input_dependent=True,     # False: a learnable zero-initialised parameter, no dependence on X
      after_qk_norm_rope=False,  # G3/G4 only: gate after QK-norm and RoPE instead of on the projection
  ))


def moe_config() -> ml_collections.ConfigDict:
  """Mixture-of-Experts settings. `num_experts=0` is a dense FFN."""
  return ml_collections.ConfigDict(dict(
      num_experts=0,
      top_k=0,
      expert_ffn_size=0,
      num_shared_experts=0,
      renormalize=False,        # renormalise the selected top-k probabilities to sum to 1
      lb_loss_coef=1e-3,
      lb_loss_type='global',    # global (statistics over the whole global batch) | sequence
      router_z_loss_coef=1e-3,
      dispatch='dropless',      # dropless (sorted tokens + ragged_dot) | capacity
      capacity_factor=1.25,
      # dropless grouped expert matmuls: auto (megablox on TPU meshes, else ragged_dot) |
      # ragged_dot | megablox (Pallas TPU kernels; ragged_dot's weight gradient is dense over all
      # experts on TPU). megablox tiles K/N by 128s, or whole when not a multiple of 128 (<= 2048).
      grouped_matmul='auto',
  ))


def model_config(scale: str) -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict(dict(
      vocab_size=384,
      num_layers=4,
      hidden_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=32,
      ffn_size=384,
      ffn_match_baseline=False,  # dense: narrow the FFN so a gated model keeps the baseline's size
      tie_embeddings=True,
      qk_norm=True,
      sandwich_norm=False,
      norm_eps=1e-6,
      rope_base=10_000.0,
      rope_scaling=ml_collections.ConfigDict(dict(
          type='none',          # none | yarn (filled in by the long-context work)
          factor=1.0,
          original_max_len=4096,
      )),
      init_std=0.02,
      dtype='float32',          # compute dtype; params are always float32
      # none | full | save_attention (full, but keep the splash kernel's output and
      # log-sum-exp) | dots (save matmul outputs) | dots_no_batch
      remat='none',
      # True: the blocks run in a loop (nnx.scan over the stacked [L, ...] parameters), so a
      # 48-layer model compiles like a 1-layer one. False: the same scan unrolled, one copy of the
      # block per layer: XLA fuses and schedules across layers and keeps no stacked per-layer
      # buffers (on CPU, 2 cores: ~10% faster steps for the 4-layer models of benchmarks/
      # shapes.py, same compile time); compile time grows with depth, so the paper's scales scan.
      # Parameters and checkpoints are the same either way.
      scan_layers=True,
      # auto (splash on TPU, cudnn on GPU where they fit, chunked / blockwise on CPU, else xla)
      # | xla | cudnn | splash (Pallas, TPU) | blockwise (pure-JAX online softmax) | chunked
      # (pure-JAX causal query chunks); gated_attention/model/attention_kernels.py
      attention_impl='auto',
      attention_block_q=0,      # splash / blockwise query tile, chunked query chunk (0: 512
                                # splash, 128 blockwise and chunked)
      attention_block_kv=0,     # splash / blockwise key tile; both divide data.seq_len (splash:
                                # multiples of 128); capped at data.seq_len
      attention_fused_bwd=True,  # splash: one backward kernel (dq, dk, dv) instead of two
      gate=gate_config(),
      # G1 sigmoid multiplicative gates computed from X (gate.position='g1', headwise or
      # elementwise, not head-shared): one matmul yields the queries and the gate's logits, as the
      # authors build it (gating.py); False: a separate projection (same numbers in float32).
      # Other gates always use the separate path.
      fused_gate_projection=True,
      moe=moe_config(),
  ))
  if scale == 'tiny':
    m.update(scan_layers=False)
  elif scale == 'dense_1p7b_28l':
    m.update(vocab_size=QWEN_VOCAB, num_layers=28, hidden_size=2048, num_heads=16,
             num_kv_heads=8, head_dim=128, ffn_size=6144, tie_embeddings=True,
             dtype='bfloat16', remat='save_attention')
  elif scale == 'dense_1p7b_48l':
    m.update(vocab_size=QWEN_VOCAB, num_layers=48, hidden_size=1536, num_heads=16,
             num_kv_heads=8, head_dim=128, ffn_size=4608, tie_embeddings=True,
             dtype='bfloat16', remat='save_attention')
  elif scale == 'moe_15a2b':
    m.update(vocab_size=QWEN_VOCAB, num_layers=24, hidden_size=2048, num_heads=32,
             num_kv_heads=4, head_dim=128, ffn_size=0, tie_embeddings=False,
             dtype='bfloat16', remat='save_attention')
    m.moe.update(num_experts=128, top_k=8, expert_ffn_size=768)
  elif scale == 'moe_tiny':
    m.update(ffn_size=0, tie_embeddings=False)
    m.moe.update(num_experts=8, top_k=2, expert_ffn_size=96)
  elif scale == 'dense_90m':  # GPT-2-small-like, Qwen-style (GQA 12/4, QK-norm, SwiGLU)
    m.update(vocab_size=16_384, num_layers=12, hidden_size=768, num_heads=12, num_kv_heads=4,
             head_dim=64, ffn_size=2048, tie_embeddings=True, dtype='bfloat16')
  else:
    raise ValueError(f'Unknown scale {scale!r}; choose one of {", ".join(SCALES)} '
                     '(for example configs/g1_elementwise.py:tiny).')
  return m


def data_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      source='builtin',         # builtin | text | jsonl | arrayrecord | parquet | hf | synthetic
      path='',                  # glob for text/jsonl/arrayrecord/parquet; dataset name for hf
      hf_config='',             # hf: dataset config name
      hf_split='train',
      text_field='text',        # jsonl/parquet/hf/arrayrecord(JSON records) field with the text
      tokenizer='byte',         # byte | path to a HF tokenizer.json | path to a sentencepiece .model
      seq_len=128,
      val_fraction=0.01,        # held-out documents (by a hash of their index)
      val_batches=4,            # batches in one validation pass
      shuffle_buffer=1024,
      worker_count=0,
      document_mask=False,      # attend only within each document of a packed window (from BOS)
      device_prefetch=2,        # batches read and put on the devices ahead of the step (0: none)
      # RULER-style task documents mixed into the training documents (input_pipeline/ruler.py):
      mix_tasks='',             # comma-separated task names, or 'all' ('': none)
      mix_ratio=0.0,            # share of the training tokens in task documents (0: off)
      mix_tokens=0,             # tokens per task document, BOS included (0: data.seq_len / 2)
      task='bigram_backcopy',   # source=synthetic: bigram_backcopy | icl_bigram (see synthetic.py)
      synthetic=ml_collections.ConfigDict(dict(  # source=synthetic; data.tokenizer is not used
          vocab=64,             # regular tokens (ids 0..vocab-1); BOS is id vocab
          triggers=3,           # trigger tokens among them
          branching=8,          # successors per token in the random bigram transition matrix
          doc_len=0,            # tokens per document, BOS included (0: seq_len + 1, one per window)
          task_seed=0,          # draws the triggers and transition matrix (config.seed: the data)
      )),
  ))


def train_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      steps=600,
      batch_size=16,            # global batch, in sequences
      grad_accum=1,             # micro-batches per step (batch_size must divide)
      learning_rate=3e-3,
      min_learning_rate=3e-5,
      warmup_steps=60,
      b1=0.9,
      b2=0.95,
      eps=1e-8,
      weight_decay=0.1,
      grad_clip=1.0,
      z_loss=0.0,               # logits z-loss coefficient
      loss_chunk_size=0,        # >0: cross-entropy over sequence chunks of this many tokens,
                                # rematerialised, so the [B, T, V] logits never exist at once
      log_every=20,
      eval_every=200,
      inspect_batch_size=8,     # sequences for the F-Attn / M-Act / gate metrics at each eval
      checkpoint_every=200,
      keep_checkpoints=3,       # the latest ones; the best by the running loss is kept besides
      init_from='',             # a run directory: start from its latest parameters (fresh
                                # optimizer and data), e.g. to fine-tune on other data
      # Stability (gated_attention/training/stability.py): non-finite steps are skipped (parameters and
      # optimizer state unchanged); loss spikes are detected and logged.
      nonfinite_max_in_a_row=10,  # skipped non-finite steps in a row that make a failure
      spike_window=50,          # steps of the running loss level (and of the warm-up)
      spike_threshold=6.0,      # a spike: loss above the level by this many mean deviations...
      spike_min_ratio=1.1,      # ... and by at least this factor
      uniform_ratio=1.5,        # ... or above this multiple of ln(vocab) (worse than guessing)
      divergence_steps=100,     # spike steps in a row that make a divergence (a failure)
      on_failure='halt',        # halt | rollback (to the best checkpoint, learning rate scaled)
      rollback_lr_factor=0.5,
      max_rollbacks=3,
  ))


def long_context_config() -> ml_collections.ConfigDict:
  """--mode=long_context options (gated_attention/inference/long_context.py)."""
  return ml_collections.ConfigDict(dict(
      lengths='',               # comma-separated lengths in tokens ('': 1, 2, 4, 8 x data.seq_len)
      tasks='all',              # RULER-style tasks (input_pipeline/ruler.py), comma-separated; '' none
      examples=16,              # prompts per task and length
      docs=8,                   # held-out documents (of at least the largest length) for the loss
      batch_size=8,             # sequences per forward pass
      chunk=256,                # tokens per cached attention chunk: [chunk, length] scores per head
      seed=0,                   # draws the RULER prompts
      step=-1,                  # checkpoint step (-1: the latest)
      tag='',                   # the output directory RUN/long_context/<tag> ('': the RoPE setting)
  ))


def analysis_config() -> ml_collections.ConfigDict:
  """--mode=analyze options (gated_attention/analysis/analyze.py)."""
  return ml_collections.ConfigDict(dict(
      num_batches=0,            # held-out batches (0: data.val_batches)
      batch_size=0,             # sequences per batch (0: train.batch_size)
      attn_map_layers='',       # comma-separated layers for attention_maps.png ('': first, middle, last)
      step=-1,                  # checkpoint step (-1: the latest)
  ))


def system_configs() -> dict:
  """The mesh, --mode=analyze, multi-host and --mode=memory sections."""
  return dict(
      mesh=ml_collections.ConfigDict(dict(
          data=-1, fsdp=1, tensor=1, expert=1,
          dcn_data=1,               # slices/hosts split over the data axis (multi-slice)
          rules='data_parallel',    # data_parallel | fsdp | fsdp_tensor | fsdp_expert
      )),
      analysis=analysis_config(),
      long_context=long_context_config(),
      distributed=ml_collections.ConfigDict(dict(
          coordinator_address='',   # empty: from the environment (or single process)
          num_processes=0,
          process_id=-1,
          local_device_ids='',      # comma-separated local device ids of this process ('' = all)
          initialization_timeout=300,  # seconds to wait for every process to join
      )),
      memory=ml_collections.ConfigDict(dict(
          num_devices=0,            # --mode=memory: devices to plan the mesh for (0: those present)
          device_memory_gib=0.0,    # --mode=memory: per-device memory to fit (0: the device's own)
      )),
  )


PAPER_SCALES = ('dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b')


def _paper_recipe(c: ml_collections.ConfigDict):
  """The paper's training recipe (Qiu et al. 2025, Sec. 3 / Appendix): 4096-token sequences,
  batch 1024, 1k warm-up steps, cosine to 3e-5; FSDP over all devices."""
  c.data.seq_len = 4096
  c.data.tokenizer = ''         # must be set to Qwen's tokenizer.json for these scales
  c.train.update(batch_size=1024, steps=100_000, warmup_steps=1000, loss_chunk_size=512,
                 learning_rate=4e-3 if c.scale.startswith('dense') else 2e-3,
                 min_learning_rate=3e-5, eval_every=1000, checkpoint_every=1000, log_every=10)
  c.mesh.update(data=1, fsdp=-1, rules='fsdp')


def _accelerator_recipe(c: ml_collections.ConfigDict):
  """dense_90m: 32 x 2048 tokens per step, 4,000 steps (262M tokens), AdamW 1e-3 (500 warm-up
  steps, cosine to 1e-4); a BPE tokenizer trained on the corpus (input_pipeline/bpe.py)."""
  c.data.update(seq_len=2048, tokenizer='', source='builtin_large')
  c.train.update(batch_size=32, steps=4000, warmup_steps=500, learning_rate=1e-3,
                 min_learning_rate=1e-4, eval_every=500, checkpoint_every=1000, log_every=50)


def get_config(scale: str = 'tiny') -> ml_collections.ConfigDict:
  scale = scale or 'tiny'
  c = ml_collections.ConfigDict()
  c.variant = 'baseline'
  c.scale = scale
  c.seed = 0
  c.model = model_config(scale)
  c.data = data_config()
  c.train = train_config()
  c.update(system_configs())
  if scale in PAPER_SCALES:
    _paper_recipe(c)
  if scale == 'dense_90m':
    _accelerator_recipe(c)
  return c


def _overlay(defaults: dict, saved: dict) -> dict:
  out = dict(defaults)
  for k, v in saved.items():
    out[k] = _overlay(defaults[k], v) if isinstance(v, dict) and isinstance(
        defaults.get(k), dict) else v
  return out


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """A run's saved config (config.json), with fields added to this file since then set to their
  defaults, so runs written by an older version of the code still open."""
  scale = saved.get('scale', 'tiny')
  defaults = get_config(scale if scale in SCALES else 'tiny').to_dict()
  return ml_collections.ConfigDict(_overlay(defaults, saved))
