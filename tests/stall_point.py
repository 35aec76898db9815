"""Runs main.py with one function held at its entry until the test says go, so that a test can
stop the storage server at that very point (tests/test_storage_stalls.py):

    python -m tests.stall_point MODULE:QUALNAME GO_FILE main.py --config=... --workdir=gs://...

The first call of MODULE.QUALNAME prints `stall point: QUALNAME` on stderr, waits until GO_FILE
exists (the test has frozen the server meanwhile), then goes on as it would have. Later calls
run as they are.
"""

import functools
import importlib
import os
import runpy
import sys
import time


def hold(target: str, go_file: str):
  module_name, qualname = target.split(':')
  owner = importlib.import_module(module_name)
  *parents, name = qualname.split('.')
  for part in parents:
    owner = getattr(owner, part)
  original = getattr(owner, name)
  held = []

  @functools.wraps(original)
  def wrapper(*args, **kwargs):
    if not held:
      held.append(True)
      sys.stderr.write(f'stall point: {qualname}\n')
      sys.stderr.flush()
      while not os.path.exists(go_file):
        time.sleep(0.01)
    return original(*args, **kwargs)
  setattr(owner, name, wrapper)


if __name__ == '__main__':
  target, go, script, *argv = sys.argv[1:]
  sys.argv = [script, *argv]
  sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
  # main.py's own imports first (its SIGINT handler, the config flags), then the hold.
  hold(target, go)
  runpy.run_path(script, run_name='__main__')
