"""The smallest gradient accumulation whose training step fits: one walk, shared by
`--mode=compile --fit_grad_accum` (each candidate compiled for the TPU topology), `--mode=memory
--fit_grad_accum` (each candidate against the analytic estimate), `train.grad_accum=auto`
(training/grad_accum.py: each compiled on the devices of the session) and
benchmarks/aot_table.py (compiled in subprocesses, cached).

    walk(candidates(1024, 4, start=1), attempt, log=print)

The candidates are the config's grad_accum times 1, 2, 4, ... while the per-device micro-batch,
batch_size / data-parallel shards / grad_accum, is at least one sequence (and a whole number:
the step splits the per-device batch evenly). `attempt(grad_accum)` returns a dict with `fits`
(True, False, or None for an error) and a one-line `message`; the walk stops at the first that
fits, or at an error (a failed or timed-out compile: a larger grad_accum would not mend it).
"""

import dataclasses
from typing import Callable


@dataclasses.dataclass
class Attempt:
  grad_accum: int
  micro_batch: float            # sequences per device per micro-batch
  fits: bool | None             # None: the attempt failed for another reason than memory
  message: str
  result: dict

  def line(self) -> str:
    verdict = {True: 'fits', False: 'does NOT fit', None: 'error'}[self.fits]
    message = self.message
    if message.lower().startswith(verdict.lower() + ':'):   # aot.report's messages say it too
      message = message[len(verdict) + 1:].strip()
    return (f'grad_accum={self.grad_accum} ({self.micro_batch:g} seq/device per micro-batch): '
            f'{verdict}: {message}')


def batch_shards(config, num_devices: int) -> int:
  """How many data-parallel shards config.mesh splits the batch into on `num_devices` (what
  train.Setup computes, without building it)."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  rules = sharding.get_rules(config.mesh.rules)
  spec = sharding.logical_to_spec(('batch',), rules)
  return sharding.spec_size(P(spec[0]), sharding.mesh_shape(config.mesh, num_devices))


def with_grad_accum(config, grad_accum: int):
  """A copy of `config` with train.grad_accum = grad_accum (the field may have held 'auto')."""
  from gated_attention.config import schema  # pylint: disable=g-import-not-at-top
  c = config.copy_and_resolve_references()
  with c.unlocked():
    del c.train['grad_accum']
    c.train.grad_accum = int(grad_accum)
  return schema.allow_auto(c)


def candidates(batch_size: int, batch_shards: int, start: int = 1) -> list[int]:
  """start x 1, 2, 4, ... while batch_size / batch_shards / grad_accum is a whole number >= 1."""
  if start < 1 or batch_size % batch_shards:
    return []
  per_device, out, ga = batch_size // batch_shards, [], start
  while per_device // ga >= 1:
    if per_device % ga == 0:
      out.append(ga)
    ga *= 2
  return out


def walk(grad_accums: list[int], attempt: Callable[[int], dict], per_device_batch: float,
         log: Callable[[str], None] = print) -> tuple[Attempt | None, list[Attempt]]:
  """(the first attempt that fits or None, every attempt), trying `grad_accums` in order; one
  line is logged per attempt."""
  tried = []
  for ga in grad_accums:
    r = attempt(ga)
    a = Attempt(ga, per_device_batch / ga, r.get('fits'), (r.get('message') or
                                                           r.get('error') or '').strip(), r)
    tried.append(a)
    log(a.line())
    if a.fits:
      return a, tried
    if a.fits is None:
      break
  return None, tried


def none_fits(tried: list[Attempt], where: str) -> str:
  """One paragraph: what was tried, the largest grad_accum, and what else to change."""
  if not tried:
    return (f'No grad_accum to try {where}: the global batch does not give every data-parallel '
            'shard a whole number of sequences (config.train.batch_size).')
  last = tried[-1]
  if last.fits is None:
    return (f'Stopped at grad_accum={last.grad_accum} {where}: {last.message} (not a memory '
            'verdict; a larger grad_accum would not change it).')
  return (f'No grad_accum fits {where}: tried {", ".join(str(a.grad_accum) for a in tried)}; '
          f'the largest, {last.grad_accum} ({last.micro_batch:g} sequence(s) per device per '
          f'micro-batch), still does not: {last.message.rstrip(".")}. Change something else: '
          'a bigger slice (more devices share the parameters and optimizer state), '
          '--config.model.remat=full (keeps less of the forward pass), a shorter '
          '--config.data.seq_len, or more parameter sharding in --config.mesh.')
