"""Shared base config: every variant file starts from `get_config(scale)`.

Scales (the config-string argument, `configs/g1_elementwise.py:<scale>`):
  tiny            a dense model that trains on a 2-core CPU in minutes (the default)
  dense_1p7b_28l  the paper's 1.7B dense model, 28 layers
  dense_1p7b_48l  the paper's 1.7B dense model, 48 layers
  moe_15a2b       the paper's 15B-total / 2B-active MoE (128 experts, top-8)
  moe_tiny        a CPU-sized MoE (8 experts, top-2)
  dense_90m       a 90M-parameter dense model at context 2048 for one accelerator (the sink at
                  accelerator scale: experiments/sink_accelerator.py); needs a BPE tokenizer

The `model` section is declared once, by the dataclasses that the model takes (ModelConfig in
gated_attention/model/config.py, with GateSpec, MoESpec and RopeScaling): their fields, defaults
and comments are the section's keys, defaults and documentation, and their metadata says what a
saved run may change; `model_config` adds each scale's values. The other sections are declared
here, with the fields that a run directory fixes marked (`_iterator`, `_checkpoint`).
"""

import copy
from typing import NamedTuple

import ml_collections
from absl import logging

from gated_attention.errors import ConfigError
from gated_attention.model import config as model_lib
from gated_attention.model.gating import GateSpec
from gated_attention.model.moe import MoESpec

SCALES = ('tiny', 'dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b', 'moe_tiny', 'dense_90m')
QWEN_VOCAB = 151_936


# What a run directory's saved config fixes, beside the model's structure (whose fields say it
# in their metadata, gated_attention/model/config.py): the fields below marked
#   _iterator(...)    the data iterator's saved position depends on it: a resumption may not
#                     change it (a warm start, train.init_from, which has no saved position, may);
#   _checkpoint(...)  the checkpoint depends on it (the tokenizer its embeddings were trained on):
#                     a run may not continue with another value, an evaluation may not use one.
# runs/rundir.py reads the lists from `fixed_fields`.
ITERATOR = 'iterator'
CHECKPOINT = 'checkpoint'


class _Fixed(NamedTuple):
  value: object
  by: str


def _iterator(value):
  return _Fixed(value, ITERATOR)


def _checkpoint(value):
  return _Fixed(value, CHECKPOINT)


def _build(fields: dict) -> ml_collections.ConfigDict:
  """The ConfigDict of a declaration (values unwrapped from _iterator / _checkpoint)."""
  return ml_collections.ConfigDict({
      k: _build(v) if isinstance(v, dict) else v.value if isinstance(v, _Fixed) else v
      for k, v in fields.items()})


