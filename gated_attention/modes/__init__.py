"""The modes of main.py: one small module each, listed in one table with the flags each takes.

    python main.py --mode=NAME ...   ->   MODES[NAME].load().main(args)

Each mode module has `main(args: Args) -> None`: it takes everything it uses from `args` (the
command line, parsed once by gated_attention/cli.py) and passes it on as explicit arguments, so
the library below reads no flags; a `check(args)` beside it, if any, refuses what its flags
cannot do together before anything is written. Modes print; the library returns values. Every mode takes
--config (with --config.x.y overrides) and --workdir; the other flags are declared once in FLAGS
and each mode's row names those it takes: cli.py defines them all, refuses one given to a mode
whose row does not name it, and hands the mode its own in `args` (`args.prompts`). To add a
mode: write modes/<name>.py with `main(args)` and add its row (and any new flag to FLAGS);
README's "Modes of main.py" lists them.
"""

import dataclasses
import importlib

import ml_collections


@dataclasses.dataclass(frozen=True)
class Flag:
  """A command-line flag of one or more modes: absl's DEFINE_<kind>(name, default, help).
  `attr`: its name in Args (default: the flag's)."""
  name: str
  kind: str                     # string | integer | float | bool | enum | list | multi_string
  default: object
  help: str
  enum_values: tuple = ()
  attr: str = ''

  @property
  def key(self) -> str:
    return self.attr or self.name


FLAGS = {f.name: f for f in (
    Flag('out', 'string', None, 'the output directory: compare\'s tables and figures (default '
         'compare/), export\'s Hugging Face directory, tokenize\'s shards (local or gs://), or '
         'analyze\'s / quantization\'s report for a run that is read-only (default '
         'RUN/analysis, RUN/quantization).'),
    Flag('step', 'integer', None, 'which checkpoint of the run to open (default: the latest).'),
    Flag('topology', 'string', None, 'a TPU topology name, e.g. v5p:4x4x4.'),
    Flag('fit_grad_accum', 'bool', False, 'find the smallest config.train.grad_accum whose step '
         'fits: the configured one x 1, 2, 4, ... while every device keeps at least one sequence '
         'per micro-batch; one line per attempt, then the report of the first that fits (compile: '
         'each compiled for --topology; memory: the estimate against '
         'config.memory.device_memory_gib or the device\'s own memory).'),
    Flag('plan', 'enum', 'train', 'what to plan: the training step (train) or '
         '--mode=long_context\'s evaluation (long_context: the largest of '
         'config.long_context.lengths, its batch_size and chunk; the KV cache is on every '
         'device).', enum_values=('train', 'long_context')),
    Flag('hf', 'string', None, 'a Hugging Face model directory (local or gs://).'),
    Flag('export_dtype', 'enum', 'float32', 'the dtype of the written weights.',
         enum_values=('float32', 'bfloat16')),
    Flag('max_shard_size', 'string', '5GB', 'the largest safetensors file, as in transformers\' '
         'save_pretrained (5GB, 500MB, 2GiB or bytes); larger models are written in several '
         'files with an index.'),
    Flag('remote_code_dir', 'string', None, 'for a G1 gate: a directory holding the authors\' '
         'modeling_qwen3.py / configuration_qwen3.py to copy beside the export.'),
    Flag('prompt', 'multi_string', [], 'a prompt (repeat for a batch).', attr='prompts'),
    Flag('max_new_tokens', 'integer', 128, 'tokens to generate per prompt.'),
    Flag('temperature', 'float', 0.0, '0 is greedy; above 0 samples.'),
    Flag('top_p', 'float', 1.0, 'nucleus sampling keeps this probability mass.'),
    Flag('sample_seed', 'integer', 0, 'the seed of the samples.'),
    Flag('window', 'integer', 0, 'a sliding-window KV cache that keeps the last WINDOW tokens '
         '(StreamingLLM; RoPE positions by place in the cache): memory stays flat however long '
         'the text; 0: the full cache.'),
    Flag('sinks', 'integer', 0, 'with --window: also keep the first SINKS tokens (attention '
         'sinks).'),
    Flag('seeds', 'list', [], 'several seeds of the config trained as one program (e.g. '
         '--seeds=0,1,2), each in its own run directory: --workdir with {seed} replaced, or '
         '--workdir/s<seed>.'),
    Flag('analyze', 'bool', False, 'once the run has trained to its last step, analyse it in the '
         'same process (what --mode=analyze writes to RUN/analysis/, from the parameters in '
         'memory and the compiled model: nothing restored or compiled again).'),
)}


