"""A pod on one machine for the multi-host fault tests: N `main.py` processes joined by
jax.distributed on loopback, each with its own CPU devices, started, signalled, killed and timed
the way a cluster's events reach a real pod's hosts (tests/test_multihost_faults.py).

    pod = Pod(workdir, processes=2, devices=2, env=env, steps=40, logs_dir=tmp)
    pod.start()
    pod.wait_for(lambda: pod.logged('step 6/'))
    pod.signal(1, signal.SIGTERM)
    codes = pod.wait(bound=60)           # [(exit status, seconds from the event), ...]
"""

import dataclasses
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time

from tests import xla

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A tiny G1 model (the fault suite's, tests/test_faults.py) whose batch of 8 divides over 1, 2, 4
# and 8 devices; a checkpoint and an evaluation every 10 steps.
OVERRIDES = {
    'model.num_layers': 2, 'model.hidden_size': 64, 'model.head_dim': 16, 'model.ffn_size': 128,
    'data.seq_len': 32, 'data.val_batches': 2, 'train.batch_size': 8, 'train.warmup_steps': 4,
    'train.log_every': 1, 'train.eval_every': 10, 'train.checkpoint_every': 10,
}
HEARTBEAT = 4        # distributed.heartbeat_timeout of the pods here (seconds)
STOP_TIMEOUT = 90    # train.stop_timeout


_LAUNCHES = itertools.count(1)   # numbers every launch's logs in this process


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Pod:
  workdir: str
  processes: int
  devices: int
  env: dict
  steps: int
  logs_dir: str          # where each launch's output goes (launch<k>_p<i>.txt)
  extra: dict = dataclasses.field(default_factory=dict)
  # {process: 'MODULE:QUALNAME'}: that process holds at the function's first call until `go(i)`
  # (tests/stall_point.py), so an event can be sent at that very point.
  hold: dict = dataclasses.field(default_factory=dict)
  # {process: {NAME: value}}: that process's own additions to `env` (a cache directory of its own).
  env_of: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.procs, self.logs, self.event_time = [], [], None

  def command(self, i: int, port: int) -> list[str]:
    overrides = {**OVERRIDES, 'train.steps': self.steps, 'train.stop_timeout': STOP_TIMEOUT}
    if self.processes > 1:
      overrides.update({'distributed.coordinator_address': f'127.0.0.1:{port}',
                        'distributed.num_processes': self.processes,
                        'distributed.process_id': i,
                        'distributed.heartbeat_timeout': HEARTBEAT,
                        'distributed.initialization_timeout': 120})
    overrides.update(self.extra)
    held = ([sys.executable, '-m', 'tests.stall_point', self.hold[i], self._go_file(i)]
            if i in self.hold else [sys.executable])
    return (held + ['main.py', '--config=configs/g1_elementwise.py',
                    f'--workdir={self.workdir}'] +
            [f'--config.{k}={v}' for k, v in overrides.items()])

  def _go_file(self, i: int) -> str:
    return os.path.join(self.logs_dir, f'go_p{i}')

  def held(self, i: int) -> bool:
    """Whether process i has reached its hold point (and waits there)."""
    return 'stall point:' in self.text(i)

  def go(self, i: int):
    """Process i goes on from its hold point."""
    open(self._go_file(i), 'w').close()  # pylint: disable=consider-using-with

  def start(self):
    """Starts every process of the pod (a launch: logs launch<k>_p<i>.txt in logs_dir)."""
    port = free_port()
    env = {k: v for k, v in self.env.items()
           if k not in ('JAX_COORDINATOR_ADDRESS', 'SLURM_STEP_ID', 'OMPI_COMM_WORLD_SIZE',
                        'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS')}
    env.update(JAX_PLATFORMS='cpu', JAX_COORDINATOR_BIND_ADDRESS=f'127.0.0.1:{port}',
               XLA_FLAGS=xla.flags(self.devices))
    launch = next(_LAUNCHES)
    self.procs, self.logs, self.event_time = [], [], None
    for i in self.hold:
      if os.path.exists(self._go_file(i)):
        os.remove(self._go_file(i))
    for i in range(self.processes):
      path = os.path.join(self.logs_dir, f'launch{launch}_p{i}.txt')
      log = open(path, 'w+')  # pylint: disable=consider-using-with
      self.logs.append((path, log))
      self.procs.append(subprocess.Popen(self.command(i, port), cwd=REPO,
                                         env={**env, **self.env_of.get(i, {})}, stdout=log,
                                         stderr=subprocess.STDOUT))

  def text(self, i: int = 0) -> str:
    with open(self.logs[i][0]) as f:
      return f.read()

  def logged(self, pattern: str, i: int = 0) -> bool:
    return re.search(pattern, self.text(i)) is not None

  def last_step(self) -> int:
    steps = re.findall(r'step (\d+)/', self.text(0))
    return int(steps[-1]) if steps else 0

  def saving(self) -> bool:
    """A checkpoint save under way: orbax's temporary folder exists (local disk)."""
    ckpt = os.path.join(self.workdir, 'checkpoints')
    return os.path.isdir(ckpt) and any('orbax-checkpoint-tmp' in n for n in os.listdir(ckpt))

  def wait_for(self, predicate, timeout: float = 240, poll: float = 0.02):
    deadline = time.time() + timeout
    while not predicate():
      if any(p.poll() is not None for p in self.procs):
        raise AssertionError('a process ended before the event:\n' + self.tails())
      if time.time() > deadline:
        raise AssertionError(f'timed out waiting for {predicate}:\n' + self.tails())
      time.sleep(poll)

  def signal(self, i: int, sig: int):
    """Sends `sig` to process i (the event's time is the first signal's or kill's)."""
    self.event_time = self.event_time or time.time()
    if self.procs[i].poll() is None:
      self.procs[i].send_signal(sig)

  def kill(self, i: int):
    self.signal(i, signal.SIGKILL)

  def wait(self, bound: float) -> list[tuple[int, float]]:
    """Waits for every process; [(exit status, seconds from the event to its exit)]. A process
    still alive `bound` seconds after the event is killed and the test fails."""
    start = self.event_time or time.time()
    out = []
    for p in self.procs:
      try:
        p.wait(timeout=max(0.0, start + bound - time.time()))
      except subprocess.TimeoutExpired:
        self.kill_all()
        raise AssertionError(f'a process outlived its bound of {bound} s:\n' + self.tails())
      out.append((p.returncode, time.time() - start))
    for _, log in self.logs:
      log.close()
    return out

  def run(self, bound: float = 400) -> list[tuple[int, float]]:
    """A launch that runs to its end."""
    self.start()
    return self.wait(bound)

  def kill_all(self):
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait()

  def tails(self, chars: int = 3000) -> str:
    return '\n'.join(f'--- process {i} (exit {p.poll()}):\n{self.text(i)[-chars:]}'
                     for i, p in enumerate(self.procs))