def _marks(fields: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in fields.items():
    if isinstance(v, _Fixed):
      out[prefix + k] = v.by
    elif isinstance(v, dict):
      out.update(_marks(v, f'{prefix}{k}.'))
  return out


def fixed_fields(by: str) -> tuple[str, ...]:
  """The dotted config paths marked `by` (ITERATOR or CHECKPOINT) outside `model`; a marked
  section (data.synthetic) is one path."""
  marks = _marks(dict(_run_fields('tiny'), train=_train_fields(), data=_data_fields()))
  return tuple(path for path, mark in marks.items() if mark == by)


def gate_config() -> ml_collections.ConfigDict:
  """The gate spec: GateSpec's fields and defaults (gating.py documents each);
  `position='none'` is the ungated baseline."""
  return ml_collections.ConfigDict(model_lib.config_defaults(GateSpec)[0])


def moe_config() -> ml_collections.ConfigDict:
  """Mixture-of-Experts settings: MoESpec's fields and defaults (moe.py documents each).
  `num_experts=0` is a dense FFN."""
  return ml_collections.ConfigDict(model_lib.config_defaults(MoESpec)[0])


def model_config(scale: str) -> ml_collections.ConfigDict:
  """The `model` section: ModelConfig's fields and defaults (gated_attention/model/config.py
  declares and documents each, with the gate, MoE and RoPE-scaling sections and what a saved
  run may change), then the scale's values."""
  m = ml_collections.ConfigDict(model_lib.config_defaults()[0])
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


def _data_fields() -> dict:
  return dict(
      # builtin | text | jsonl | arrayrecord | parquet | hf | synthetic | tokenized
      source=_iterator('builtin'),
      # glob for text/jsonl/arrayrecord/parquet (local or gs://); dataset name for hf; the folder
      # of --mode=tokenize's shards for tokenized
      path=_iterator(''),
      hf_config=_iterator(''),  # hf: dataset config name
      hf_split=_iterator('train'),
      # jsonl/parquet/hf/arrayrecord(JSON records) field with the text
      text_field=_iterator('text'),
      # byte | path to a HF tokenizer.json | path to a sentencepiece .model
      tokenizer=_checkpoint('byte'),
      seq_len=_iterator(128),
      val_fraction=_iterator(0.01),  # held-out documents (by a hash of their index)
      val_batches=4,            # batches in one validation pass
      shuffle_buffer=_iterator(1024),
      worker_count=0,
      shard_documents=65536,    # --mode=tokenize: documents per shard (input_pipeline/tokenized.py)
      document_mask=False,      # attend only within each document of a packed window (from BOS)
      device_prefetch=2,        # batches read and put on the devices ahead of the step (0: none)
      # RULER-style task documents mixed into the training documents (input_pipeline/ruler.py):
      mix_tasks=_iterator(''),  # comma-separated task names, or 'all' ('': none)
      mix_ratio=_iterator(0.0),  # share of the training tokens in task documents (0: off)
      mix_tokens=_iterator(0),  # tokens per task document, BOS included (0: data.seq_len / 2)
      # source=synthetic: bigram_backcopy | icl_bigram | mqar (see synthetic.py)
      task=_iterator('bigram_backcopy'),
      synthetic=_iterator(dict(  # source=synthetic; data.tokenizer is not used
          vocab=64,             # regular tokens (ids 0..vocab-1); BOS is id vocab
          triggers=3,           # trigger tokens among them
          branching=8,          # successors per token in the random bigram transition matrix
          doc_len=0,            # tokens per document, BOS included (0: seq_len + 1, one per window)
          task_seed=0,          # draws the triggers and transition matrix (config.seed: the data)
          copy_share=0.0,       # share of targets that follow a trigger (0: the chain decides)
          # task=mqar (multi-query associative recall): the vocab's first key_tokens ids are
          # keys, the next value_tokens values, the rest filler
          pairs=8,              # key-value pairs after BOS (each document's own map)
          key_tokens=16,
          value_tokens=16,
          query_rate=0.25,      # share of the haystack's tokens that are query keys (in (0, 0.5])
          filler='uniform',     # uniform | skip_bigram (from the row of the token two back,
                                # `branching` successors each)
      )),
  )


def data_config() -> ml_collections.ConfigDict:
  return _build(_data_fields())


def _train_fields() -> dict:
  return dict(
      steps=600,
      batch_size=_iterator(16),  # global batch, in sequences
      grad_accum=1,             # micro-batches per step (batch_size must divide)
      seeds_program='auto',     # main.py --seeds: 'unrolled' (each seed's step in one program:
                                # bitwise a separate run's), 'vmap' (one batched step: float32
                                # rounding apart), 'auto' (unrolled on CPU, vmap on accelerators)
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
  )


def train_config() -> ml_collections.ConfigDict:
  return _build(_train_fields())


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


def _run_fields(scale: str) -> dict:
  return dict(
      variant='baseline',
      scale=scale,
      seed=_iterator(0),        # the parameters' initialisation and the data order
      compilation_cache='',     # JAX's persistent compilation cache: a directory shared by runs
                                # of the same shapes ('': off; gated_attention/compilation_cache.py)
  )


def get_config(scale: str = 'tiny') -> ml_collections.ConfigDict:
  scale = scale or 'tiny'
  c = _build(_run_fields(scale))
  c.model = model_config(scale)
  c.data = data_config()
  c.train = train_config()
  c.update(system_configs())
  if scale in PAPER_SCALES:
    _paper_recipe(c)
  if scale == 'dense_90m':
    _accelerator_recipe(c)
  return c


# Keys that earlier versions of this code wrote to config.json and this version no longer has,
# with what opening such a run does: ('rename', 'new.path') moves the value there (unless the
# saved config has the new key too), ('drop', 'why') forgets it. Every field since the first
# config (configs/base.py's git history up to the packages reorganisation) still exists: the
# table is empty. A change that renames or removes a field adds its row here, so the run
# directories saved before it still open; any other unknown key is refused (from_saved).
RETIRED_KEYS: dict[str, tuple[str, str]] = {}
# Sections that other code adds to a run's config, kept as saved: the Hugging Face source of an
# --mode=import run (gated_attention/runs/hf/hf_config.py).
EXTRA_SECTIONS = ('hf',)


def _overlay(defaults: dict, saved: dict) -> dict:
  out = dict(defaults)
  for k, v in saved.items():
    out[k] = _overlay(defaults[k], v) if isinstance(v, dict) and isinstance(
        defaults.get(k), dict) else v
  return out


def _unknown_keys(defaults: dict, saved: dict, prefix: str = '') -> list[str]:
  out = []
  for k, v in saved.items():
    if k not in defaults:
      out.append(prefix + k)
    elif isinstance(v, dict) and isinstance(defaults[k], dict):
      out += _unknown_keys(defaults[k], v, f'{prefix}{k}.')
  return out


def _upgrade(saved: dict, source: str) -> dict:
  """`saved` with the RETIRED_KEYS it holds renamed or dropped."""
  saved = copy.deepcopy(saved)

  def parent(path, create=False):
    node = saved
    for part in path.split('.')[:-1]:
      if create and isinstance(node, dict):
        node.setdefault(part, {})
      if not isinstance(node, dict) or part not in node:
        return None
      node = node[part]
    return node if isinstance(node, dict) else None

  for path, (action, arg) in RETIRED_KEYS.items():
    node, key = parent(path), path.split('.')[-1]
    if node is None or key not in node:
      continue
    value = node.pop(key)
    if action == 'rename':
      new_parent, new_key = parent(arg, create=True), arg.split('.')[-1]
      if new_parent is not None:
        new_parent.setdefault(new_key, value)
      logging.info('%s: the retired key %s is now %s.', source, path, arg)
    elif action == 'drop':
      logging.warning('%s: the retired key %s (= %r) is ignored: %s', source, path, value, arg)
    else:
      raise ValueError(f'configs/base.py RETIRED_KEYS[{path!r}]: unknown action {action!r} '
                       '(rename | drop).')
  return saved


def from_saved(saved: dict, source: str = 'the saved config.json') -> ml_collections.ConfigDict:
  """A run's saved config (config.json), with fields added to this file since then set to their
  defaults and the keys retired since then (RETIRED_KEYS) upgraded, so runs written by an older
  version of the code still open. A key that this code does not know otherwise is refused by
  name (ConfigError): a config written by a newer version or edited by hand would run with
  some of its settings ignored. `source` names the file in messages."""
  saved = _upgrade(saved, source)
  scale = saved.get('scale', 'tiny')
  defaults = get_config(scale if scale in SCALES else 'tiny').to_dict()
  unknown = _unknown_keys(defaults, {k: v for k, v in saved.items() if k not in EXTRA_SECTIONS})
  if unknown:
    raise ConfigError(
        f'{source} has key(s) that this version of the code does not know: '
        f'{", ".join(unknown)}. It was written by other code (a newer version, or edited by '
        'hand); open it with that code, or remove those keys from the file. (A key that this '
        'code renamed or removed belongs in configs/base.py RETIRED_KEYS, so that older runs '
        'still open.)')
  return ml_collections.ConfigDict(_overlay(defaults, saved))
