"""Keeping tensorstore's closed-event-loop noise off the console.

When an orbax read or write fails (a corrupt checkpoint being restored, a full disk during an
asynchronous save), tensorstore callbacks still in flight hit orbax's already closed asyncio
event loop and print, from C, one `RuntimeError: Event loop is closed` traceback each: dozens.
`without_event_loop_noise()` passes everything written to stderr (file descriptor 2, so C-level
output too) through a thread that drops exactly those tracebacks and forwards the rest.
"""

import contextlib
import os
import sys
import threading

_HEAD = 'Traceback (most recent call last):'
_NOISE_FRAME = 'asyncio/base_events.py'
_NOISE_END = 'RuntimeError: Event loop is closed'


def _pump(read_fd: int, write_fd: int):
  """Copies lines from read_fd to write_fd, dropping event-loop-closed tracebacks (decided at a
  traceback's second line: the noise's first frame is in asyncio/base_events.py)."""
  held = []
  with os.fdopen(read_fd, 'rb', buffering=0) as src:
    for raw in iter(src.readline, b''):
      line = raw.decode('utf-8', 'replace')
      if held:
        held.append(raw)
        if len(held) == 2 and _NOISE_FRAME not in line:
          os.write(write_fd, b''.join(held))   # another traceback: forward it
          held = []
        elif _NOISE_END in line:
          held = []                            # the whole noise traceback: dropped
      elif line.startswith(_HEAD):
        held = [raw]
      else:
        os.write(write_fd, raw)
    if held:
      os.write(write_fd, b''.join(held))


_originals = []   # the stderr each open without_event_loop_noise() replaced, outermost first


def write_before_exit(text: str):
  """`text` on the real stderr, at once: for a message written just before os._exit, which
  ends the filter's thread before it forwards what is in its pipe."""
  os.write(_originals[0] if _originals else 2, text.encode())


@contextlib.contextmanager
def without_event_loop_noise():
  """Within the block, stderr (fd 2) goes through the filter."""
  sys.stderr.flush()
  original = os.dup(2)
  _originals.append(original)
  read_fd, write_fd = os.pipe()
  os.dup2(write_fd, 2)
  os.close(write_fd)
  thread = threading.Thread(target=_pump, args=(read_fd, original), daemon=True)
  thread.start()
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(original, 2)      # closes the pipe's last write end: the pump sees EOF
    thread.join(timeout=5)
    _originals.remove(original)
    os.close(original)
