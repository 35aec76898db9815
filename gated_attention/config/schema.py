"""The run config's one schema: every section, field, default and comment, declared once.

    config = scales.get_config('tiny')     # a ConfigDict built from these defaults (scales.py)
    schema.check(config, where='--config') # unknown keys and values of the wrong kind, by name

A run's config (an ml_collections ConfigDict, saved as RUN/config.json) has the sections below.
The `model` section is declared by the dataclasses the model takes (ModelConfig in
gated_attention/model/config.py, with GateSpec, MoESpec and RopeScaling); every other section is
a frozen dataclass here. A field's comment is its documentation; its metadata says what a saved
run may change (runs/rundir.py reads it through `fixed_fields` and model_config.free_fields):

  model fields    fixed by the checkpoint unless marked free (FREE_ON_RESUME: a resumption may
                  change them; FREE_IN_EVALUATION: an evaluation may);
  other fields    free unless marked `_iterator` (the data iterator's saved position depends on
                  it: a resumption may not change it; a warm start, train.init_from, may) or
                  `_checkpoint` (the checkpoint depends on it, the tokenizer its embeddings were
                  trained on: a run may not continue with another value, an evaluation may not
                  use one).

`check` refuses, when a run starts, any key that is no field here (a misspelt `c.train.stepz` in
a variant file, which ml_collections accepts) and any value of another kind than its default.
"""

import dataclasses
import difflib
import json

from gated_attention.errors import ConfigError
from gated_attention.model import config as model_lib

ITERATOR = 'iterator'
CHECKPOINT = 'checkpoint'
# Sections that other code adds to a run's config, kept as saved: the Hugging Face source of an
# --mode=import run (gated_attention/runs/hf/hf_config.py).
EXTRA_SECTIONS = ('hf',)


# Fields that take the word 'auto' besides a value of their default's kind (the command line's
# --config.train.grad_accum=auto): `allow_auto` lets a ConfigDict hold either.
AUTO = 'auto'
AUTO_FIELDS = ('train.grad_accum',)


def allow_auto(config):
  """`config` (a ConfigDict) with each of AUTO_FIELDS able to hold 'auto' as well as a number
  (ml_collections types a field by its first value, and parses an override by that type)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  for path in AUTO_FIELDS:
    section, _, key = path.rpartition('.')
    holder = config
    for part in section.split('.'):
      holder = holder.get(part) if holder is not None else None
    if holder is not None and key in holder:
      value = holder[key]
      locked = holder.is_locked
      if locked:
        holder.unlock()
      del holder[key]
      holder[key] = ml_collections.FieldReference(value, field_type=object)
      if locked:
        holder.lock()
  return config


def is_auto(value) -> bool:
  return isinstance(value, str) and value == AUTO


def _iterator(default):
  return dataclasses.field(default=default, metadata={'fixed': ITERATOR})


def _checkpoint(default):
  return dataclasses.field(default=default, metadata={'fixed': CHECKPOINT})


def _entries(spec, fixed: str | None = None):
  """A field holding named entries ({name: section}), each a section of the dataclass `spec`
  (data.mixture: {'web': {...}, 'code': {...}}); empty by default."""
  metadata = {'entries': spec} if fixed is None else {'entries': spec, 'fixed': fixed}
  return dataclasses.field(default_factory=dict, metadata=metadata)


def _section(spec, fixed: str | None = None):
  """A field holding a section whose keys are the fields of the dataclass `spec`."""
  metadata = {'section': spec} if fixed is None else {'section': spec, 'fixed': fixed}
  return dataclasses.field(default_factory=spec, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Synthetic:
  """data.synthetic: the synthetic tasks' settings (source=synthetic; input_pipeline/synthetic.py
  documents each task). data.tokenizer is not used."""
  vocab: int = 64             # regular tokens (ids 0..vocab-1); BOS is id vocab
  triggers: int = 3           # trigger tokens among them
  branching: int = 8          # successors per token in the random bigram transition matrix
  doc_len: int = 0            # tokens per document, BOS included (0: seq_len + 1, one per window)
  task_seed: int = 0          # draws the triggers and transition matrix (config.seed: the data)
  copy_share: float = 0.0     # share of targets that follow a trigger (0: the chain decides)
  # task=mqar (multi-query associative recall): the vocab's first key_tokens ids are keys, the
  # next value_tokens values, the rest filler
  pairs: int = 8              # key-value pairs after BOS (each document's own map)
  key_tokens: int = 16
  value_tokens: int = 16
  query_rate: float = 0.25    # share of the haystack's tokens that are query keys (in (0, 0.5])
  filler: str = 'uniform'     # uniform | skip_bigram (from the row of the token two back,
                              # `branching` successors each)


@dataclasses.dataclass(frozen=True)
class MixtureSource:
  """One corpus of data.mixture (docs/mixtures.md): a source as data.source / data.path name one,
  and its weight. '' takes the data section's value."""
  weight: float = 0.0     # its share of the training tokens (normalised over the entries; > 0)
  source: str = ''        # text | jsonl | parquet | arrayrecord | hf | tokenized | builtin ...
  path: str = ''          # its glob, dataset name or tokenized folder (local or gs://)
  text_field: str = ''    # jsonl/parquet/hf/arrayrecord(JSON): the field with the text
  hf_config: str = ''     # hf: dataset config name
  hf_split: str = ''      # hf: split


