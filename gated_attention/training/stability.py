"""Training stability: the loss-spike detector and the policy for non-finite steps and divergence.

The paper's stability claim (Qiu et al. 2025, Sec. 3, Fig. 1; Sec. 4.4) is about loss spikes:
the gated models train without the spikes the baseline shows, and at learning rates where the
baseline diverges. The loop (loop.py) feeds every step's training loss and finiteness to a
`Guard`, which keeps a running level of the loss and reports:

  skip      a non-finite step: the train step already left parameters and optimizer state
            unchanged (train.train_step); `nonfinite_max_in_a_row` of them in a row is a failure
  spike     a finite loss far above the running level: loss > level + spike_threshold * dev and
            loss > spike_min_ratio * level (dev: the running mean absolute deviation; both run
            as exponential averages over ~spike_window steps, and only after spike_window steps),
            or, at any step, loss > uniform_ratio * ln(vocab) (worse than guessing, clearly);
            spike steps do not move the level
  diverged  divergence_steps spike steps in a row: a sustained departure, not a spike
  failure   the policy's trigger: too many non-finite steps in a row, or diverged

On a failure the loop halts (`on_failure='halt'`) or rolls back to the best checkpoint with the
learning rate scaled by rollback_lr_factor (`'rollback'`, at most max_rollbacks times).
Checkpoints are written only when the guard is `calm` (spike_window steps without a spike or a
skipped step), so neither rotation nor a rollback lands on a state taken mid-blow-up (a single
huge spike can wreck the parameters while the loss looks ordinary after it); the best one by
the running level is kept outside rotation anyway.
"""

import dataclasses
import math

from gated_attention.errors import ConfigError

POLICIES = ('halt', 'rollback')


@dataclasses.dataclass
class Event:
  kind: str                     # skip | spike | diverged | failure
  step: int
  loss: float
  level: float | None = None
  why: str = ''

  def row(self) -> dict:
    out = {'event': self.kind, 'loss': self.loss if math.isfinite(self.loss) else None}
    if self.level is not None:
      out.update(level=self.level, size=self.loss - self.level,
                 ratio=self.loss / self.level if self.level else None)
    if self.why:
      out['why'] = self.why
    return out


def check_config(tc):
  if tc.on_failure not in POLICIES:
    raise ConfigError(f'config.train.on_failure={tc.on_failure!r} is not one of '
                      f'{", ".join(POLICIES)}.')
  for name in ('nonfinite_max_in_a_row', 'spike_window', 'divergence_steps'):
    if tc[name] < 1:
      raise ConfigError(f'config.train.{name}={tc[name]} must be >= 1.')
  if not 0 < tc.rollback_lr_factor <= 1:
    raise ConfigError(f'config.train.rollback_lr_factor={tc.rollback_lr_factor} must be in '
                      '(0, 1].')


class Guard:
  """The detector's running state; `observe` one step at a time, `state` to checkpoint it."""

  def __init__(self, tc, vocab_size: int, state: dict | None = None):
    self.tc, self.vocab_size = tc, vocab_size
    self.uniform_loss = math.log(vocab_size)
    self.decay = 1.0 - 1.0 / tc.spike_window
    s = state or {}
    self.level = s.get('level')          # running mean of the loss (bias-corrected)
    self.dev = s.get('dev')              # running mean |loss - level|
    self.seen = s.get('seen', 0)         # steps that moved the level
    self.in_a_row = s.get('in_a_row', 0)          # spike steps in a row
    self.nonfinite_in_a_row = s.get('nonfinite_in_a_row', 0)
    self.since_trouble = s.get('since_trouble')   # steps since the last spike or skip
    self.totals = dict(s.get('totals', {'skipped': 0, 'spikes': 0}))

  def state(self) -> dict:
    return dict(level=self.level, dev=self.dev, seen=self.seen, in_a_row=self.in_a_row,
                nonfinite_in_a_row=self.nonfinite_in_a_row, since_trouble=self.since_trouble,
                totals=dict(self.totals))

  @property
  def calm(self) -> bool:
    """No spike or skipped step in the last spike_window steps (a state worth saving)."""
    return self.since_trouble is None or self.since_trouble >= self.tc.spike_window

  def _is_spike(self, loss: float) -> str:
    tc = self.tc
    if loss > tc.uniform_ratio * self.uniform_loss:
      return f'above {tc.uniform_ratio} x ln(vocab) = {tc.uniform_ratio * self.uniform_loss:.2f}'
    if self.seen < tc.spike_window:
      return ''
    if (loss > self.level + tc.spike_threshold * self.dev
        and loss > tc.spike_min_ratio * self.level):
      return f'{(loss - self.level) / max(self.dev, 1e-12):.1f} deviations above the level'
    return ''

  def _update_level(self, loss: float):
    if self.level is None:
      self.level, self.dev = loss, 0.0
    else:
      self.dev = self.decay * self.dev + (1 - self.decay) * abs(loss - self.level)
      self.level = self.decay * self.level + (1 - self.decay) * loss
    self.seen += 1

  def observe(self, step: int, loss: float, finite: bool) -> list[Event]:
    tc, events = self.tc, []
    if self.since_trouble is not None:
      self.since_trouble += 1
    if not finite:
      self.since_trouble = 0
      self.totals['skipped'] += 1
      self.nonfinite_in_a_row += 1
      events.append(Event('skip', step, loss, self.level))
      if self.nonfinite_in_a_row >= tc.nonfinite_max_in_a_row:
        events.append(Event('failure', step, loss, self.level,
                            f'{self.nonfinite_in_a_row} non-finite steps in a row'))
      return events
    self.nonfinite_in_a_row = 0
    why = self._is_spike(loss)
    if not why:
      self.in_a_row = 0
      self._update_level(loss)
      return events
    self.in_a_row += 1
    self.since_trouble = 0
    self.totals['spikes'] += 1
    events.append(Event('spike', step, loss, self.level, why))
    if self.in_a_row >= tc.divergence_steps:
      events.append(Event('diverged', step, loss, self.level,
                          f'{self.in_a_row} spike steps in a row'))
      events.append(Event('failure', step, loss, self.level, 'the loss diverged'))
    return events

  def reset(self, state: dict | None):
    """Back to the state saved with the checkpoint rolled back to (the totals keep counting)."""
    totals = dict(self.totals)
    self.__init__(self.tc, self.vocab_size, state)
    self.totals = totals
