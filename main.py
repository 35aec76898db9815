"""Train, inspect and compare gated-attention models: `python main.py --help` lists the modes
(one line each), the common flags and examples; `--mode=MODE --help`, that mode's flags.

  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1             # train (tiny)
  python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=params       # parameter counts
  python main.py --config=configs/g1_elementwise.py --workdir=runs/g1 --mode=analyze
  python main.py --mode=compare runs/baseline runs/g1                             # paper-style table
  python main.py --config=configs/baseline.py:moe_15a2b --mode=memory             # per-device bytes
  python main.py --config=configs/baseline.py:moe_15a2b --mode=compile --topology=v5p:4x4x4
  python main.py --mode=import --hf=/data/1B_gate_headwise --workdir=runs/hf_headwise
  python main.py --mode=export --workdir=runs/g1_headwise --out=out/g1_headwise_hf
  python main.py --mode=sample --workdir=runs/g1 --prompt="The cat" --max_new_tokens=100
  python main.py --config=configs/extend_context.py:runs/g1 --workdir=runs/g1_1k   # longer context
  python main.py --mode=long_context --workdir=runs/g1_1k      # loss by position, RULER-style tasks
Any config field can be overridden: --config.train.steps=100 --config.model.num_layers=2.
"""

import atexit
import os
import signal
import sys


def _stop_now(signum, frame):  # pylint: disable=unused-argument
  """Ctrl-C before training starts: stop at once. (A KeyboardInterrupt can land inside a garbage
  collection callback, where Python only prints it and goes on.) The training loop takes
  SIGINT over while it trains: the first saves a checkpoint and stops. A run's lock taken while
  it starts is freed first (no other trainer waits for it to go stale)."""
  lock = sys.modules.get('gated_attention.runs.lock')   # loaded: a lock may be held
  if lock is not None:
    lock.release_all()
  os.write(1, b'\nInterrupted: stopped at once. Checkpoints already written are intact; run the '
           b'same command again to resume from the latest.\n')
  os._exit(130)  # pylint: disable=protected-access


def _exiting():
  """Registered before anything else, so it runs last at exit: the run's close and every other
  exit step (jax.distributed's shutdown) are over, and only the interpreter's teardown is left,
  where Python puts the default action back on the signals it handled. A stop signal arriving
  there (a peer host's SIGTERM a moment after this process's stop was agreed and saved) killed it
  with status -15; it is ignored instead (issue 57: a signal during the exit is not fatal)."""
  for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)


atexit.register(_exiting)
signal.signal(signal.SIGINT, _stop_now)
from gated_attention import cli  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  cli.run()