@dataclasses.dataclass(frozen=True)
class Data:
  """data: where the documents come from, how they become windows of tokens."""
  # builtin | builtin_large | text | jsonl | arrayrecord | parquet | hf | synthetic | tokenized
  source: str = _iterator('builtin')
  # glob for text/jsonl/arrayrecord/parquet (local or gs://); dataset name for hf; the folder of
  # --mode=tokenize's shards for tokenized
  path: str = _iterator('')
  hf_config: str = _iterator('')          # hf: dataset config name
  hf_split: str = _iterator('train')
  text_field: str = _iterator('text')     # jsonl/parquet/hf/arrayrecord(JSON) field with the text
  # byte | path to a HF tokenizer.json | path to a sentencepiece .model
  tokenizer: str = _checkpoint('byte')
  seq_len: int = _iterator(128)
  val_fraction: float = _iterator(0.01)   # held-out documents (by a hash of their index)
  val_batches: int = 4                    # batches in one validation pass
  shuffle_buffer: int = _iterator(1024)
  worker_count: int = 0
  shard_documents: int = 65536  # --mode=tokenize: documents per shard (input_pipeline/tokenized.py)
  document_mask: bool = False   # attend only within each document of a packed window (from BOS)
  device_prefetch: int = 2      # batches read and put on the devices ahead of the step (0: none)
  # RULER-style task documents mixed into the training documents (input_pipeline/ruler.py):
  mix_tasks: str = _iterator('')    # comma-separated task names, or 'all' ('': none)
  mix_ratio: float = _iterator(0.0)  # share of the training tokens in task documents (0: off)
  mix_tokens: int = _iterator(0)    # tokens per task document, BOS included (0: data.seq_len / 2)
  # A weighted mixture of corpora, {name: {weight, source, path, ...}} (MixtureSource; empty:
  # data.source alone). Documents are drawn by weight (input_pipeline/mixture.py, docs/mixtures.md).
  mixture: dict = _entries(MixtureSource, fixed=ITERATOR)
  # source=synthetic: bigram_backcopy | icl_bigram | mqar (input_pipeline/synthetic.py)
  task: str = _iterator('bigram_backcopy')
  synthetic: Synthetic = _section(Synthetic, fixed=ITERATOR)