def modes_taking(flag: str) -> list[str]:
  """The names of the modes whose row names `flag`, in the table's order."""
  return [m.name for m in MODES.values() if flag in m.flags]


@dataclasses.dataclass(frozen=True)
class Args:
  """The parsed command line: what every mode takes, and in `options` the flags of the mode's
  row (its FLAGS), which read as attributes: `args.prompts`, `args.step`. A flag of another
  mode is no attribute."""
  config: ml_collections.ConfigDict   # --config with its --config.x.y overrides applied
  mode: str = 'train'
  config_given: bool = False          # whether --config was on the command line
  overrides: dict = dataclasses.field(default_factory=dict)  # the --config.x.y=value alone
  workdir: str | None = None
  runs: tuple = ()                    # positional arguments: --mode=compare's run directories
  options: dict = dataclasses.field(default_factory=dict)    # {Flag.key: value} of the mode

  def __getattr__(self, name):
    options = self.__dict__.get('options', {})
    if name in options:
      return options[name]
    raise AttributeError(f'--mode={self.__dict__.get("mode")} takes no flag {name!r} (its row '
                         'in gated_attention/modes/__init__.py MODES names its flags).')


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  help: str
  flags: tuple = ()             # the names of its FLAGS
  needs_workdir: bool = False   # --workdir is required
  takes_runs: bool = False      # positional run directories
  distributed: bool = False     # jax.distributed is initialised first (multi-host)
  writes_run: bool = False      # writes checkpoints into --workdir: the libraries' logs go there
  module: str = ''              # default: gated_attention.modes.<name>

  def load(self):
    return importlib.import_module(self.module or f'gated_attention.modes.{self.name}')


MODES = {m.name: m for m in (
    Mode('train', 'trains in --workdir (resumes from its latest checkpoint; SIGTERM / Ctrl-C '
         'saves)', flags=('seeds', 'analyze'), needs_workdir=True, distributed=True,
         writes_run=True),
    Mode('params', 'total, active (per token), embedding and per-module parameter counts '
         '(JSON)'),
    Mode('analyze', 'attention sink, massive activations, gate scores and sparsity of a run\'s '
         'checkpoint', flags=('step', 'out'), needs_workdir=True, distributed=True),
    Mode('compare', 'RUN1 RUN2 ... (positional): the paper\'s table and figures for several '
         'runs', flags=('out',), takes_runs=True),
    Mode('memory', 'per-device bytes of parameters, optimizer state, activations (an '
         'estimate, no compile)', flags=('fit_grad_accum', 'plan')),
    Mode('compile', 'the train step compiled ahead of time for a TPU slice '
         '(--topology=v5p:4x4x4)',
         flags=('topology', 'fit_grad_accum', 'plan'),
         module='gated_attention.modes.compile_aot'),
    Mode('import', 'a Hugging Face model directory (--hf=DIR) -> a run directory', flags=('hf',),
         needs_workdir=True, writes_run=True, module='gated_attention.modes.hf_import'),
    Mode('export', 'a run\'s checkpoint -> a Hugging Face model directory (--out=DIR)',
         flags=('out', 'step', 'export_dtype', 'max_shard_size', 'remote_code_dir'),
         needs_workdir=True, module='gated_attention.modes.hf_export'),
    Mode('sample', 'continues --prompt texts with a run\'s checkpoint (KV cache; greedy or '
         'nucleus; --window / --sinks: a sliding-window cache)',
         flags=('prompt', 'max_new_tokens', 'temperature', 'top_p', 'sample_seed', 'step',
                'window', 'sinks'),
         needs_workdir=True, distributed=True),
    Mode('long_context', 'loss by position and RULER-style retrieval beyond the training length',
         flags=('step',), needs_workdir=True, distributed=True),
    Mode('quantization', 'the held-out loss under simulated W8A16 / W4A16 / W8A8 / W4A8 '
         'quantization, and the linear inputs\' max and kurtosis', flags=('step', 'out'),
         needs_workdir=True, distributed=True),
    Mode('tokenize', 'data.source tokenized once into ArrayRecord shards in --out, for '
         'data.source=tokenized', flags=('out',)),
    Mode('config', 'prints the resolved config (overrides applied and checked): a new run\'s, '
         'or --workdir\'s', module='gated_attention.modes.show_config'),
)}
