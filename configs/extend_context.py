"""Context extension of a trained run: `--config=configs/extend_context.py:RUN[,key=value...]`.

The paper's recipe (Qiu et al. 2025, Sec. 4.4, Table 5): after pre-training at 4k tokens with
RoPE base 10k, raise the base to 1M and continue training at 32k, then evaluate beyond 32k with
YaRN, without more training. At small scale the lengths become ratios, e.g. train at 256,
continue at 1024, evaluate at 256-4096:

  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1                # seq_len 256
  python main.py --config=configs/extend_context.py:runs/g1 --workdir=runs/g1_1k    # continue
  python main.py --mode=long_context --workdir=runs/g1_1k                           # no YaRN
  python main.py --mode=long_context --workdir=runs/g1_1k \\
      --config.model.rope_scaling.type=yarn --config.model.rope_scaling.factor=4 \\
      --config.model.rope_scaling.original_max_len=1024                            # with YaRN

This config is RUN's saved config with: `train.init_from=RUN` (its latest parameters, a fresh
optimizer and data stream), and the settings after the colon (defaults in brackets):
  seq_len    the continued training length        [4 x RUN's data.seq_len]
  rope_base  the raised RoPE base                 [1e6, the paper's value]
  steps      continued-training steps             [RUN's train.steps // 4]
  lr         peak learning rate                   [RUN's train.learning_rate]
The batch keeps RUN's number of sequences, so a step sees seq_len / RUN's seq_len times the
tokens; the warm-up is a tenth of the steps (at most RUN's). Any field can still be overridden
on the command line (--config.train.batch_size=8).
"""

from gated_attention.runs import rundir

KEYS = {'seq_len': int, 'rope_base': float, 'steps': int, 'lr': float}


def _parse(arg: str) -> tuple[str, dict]:
  run, *pairs = arg.split(',')
  settings = {}
  for pair in pairs:
    key, sep, value = pair.partition('=')
    if not sep or key not in KEYS:
      raise ValueError(f'configs/extend_context.py: {pair!r} is not one of '
                       f'{", ".join(k + "=..." for k in KEYS)} (e.g. '
                       f'--config=configs/extend_context.py:{run},seq_len=1024,rope_base=1e6).')
    try:
      settings[key] = KEYS[key](value)
    except ValueError as e:
      raise ValueError(f'configs/extend_context.py: {key}={value!r} is not a valid '
                       f'{KEYS[key].__name__}.') from e
  return run, settings


def get_config(arg: str = ''):
  if not arg:
    raise ValueError('configs/extend_context.py needs the run to extend after a colon: '
                     '--config=configs/extend_context.py:runs/NAME[,seq_len=1024,...]')
  run, s = _parse(arg)
  c = rundir.read_config_file(run)
  steps = s.get('steps', max(1, c.train.steps // 4))
  c.train.init_from = run
  c.data.seq_len = s.get('seq_len', 4 * c.data.seq_len)
  c.model.rope_base = s.get('rope_base', 1e6)
  c.train.steps = steps
  c.train.learning_rate = s.get('lr', c.train.learning_rate)
  c.train.warmup_steps = min(c.train.warmup_steps, max(1, steps // 10))
  c.train.eval_every = min(c.train.eval_every, steps)
  c.train.checkpoint_every = min(c.train.checkpoint_every, steps)
  return c
