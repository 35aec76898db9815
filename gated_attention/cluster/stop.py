"""The stop agreement of a multi-process run: every process stops after the same step.

A signal reaches each host on its own (a maintenance event, a preemption notice, SLURM's
--signal), seconds apart or not at all. A process that stopped alone would leave the others in a
collective it never joins, and both hang. So every step carries each process's signal (0: none)
on each of its devices into the step's own program, which gathers them to every device
(Setup.train_step_with_flags); after each step the loop reads the flags of the step `lag` steps
back: the same step on every process, so they all see the same values, stop after the same step
and all save. (A program of its own for the flags deadlocked: on a CPU it can run beside the
step, and their collectives interleave differently on two processes.) The cost: a few bytes a
step and a read that waits for a step `lag` steps old, while the devices run the newer ones
(benchmarks/stop_agreement.py). The signal handlers and the bounds on stopping are one
process's: training/interrupt.py.
"""

import collections

import jax
import numpy as np

LAG = 2                   # loop turns between posting a signal and reading the agreed value


class StopAgreement:
  """Every device's stop flag, carried through the training step, read `lag` steps later."""

  def __init__(self, lag: int = LAG):
    self._lag, self._queue = lag, collections.deque()

  def flags(self, signum: int | None, setup) -> jax.Array:
    """This process's flag on each of its devices of `setup`'s mesh: the step's extra input."""
    local = np.full((len(setup.mesh.local_devices),), signum or 0, np.int32)
    return jax.make_array_from_process_local_data(setup.flags_sharding, local)

  def push(self, gathered: jax.Array, setup):
    """The step's output: every device's flag, in the mesh's device order."""
    owners = [d.process_index for d in setup.mesh.devices.flat]
    self._queue.append((gathered, owners))

  def decided(self) -> tuple[int, list[int]] | None:
    """(signal, the processes that received one) once the flags `lag` steps old hold one."""
    if len(self._queue) <= self._lag:
      return None
    gathered, owners = self._queue.popleft()
    values = np.asarray(jax.device_get(gathered))
    if not values.any():
      return None
    return int(values.max()), sorted({owners[i] for i in np.flatnonzero(values)})