@dataclasses.dataclass(frozen=True)
class Train:
  """train: the optimizer, the schedule, logging, checkpoints and the stability guard."""
  steps: int = 600
  batch_size: int = _iterator(16)  # global batch, in sequences
  grad_accum: int = 1           # micro-batches per step (batch_size must divide); 'auto':
                                # --mode=train compiles the step on its devices at 1, 2, 4, ...
                                # and takes the first that fits (training/grad_accum.py)
  seeds_program: str = 'auto'   # main.py --seeds: 'unrolled' (each seed's step in one program:
                                # bitwise a separate run's), 'vmap' (one batched step: float32
                                # rounding apart), 'auto' (unrolled on CPU, vmap on accelerators)
  learning_rate: float = 3e-3
  min_learning_rate: float = 3e-5
  warmup_steps: int = 60
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  grad_clip: float = 1.0
  z_loss: float = 0.0           # logits z-loss coefficient
  loss_chunk_size: int = 0      # >0: cross-entropy over sequence chunks of this many tokens,
                                # rematerialised, so the [B, T, V] logits never exist at once
  log_every: int = 20
  eval_every: int = 200
  inspect_batch_size: int = 8   # sequences for the F-Attn / M-Act / gate metrics at each eval
  checkpoint_every: int = 200
  keep_checkpoints: int = 3     # the latest ones; the best by the running loss is kept besides
  stop_timeout: int = 300       # seconds from a stop signal (SIGTERM, Ctrl-C) after which a
                                # process that has not stopped exits anyway (a peer or the
                                # storage that does not answer; training/interrupt.py)
  # A profiler trace (training/profile.py): RUN/profile/, for TensorBoard / XProf and Perfetto.
  profile_steps: int = 0        # steps to trace (0: no trace)
  profile_start: int = 0        # the first traced step (0: the session's third, after compiling)
  profile_processes: str = 'first'  # first (process 0 traces) | all (each process, a file set)
  init_from: str = ''           # a run directory: start from its latest parameters (fresh
                                # optimizer and data), e.g. to fine-tune on other data
  # Stability (gated_attention/training/stability.py): non-finite steps are skipped (parameters
  # and optimizer state unchanged); loss spikes are detected and logged.
  nonfinite_max_in_a_row: int = 10  # skipped non-finite steps in a row that make a failure
  spike_window: int = 50        # steps of the running loss level (and of the warm-up)
  spike_threshold: float = 6.0  # a spike: loss above the level by this many mean deviations...
  spike_min_ratio: float = 1.1  # ... and by at least this factor
  uniform_ratio: float = 1.5    # ... or above this multiple of ln(vocab) (worse than guessing)
  divergence_steps: int = 100   # spike steps in a row that make a divergence (a failure)
  on_failure: str = 'halt'      # halt | rollback (to the best checkpoint, learning rate scaled)
  rollback_lr_factor: float = 0.5
  max_rollbacks: int = 3


@dataclasses.dataclass(frozen=True)
class Mesh:
  """mesh: the device mesh's axis sizes (-1: the devices left) and the sharding rules
  (gated_attention/sharding.py)."""
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  expert: int = 1
  dcn_data: int = 1             # slices/hosts split over the data axis (multi-slice)
  rules: str = 'data_parallel'  # data_parallel | fsdp | fsdp_tensor | fsdp_expert


@dataclasses.dataclass(frozen=True)
class Analysis:
  """analysis: --mode=analyze's options (gated_attention/analysis/analyze.py); 0 / '' mean the
  run's own value. Which checkpoint: --step, as for every mode that opens a run."""
  num_batches: int = 0          # held-out batches (0: data.val_batches)
  batch_size: int = 0           # sequences per batch (0: train.batch_size)
  attn_map_layers: str = ''     # comma-separated layers for attention_maps.png ('': first,
                                # middle, last)


@dataclasses.dataclass(frozen=True)
class LongContext:
  """long_context: --mode=long_context's options (gated_attention/inference/long_context.py);
  which checkpoint: --step."""
  lengths: str = ''             # comma-separated lengths in tokens ('': 1, 2, 4, 8 x data.seq_len)
  tasks: str = 'all'            # RULER-style tasks (input_pipeline/ruler.py), comma-separated
  examples: int = 16            # prompts per task and length
  docs: int = 8                 # held-out documents (of at least the largest length) for the loss
  batch_size: int = 8           # sequences per forward pass
  chunk: int = 256              # tokens per cached attention chunk: [chunk, length] scores a head
  seed: int = 0                 # draws the RULER prompts
  tag: str = ''                 # the output directory RUN/long_context/<tag> ('': the RoPE setting)
  # A sliding-window KV cache (model/kv_cache.py, StreamingLLM): every sequence is streamed
  # token by token through a ring of sinks + window slots, RoPE positions by place in the cache
  window: int = 0               # the last `window` tokens are kept (0: the full cache)
  sinks: int = 0                # ... and the first `sinks` tokens (attention sinks; needs window)


