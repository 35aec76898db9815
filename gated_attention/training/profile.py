"""A profiler trace of a window of training steps (`train.profile_steps`), for TensorBoard/XProf
and Perfetto.

    profiler = Profiler(config.train, workdir, first_step=run.step)
    profiler.before(step)          # the step about to run: the trace starts at the window's first
    with profiler.annotate(step):  # a named step in the trace (nothing outside the window)
      ...
    profiler.after(step, state)    # the window's last step: waits for `state`, stops, publishes
    profiler.close()               # a run stopped inside the window publishes what it has

The window: `train.profile_steps` steps from `train.profile_start` (0: this session's third
step, so that the first step's compilation and the second, warming up, are not in it). The
trace (jax.profiler: XLA's xplane.pb, the Chrome-format trace.json.gz and a Perfetto
perfetto_trace.json.gz) is written to a local temporary folder, then copied to
RUN/profile/plugins/profile/<time>_steps_<a>-<b>/<host>_p<i>.* on local disk or object storage
alike: the layout TensorBoard's profile plugin and XProf read (`xprof --logdir RUN/profile`, or
`tensorboard --logdir RUN/profile` with tensorboard-plugin-profile installed); the Perfetto file
opens at https://ui.perfetto.dev. `train.profile_processes`: `first` (process 0 only) or `all`
(every process, one file set each).

Outside the window a step pays one integer comparison.
"""

import contextlib
import os
import socket
import time

import jax

from gated_attention import storage
from gated_attention.errors import ConfigError
from gated_attention.runs import rundir

WARMUP = 2            # steps of a session left out of a trace starting by default
PROCESSES = ('first', 'all')
# jax.profiler's files: <host>.xplane.pb, <host>.trace.json.gz, perfetto_trace.json.gz
_SUFFIXES = ('.xplane.pb', '.perfetto_trace.json.gz', '.trace.json.gz')


def check_config(tc):
  if tc.get('profile_steps', 0) < 0 or tc.get('profile_start', 0) < 0:
    raise ConfigError(f'config.train.profile_steps={tc.profile_steps} and profile_start='
                      f'{tc.profile_start} must be >= 0 (profile_steps: how many steps to trace, '
                      '0: none; profile_start: the first traced step, 0: the session\'s third).')
  if tc.get('profile_processes', 'first') not in PROCESSES:
    raise ConfigError(f'config.train.profile_processes={tc.profile_processes!r}: it is one of '
                      f'{", ".join(PROCESSES)} (first: process 0 traces; all: every process).')


class Profiler:
  """One window of traced steps in this session (none when profile_steps is 0, the window is
  behind the step the session starts at, or this process does not trace)."""

  def __init__(self, tc, workdir: str, first_step: int, say=print):
    self.workdir, self.say = workdir, say
    self.first = self.last = -1
    self.local, self.tracing, self.published = None, False, None
    count = tc.get('profile_steps', 0)
    if count <= 0:
      return
    if tc.get('profile_processes', 'first') == 'first' and jax.process_index() != 0:
      return
    start = tc.get('profile_start', 0) or first_step + WARMUP + 1
    if start <= first_step:
      say(f'Profiling: not in this session (train.profile_start={start}, and it resumes after '
          f'step {first_step}); set --config.train.profile_start to a later step.')
      return
    self.first, self.last = start, start + count - 1

  def before(self, step: int):
    """`step`: the number of the step about to run (1 for the run's first)."""
    if step != self.first:
      return
    self.local = storage.scratch.make('gated_attention_profile_')
    jax.profiler.start_trace(self.local, create_perfetto_trace=True)
    self.tracing = True

  def annotate(self, step: int):
    if not self.tracing:
      return contextlib.nullcontext()
    return jax.profiler.StepTraceAnnotation('train', step_num=step)

  def after(self, step: int, state):
    """`step`: the step just run; at the window's last, waits for `state` (its device work is
    in the trace) and publishes the trace."""
    if step == self.last and self.tracing:
      jax.block_until_ready(state)
      self._stop(step)

  def close(self, step: int):
    """A run that stops inside the window publishes the steps it traced."""
    if self.tracing:
      self._stop(step)

  def _stop(self, step: int):
    self.tracing = False
    try:
      jax.profiler.stop_trace()
      try:
        self.published = self._publish(step)
      except storage.StorageError as e:   # each upload is bounded (a stalled endpoint)
        storage.waits.closing('profile')
        raise storage.StorageError(
            f'Uploading the profiler trace of steps {self.first}-{step} failed: {e} The '
            'checkpoints already written are intact; once the storage answers, run the same '
            'command again to resume from the latest one.') from e
      self.say(f'Profiler trace of steps {self.first}-{step}: {self.published} (open it with '
               f'xprof --logdir {storage.join(self.workdir, rundir.PROFILE_DIR)}, or its '
               'perfetto_trace.json.gz at https://ui.perfetto.dev)')
    finally:
      storage.scratch.remove(self.local)

  def _publish(self, step: int) -> str:
    """Copies the trace's files into RUN/profile/plugins/profile/<name>/, each named after this
    host and process (one folder for every process of the window)."""
    found = [os.path.join(d, f) for d, _, files in os.walk(self.local) for f in files
             if not f.startswith('.')]
    if not found:
      raise RuntimeError(f'jax.profiler wrote no trace into {self.local}')
    name = f'{time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())}_steps_{self.first}-{step}'
    if jax.process_count() > 1:        # the processes' clocks differ: one folder for all
      name = f'steps_{self.first}-{step}'
    folder = storage.join(self.workdir, rundir.PROFILE_DIR, 'plugins', 'profile', name)
    storage.makedirs(folder)
    host = f'{socket.gethostname()}_p{jax.process_index()}'
    for path in found:
      base = os.path.basename(path)
      suffix = next((s for s in _SUFFIXES if base.endswith(s)), '.' + base)
      storage.upload_file(path, storage.join(folder, host + suffix))
    return folder
