"""The XLA flags of the test session: every program the tests compile, in this process and in
every subprocess, is compiled by XLA's CPU backend at LLVM's lowest optimisation level.

The tests' programs are tiny; most of their time is compile time, and -O0 about halves it (the
tiny training step of tests/pod.py: 26.6 s of compile per launch at the default level, 14.1 s at
-O0, the steps as fast; tests/test_model.py with test_gating.py: 114 s -> 61 s, all passing). The
HLO passes, and with them the programs' arithmetic, are the same: only the machine code's
optimisation changes. A caller's own XLA_FLAGS are kept, and one that sets
`--xla_backend_optimization_level` itself keeps its level (run the tests at the default level:
`XLA_FLAGS=--xla_backend_optimization_level=2 pytest ...`).
"""

import os

FAST_COMPILE = ('--xla_backend_optimization_level=0', '--xla_llvm_disable_expensive_passes=true')
_DEVICES = '--xla_force_host_platform_device_count'


def set_session_flags():
  """Adds FAST_COMPILE to os.environ's XLA_FLAGS (tests/conftest.py, before JAX starts)."""
  flags = os.environ.get('XLA_FLAGS', '').split()
  if not any(f.startswith('--xla_backend_optimization_level') for f in flags):
    os.environ['XLA_FLAGS'] = ' '.join(flags + list(FAST_COMPILE))


def flags(devices: int | None = None) -> str:
  """XLA_FLAGS for a subprocess: the session's, with `devices` fake CPU devices (or as many as
  the session's flags give when None)."""
  kept = os.environ.get('XLA_FLAGS', '').split()
  if devices:
    kept = [f for f in kept if not f.startswith(_DEVICES)] + [f'{_DEVICES}={devices}']
  return ' '.join(kept)
