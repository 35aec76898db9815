"""A run's goodput: where the wall time of its sessions went, and how much of it trained.

    sessions = rundir.read_goodput(workdir)       # RUN/goodput/session-<n>.json, in order
    account = summarize(sessions)                 # totals by cause, lost steps, goodput
    print(describe(account))

Each session of a run (one `main.py` process on each host, from its start to its exit) records
its wall time by cause (training/goodput.py writes it; process 0's account stands for the run,
the processes step in lockstep). The causes partition the session's wall time:

  startup     process start until the first step, less the restore and compilation in it
  restore     restoring the latest checkpoint
  compile     tracing, lowering and compiling (jax.monitoring's compile events), wherever it ran
  steps       training steps: dispatch, and waiting for their results at log points
  data_wait   waiting for a batch the input pipeline had not ready
  eval        evaluations
  checkpoint  the blocking part of checkpoint saves (the write itself runs in the background)
  profile     waiting for a traced window's last step, and writing its trace (train.profile_steps)
  closing     the end: the last save's wait, files closed, the lock released

Time lost to restarts: a session killed after its latest checkpoint trained steps the next
session trains again. Session j trained the steps (start_j, step_j]; those of them that a later
session trains again are lost (after a kill between checkpoints: step_j - start_{j+1}), and with
them their share of session j's step time. The account of a killed session is what it last wrote (every few
seconds): the seconds between that write and the kill are in no account.

goodput = (step time of all sessions - lost step time) / wall time of all sessions.
"""

CAUSES = ('startup', 'restore', 'compile', 'steps', 'data_wait', 'eval', 'checkpoint',
          'profile', 'closing')


def summarize(sessions: list[dict]) -> dict:
  """The account of a run's sessions (in order): per session and in total, seconds by cause,
  the steps and seconds lost to restarts, and goodput (None without any wall time)."""
  out, totals = [], dict.fromkeys(CAUSES, 0.0)
  wall = lost_s = 0.0
  lost_steps = 0
  spans = [(int(s.get('start_step', 0)), int(s.get('step', 0))) for s in sessions]
  for j, s in enumerate(sessions):
    seconds = {c: float(s.get('seconds', {}).get(c, 0.0)) for c in CAUSES}
    taken = max(spans[j][1] - spans[j][0], 0)
    lost = _covered(spans[j], spans[j + 1:])
    per_step = seconds['steps'] / taken if taken else 0.0
    row = {'session': s.get('session', j + 1), 'state': s.get('state'),
           'start_step': s.get('start_step'), 'step': s.get('step'), 'steps_taken': taken,
           'wall_s': float(s.get('wall_s', 0.0)), 'seconds': seconds,
           'lost_steps': lost, 'lost_s': lost * per_step}
    row['other_s'] = row['wall_s'] - sum(seconds.values())
    out.append(row)
    for c in CAUSES:
      totals[c] += seconds[c]
    wall += row['wall_s']
    lost_s += row['lost_s']
    lost_steps += lost
  productive = totals['steps'] - lost_s
  return {'sessions': out, 'seconds': totals, 'wall_s': wall, 'lost_steps': lost_steps,
          'lost_s': lost_s, 'productive_s': productive,
          'goodput': productive / wall if wall > 0 else None}


def _covered(span: tuple[int, int], later: list[tuple[int, int]]) -> int:
  """How many of the steps (a, b] the `later` spans (each (a', b']) train again."""
  a, b = span
  cuts = sorted((max(a2, a), min(b2, b)) for a2, b2 in later if min(b2, b) > max(a2, a))
  covered, reach = 0, a
  for lo, hi in cuts:
    lo = max(lo, reach)
    if hi > lo:
      covered, reach = covered + hi - lo, hi
  return covered


def _duration(s: float) -> str:
  if s >= 3600:
    return f'{s / 3600:.2f} h'
  if s >= 60:
    return f'{s / 60:.1f} min'
  return f'{s:.1f} s'


def describe(account: dict) -> str:
  """A few lines for the end of a run: goodput, then every cause's share of the wall time."""
  wall = account['wall_s']
  if not wall:
    return 'Goodput: no session of this run recorded its time yet.'
  n = len(account['sessions'])
  lines = [f'Goodput {100 * account["goodput"]:.1f}%: productive steps '
           f'{_duration(account["productive_s"])} of {_duration(wall)} over {n} '
           f'session{"s" if n > 1 else ""}'
           + (f'; {account["lost_steps"]} steps ({_duration(account["lost_s"])}) lost to '
              'restarts (trained again after a stop that came between checkpoints)'
              if account['lost_steps'] else '') + '.']
  parts = [f'{c.replace("_", " ")} {_duration(v)} ({100 * v / wall:.1f}%)'
           for c, v in account['seconds'].items() if v >= 0.05]    # none of a cause not met
  lines.append('  ' + ', '.join(parts))
  return '\n'.join(lines)


def columns(account: dict | None) -> dict:
  """--mode=compare's goodput columns of one run (None where it recorded no time)."""
  if not account or not account['wall_s']:
    return {'goodput': None, 'wall_h': None, 'compile_frac': None, 'data_wait_frac': None,
            'eval_frac': None, 'checkpoint_frac': None, 'lost_frac': None}
  wall, sec = account['wall_s'], account['seconds']
  return {'goodput': account['goodput'], 'wall_h': wall / 3600,
          'compile_frac': sec['compile'] / wall, 'data_wait_frac': sec['data_wait'] / wall,
          'eval_frac': sec['eval'] / wall, 'checkpoint_frac': sec['checkpoint'] / wall,
          'lost_frac': account['lost_s'] / wall}