@dataclasses.dataclass(frozen=True)
class Quantization:
  """quantization: --mode=quantization's options (gated_attention/inference/quantized.py);
  which checkpoint: --step."""
  # comma-separated: w8a16, w4a16, w8a8, w4a8, w16a8, w4a4, w16a4 (weights / activations bits)
  settings: str = 'w8a16,w4a16,w8a8,w4a8'
  activations: str = 'tensor,token'  # the 8-bit activations' scales: per tensor, per token
  group_size: int = 128         # int4 weights: one scale per this many inputs of a channel
  num_batches: int = 0          # held-out batches (0: data.val_batches)
  batch_size: int = 0           # sequences per batch (0: train.batch_size)


@dataclasses.dataclass(frozen=True)
class Distributed:
  """distributed: how the processes of a multi-host run find each other (cluster/startup.py)."""
  coordinator_address: str = ''  # empty: from the environment (or single process)
  num_processes: int = 0
  process_id: int = -1
  local_device_ids: str = ''    # comma-separated local device ids of this process ('' = all)
  initialization_timeout: int = 300  # seconds to wait for every process to join
  heartbeat_timeout: int = 100  # seconds without a heartbeat after which a process counts as
                                # lost: the others print what happened and exit (cluster/)
  shutdown_timeout: int = 300   # seconds the processes wait for each other at the end of a run


@dataclasses.dataclass(frozen=True)
class Memory:
  """memory: --mode=memory's plan (gated_attention/compile/memory.py)."""
  num_devices: int = 0          # devices to plan the mesh for (0: those present)
  device_memory_gib: float = 0.0  # per-device memory to fit (0: the device's own)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The whole run config. `variant` and `scale` name the config file and its argument
  (configs/<variant>.py:<scale>); the `model` section is ModelConfig's (model/config.py)."""
  variant: str = 'baseline'
  scale: str = 'tiny'
  seed: int = _iterator(0)      # the parameters' initialisation and the data order
  compilation_cache: str = ''   # JAX's persistent compilation cache: a directory shared by runs
                                # of the same shapes ('': off; gated_attention/compilation_cache.py)
  model: model_lib.ModelConfig = dataclasses.field(
      default=None, metadata={'section': model_lib.ModelConfig})
  data: Data = _section(Data)
  train: Train = _section(Train)
  mesh: Mesh = _section(Mesh)
  analysis: Analysis = _section(Analysis)
  long_context: LongContext = _section(LongContext)
  quantization: Quantization = _section(Quantization)
  distributed: Distributed = _section(Distributed)
  memory: Memory = _section(Memory)


def defaults(spec=RunConfig) -> dict:
  """The section `spec`'s defaults as a nested dict (the whole config's by default); the model
  section's are ModelConfig's (model_config.config_defaults)."""
  if spec is model_lib.ModelConfig:
    return model_lib.config_defaults()[0]
  out = {}
  for f in dataclasses.fields(spec):
    section = f.metadata.get('section')
    if 'entries' in f.metadata:
      out[f.name] = {}
    else:
      out[f.name] = defaults(section) if section else f.default
  return out


def entry_fields() -> dict:
  """{dotted path: dataclass} of the fields that hold named entries (data.mixture), whose every
  value is a section of that dataclass."""
  def walk(spec, prefix):
    for f in dataclasses.fields(spec):
      if 'entries' in f.metadata:
        yield prefix + f.name, f.metadata['entries']
      elif f.metadata.get('section') not in (None, model_lib.ModelConfig):
        yield from walk(f.metadata['section'], f'{prefix}{f.name}.')
  return dict(walk(RunConfig, ''))


def fixed_fields(by: str) -> tuple[str, ...]:
  """The dotted paths outside `model` whose field is marked `by` (ITERATOR or CHECKPOINT); a
  marked section (data.synthetic) is one path."""
  def walk(spec, prefix):
    for f in dataclasses.fields(spec):
      if f.metadata.get('fixed') == by:
        yield prefix + f.name
      elif f.metadata.get('section') not in (None, model_lib.ModelConfig):
        yield from walk(f.metadata['section'], f'{prefix}{f.name}.')
  return tuple(walk(RunConfig, ''))


