"""gated-attention: gated softmax attention (Qiu et al., 2025) in JAX / Flax NNX."""

import sys as _sys

# Python 3.11 or later: the pinned numpy (requirements.txt) has no release for older Pythons, and
# the code uses 3.11's standard library. Checked here, before anything else is imported, so that
# main.py, the console command and the notebook say so in one line (this file parses on any
# Python 3).
MIN_PYTHON = (3, 11)
if tuple(_sys.version_info[:2]) < MIN_PYTHON:
  raise SystemExit(
      'gated-attention needs Python %d.%d or later; this is Python %s (%s). The pinned numpy '
      '(requirements.txt) has no release for it. Make the virtual environment with a newer '
      'Python, e.g. python3.11 -m venv .venv, then .venv/bin/pip install -r requirements.txt.'
      % (MIN_PYTHON + ('.'.join(map(str, _sys.version_info[:3])), _sys.executable)))
