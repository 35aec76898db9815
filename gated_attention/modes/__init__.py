"""The modes of main.py: one small module each, listed in one table.

    python main.py --mode=NAME ...   ->   MODES[NAME].load().main(args)

Each mode module has `main(args: Args) -> None`: it takes everything it uses from `args` (the
command line, parsed once by main.py) and passes it on as explicit arguments, so the library
below reads no flags. Modes print; the library returns values. To add a mode: write
modes/<name>.py with `main(args)`, add its row to MODES (and any flag of its own to main.py and
`Args`); README's "Modes of main.py" lists them.
"""

import dataclasses
import importlib

import ml_collections


@dataclasses.dataclass(frozen=True)
class Args:
  """The parsed command line."""
  config: ml_collections.ConfigDict   # --config with its --config.x.y overrides applied
  config_given: bool = False          # whether --config was on the command line
  overrides: dict = dataclasses.field(default_factory=dict)  # the --config.x.y=value alone
  workdir: str | None = None
  runs: tuple = ()                    # positional arguments: --mode=compare's run directories
  topology: str | None = None
  out: str | None = None
  hf: str | None = None
  export_dtype: str = 'float32'
  max_shard_size: str = '5GB'
  remote_code_dir: str | None = None
  prompts: tuple = ()
  max_new_tokens: int = 128
  temperature: float = 0.0
  top_p: float = 1.0
  sample_seed: int = 0
  step: int | None = None
  seeds: tuple = ()                   # --seeds: several seeds trained as one program
  analyze: bool = False               # --analyze: --mode=train analyses the run when it ends


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  help: str
  needs_workdir: bool = False   # --workdir is required
  takes_runs: bool = False      # positional run directories
  distributed: bool = False     # jax.distributed is initialised first (multi-host)
  module: str = ''              # default: gated_attention.modes.<name>

  def load(self):
    return importlib.import_module(self.module or f'gated_attention.modes.{self.name}')


MODES = {m.name: m for m in (
    Mode('train', 'trains in --workdir, resuming from its latest checkpoint; SIGTERM / Ctrl-C '
         'saves and exits', needs_workdir=True, distributed=True),
    Mode('params', 'one JSON object: total, active (per token), embedding and per-module '
         'parameter counts'),
    Mode('analyze', 'attention sink, massive activations, gate scores and sparsity of a run\'s '
         'checkpoint', needs_workdir=True, distributed=True),
    Mode('compare', 'main.py --mode=compare RUN1 RUN2 ...: the paper\'s table and figures for '
         'several runs', takes_runs=True),
    Mode('memory', 'per-device bytes of parameters, optimizer state and activations for a scale '
         'and mesh'),
    Mode('compile', 'ahead-of-time compilation of the train step for a TPU topology '
         '(--topology=v5p:4x4x4)', module='gated_attention.modes.compile_aot'),
    Mode('import', 'a Hugging Face model directory (--hf=DIR) -> a run directory',
         needs_workdir=True, module='gated_attention.modes.hf_import'),
    Mode('export', 'a run\'s checkpoint -> a Hugging Face model directory (--out=DIR)',
         needs_workdir=True, module='gated_attention.modes.hf_export'),
    Mode('sample', 'continues --prompt texts with a run\'s checkpoint (KV cache; greedy or '
         'nucleus sampling)', needs_workdir=True, distributed=True),
    Mode('long_context', 'loss by position and RULER-style retrieval beyond the training length',
         needs_workdir=True, distributed=True),
    Mode('tokenize', 'tokenizes data.source once into sharded ArrayRecord files of token ids '
         'in --out (local or gs://), for data.source=tokenized; resumable'),
)}