def unknown_keys(config: dict, known: dict | None = None, prefix: str = '') -> list[str]:
  """The dotted keys of `config` that are no field of the schema (EXTRA_SECTIONS aside)."""
  known = defaults() if known is None else known
  entries = entry_fields()
  out = []
  for k, v in config.items():
    if not prefix and k in EXTRA_SECTIONS:
      continue
    if k not in known:
      out.append(prefix + k)
    elif prefix + k in entries and isinstance(v, dict):
      spec = defaults(entries[prefix + k])
      for name, entry in v.items():
        if isinstance(entry, dict):
          out += unknown_keys(entry, spec, f'{prefix}{k}.{name}.')
    elif isinstance(v, dict) and isinstance(known[k], dict):
      out += unknown_keys(v, known[k], f'{prefix}{k}.')
  return out


def type_errors(config: dict, known: dict | None = None, prefix: str = '') -> list[str]:
  """Where `config`'s values are not of the kind the schema's defaults are (a list for the whole
  config, `"model": null`, a string where a number belongs ...)."""
  known = defaults() if known is None else known
  errors = []
  for key, default in known.items():
    if key not in config:
      continue
    value, where = config[key], f'{prefix}{key}'
    shown = json.dumps(value, default=repr)[:40]
    spec = entry_fields().get(where)
    if spec is not None:
      if not isinstance(value, dict):
        errors.append(f'{where} is {shown}, not an object of named entries')
        continue
      for name, entry in value.items():
        if not isinstance(entry, dict):
          errors.append(f'{where}.{name} is {json.dumps(entry, default=repr)[:40]}, not an '
                        f'object (the fields of {spec.__name__})')
        else:
          errors += type_errors(entry, defaults(spec), f'{where}.{name}.')
    elif isinstance(default, dict):
      if not isinstance(value, dict):
        errors.append(f'{where} is {shown}, not an object')
      else:
        errors += type_errors(value, default, f'{where}.')
    elif default is None or value is None and not isinstance(default, (bool, int, float)):
      continue
    elif isinstance(default, bool):
      if not isinstance(value, bool):
        errors.append(f'{where} is {shown}, not true / false')
    elif where in AUTO_FIELDS and is_auto(value):
      continue
    elif isinstance(default, (int, float)):
      if where in AUTO_FIELDS and isinstance(value, str):
        errors.append(f'{where} is {shown}, not a number or {AUTO!r}')
      elif isinstance(value, bool) or not isinstance(value, (int, float)) or (
          isinstance(default, int) and isinstance(value, float) and not value.is_integer()):
        errors.append(f'{where} is {shown}, not a number')
    elif isinstance(default, str) and not isinstance(value, str):
      errors.append(f'{where} is {shown}, not a string')
    elif isinstance(default, (list, tuple)) and not isinstance(value, (list, tuple)):
      errors.append(f'{where} is {shown}, not a list')
  return errors


def check(config, where: str = '--config'):
  """Refuses (ConfigError) a config with keys that are no field of the schema or values of
  another kind than the field's default, naming each and the fields there are."""
  config = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  unknown = unknown_keys(config)
  if unknown:
    known = defaults()
    entries = entry_fields()
    hints = []
    for path in unknown[:5]:
      parent, _, key = path.rpartition('.')
      node, walked = known, ''
      for part in parent.split('.') if parent else []:
        if walked in entries:        # data.mixture.web.pathh: an entry's fields
          node = defaults(entries[walked])
          break
        node, walked = node[part], f'{walked}.{part}'.lstrip('.')
      close = difflib.get_close_matches(key, list(node), n=1)
      hints.append(f'{path} (did you mean {parent + "." if parent else ""}{close[0]}?)' if close
                   else f'{path} (the fields of {parent or "the config"}: {", ".join(node)})')
    raise ConfigError(
        f'{where} has key(s) that are no field of the run config: {"; ".join(hints)}. Fix the '
        'spelling in the config file or the --config.* flag (gated_attention/config/schema.py '
        'declares every field).')
  errors = type_errors(config)
  if errors:
    raise ConfigError(f'{where} has values of the wrong kind: {"; ".join(errors[:5])}.')
