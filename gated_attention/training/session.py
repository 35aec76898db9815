"""One training session's state, from its start to its close (training/loop.py steps it).

    run = start_run(config, workdir)    # lock, data, compiled steps, state: fresh, a warm start
                                        # (train.init_from) or the latest intact checkpoint
    print(describe_run(run))
    ...                                 # loop.py: steps, evaluations, saves
    close_run(run)                      # prefetch stopped, last save waited for, files, lock

`Run` holds what a session trains with; `check_loop_config` refuses the loop's settings that
cannot work before anything is written. A run saved by N processes x D devices resumes on M x E
(the batches are one global stream; the first line says what changed); one saved before that,
with a data stream per process, resumes with its own process count only.
"""

import dataclasses
import functools
import json

import jax

from gated_attention import input_pipeline
from gated_attention import sharding
from gated_attention import storage
from gated_attention.errors import CheckpointError, ConfigError
from gated_attention.model import transformer as model_lib
from gated_attention.runs import checkpoint as ckpt_lib
from gated_attention.runs import lock as lock_lib
from gated_attention.runs import rundir as workdir_lib
from gated_attention.training import goodput, prefetch, stability
from gated_attention.training import grad_accum as grad_accum_lib
from gated_attention.training import profile as profile_lib
from gated_attention.training import train as train_lib
from gated_attention.training.reporting import MetricsWriter, Progress


def check_loop_config(config):
  tc = config.train
  for name in ('steps', 'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints'):
    if tc[name] <= 0:
      raise ConfigError(f'config.train.{name}={tc[name]} must be positive.')
  if config.data.get('val_batches', 1) <= 0:
    raise ConfigError(f'config.data.val_batches={config.data.val_batches} must be positive: '
                      'every evaluation (and the last step) reads that many held-out batches.')
  if tc.get('stop_timeout', 1) <= 0:
    raise ConfigError(f'config.train.stop_timeout={tc.stop_timeout} must be positive seconds: '
                      'how long a stopping process may take before it exits anyway.')
  stability.check_config(tc)
  profile_lib.check_config(tc)
  depth = config.data.get('device_prefetch', 2)
  if depth < 0:
    raise ConfigError(f'config.data.device_prefetch={depth} must be >= 0 (batches read ahead '
                      'onto the devices while a step runs; 0: none).')


@dataclasses.dataclass
class Run:
  """What one training run holds while it trains."""
  config: object
  workdir: str
  data: object
  setup: train_lib.Setup
  checkpointer: ckpt_lib.Checkpointer
  writer: MetricsWriter
  guard: stability.Guard
  lock: lock_lib.RunLock | None = None
  progress: Progress | None = None
  step: int = 0
  params: object = None
  opt_state: object = None
  lr_scale: float = 1.0
  rollbacks: int = 0
  pending: list = dataclasses.field(default_factory=list)  # (step, device metrics) to check
  per_process_stream: bool = False   # a run saved before issue 45 by several processes
  account: goodput.Account = dataclasses.field(default_factory=goodput.Account)  # time by cause

  @property
  def abstract_state(self) -> dict:
    return {'params': self.setup.abstract_params, 'opt_state': self.setup.abstract_opt}

  def save(self):
    if self.lock is not None:
      self.lock.check()                            # another trainer took the run over
    self.writer.flush()                            # the rows up to it are stored before it
    # The running level ranks the checkpoint for the best-checkpoint rule only while the guard is
    # calm: spike steps do not move the level, so a state taken mid-blow-up would carry the level
    # of the good steps before it (the loop saves only when calm; this keeps the ranking honest
    # whatever calls it).
    level = self.guard.level if self.guard.calm else None
    self.checkpointer.save(
        self.step, {'params': self.params, 'opt_state': self.opt_state}, self.data.train_iter,
        metrics={'loss_level': 1e30 if level is None else float(level)},
        loop_state={'lr_scale': self.lr_scale, 'rollbacks': self.rollbacks,
                    'guard': self.guard.state(), 'topology': _topology(self.setup)},
        per_process_stream=self.per_process_stream)

  def adopt(self, restored: ckpt_lib.Restored):
    """Continue from a restored checkpoint (a warm start gets a fresh optimizer state)."""
    self.step, self.params = restored.step, restored.state['params']
    self.opt_state = (self.setup.init_opt_state(self.params) if restored.warm
                      else restored.state['opt_state'])
    self.lr_scale = restored.loop.get('lr_scale', 1.0)
    self.rollbacks = restored.loop.get('rollbacks', 0)
    self.guard.reset(restored.loop.get('guard'))


def _build_data(config, per_process_stream: bool = False):
  tc = config.train
  data = input_pipeline.build_data(
      config.data, global_batch_size=tc.batch_size, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count(),
      per_process_stream=per_process_stream)
  if data.tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(f'The tokenizer {data.tokenizer.name} has {data.tokenizer.vocab_size} '
                      f'tokens but config.model.vocab_size={config.model.vocab_size}; raise '
                      'config.model.vocab_size to at least the tokenizer size.')
  return data


def _per_process_streams(workdir: str) -> bool:
  """Whether the run was saved by several processes with a data stream each (before issue
  45): then it resumes so, with that process count only (refused otherwise, before anything is
  written). Every other run reads one global stream and resumes on any number of processes."""
  count = ckpt_lib.saved_stream_count(workdir)
  if count is not None and count != jax.process_count():
    raise CheckpointError(
        f'{workdir} was saved by {count} processes, each reading its own data stream (the data '
        'order of runs saved before elastic resumption); this run has '
        f'{jax.process_count()} process(es). Resume it with {count} processes (its checkpoints '
        'are intact and were left as they are), or start a new --workdir with '
        f'--config.train.init_from={workdir} (its parameters, a fresh data order).')
  return count is not None


def _topology(setup) -> dict:
  return {'processes': jax.process_count(), 'devices': jax.device_count(),
          'mesh': {k: int(v) for k, v in setup.mesh.shape.items()}}


def _say_topology(restored: ckpt_lib.Restored, setup):
  """The first line of a run resumed on another slice: what changed (the batches do not)."""
  saved, now = restored.loop.get('topology'), _topology(setup)
  if saved is None or (saved['processes'], saved['devices']) == (now['processes'],
                                                                   now['devices']):
    return
  say(f'Resuming step {restored.step} on {now["processes"]} process(es) x '
       f'{now["devices"] // now["processes"]} devices (mesh {now["mesh"]}); it was saved by '
       f'{saved["processes"]} x {saved["devices"] // saved["processes"]} (mesh {saved["mesh"]}). '
       'The batches go on as they would have; the losses agree to float rounding (another '
       'reduction order).')


def _check_init_from(source: str, abstract_params: dict):
  """A warm start's source has a checkpoint of this config's shapes (before anything is written
  for the new run, so the corrected command starts clean)."""
  if not workdir_lib.checkpoint_steps(source):
    raise CheckpointError(f'--config.train.init_from={source}: no checkpoint there.')
  source_ckpt = ckpt_lib.Checkpointer(source, read_only=True)
  try:
    diffs = source_ckpt.shape_differences(source_ckpt.all_steps()[-1], abstract_params)
  finally:
    source_ckpt.close()
  if diffs:
    raise CheckpointError(
        f'--config.train.init_from={source} holds a model of other shapes than this config: '
        f'{ckpt_lib.summarize_differences(diffs)}. A warm start copies the parameters, so the model settings '
        f'must be that run\'s (--config=configs/from_run.py:{source} has them), or drop '
        'init_from to train from scratch.')


def _init_from(run: Run, source: str):
  """A fresh run starting from another run's latest parameters (train.init_from)."""
  step, run.params = run.setup.restore(source, warn=say)    # the factory's verified restore
  run.opt_state = run.setup.init_opt_state(run.params)
  say(f'Initialised from {source} (step {step}): parameters only, fresh optimizer and data.')


def _remote_data(data_cfg) -> list[str]:
  """The data paths on object storage: data.path, and each data.mixture entry's."""
  entries = (data_cfg.get('mixture') or {}).values()
  paths = [data_cfg.get('path', '')] + [entry.get('path', '') for entry in entries]
  return [p for p in paths if p and storage.is_remote(p)]


def data_bound(config, what: str) -> tuple[float, str] | None:
  """(seconds, paragraph): the bound on one batch of `what` read from object storage, whose
  endpoint may stop answering (issue 57: an evaluation's reads waited for as long as it was
  down), storage.waits.REQUEST_S; None for data that is not on object storage."""
  remote = _remote_data(config.data)
  if not remote:
    return None
  seconds = storage.waits.REQUEST_S
  return seconds, (
      f'Reading the {what} from {", ".join(remote)} gave no batch within {seconds:g} s: the '
      'storage stopped answering (or is far slower than it should be). The checkpoints already '
      'written are intact; once the storage answers, run the same command again to resume from '
      'the latest one. (GATED_ATTENTION_STORAGE_REQUEST_S sets this bound.)')


def say(text: str):
  if jax.process_index() == 0:
    print(text, flush=True)


def start_run(config, workdir: str, setup: train_lib.Setup | None = None,
              account: goodput.Account | None = None) -> Run:
  """Data, mesh, compiled steps; the state from scratch, a warm start, or the latest intact
  checkpoint. `setup`: one already built for this config (seeds.py shares one among seeds);
  None builds it. `account`: the session's time account, begun at the process start (None: a
  new one)."""
  check_loop_config(config)
  workdir_lib.check_workdir(workdir)
  lock = lock_lib.RunLock(workdir)
  lock.acquire(warn=say)                          # one trainer per run, before any write
  try:
    return _start_locked(config, workdir, lock, setup, account or goodput.Account())
  except BaseException:
    lock.release()
    raise


def _start_locked(config, workdir: str, lock: lock_lib.RunLock,
                  setup: train_lib.Setup | None, account: goodput.Account) -> Run:
  """start_run's work once this trainer holds the run directory's lock."""
  tc = config.train
  per_process = _per_process_streams(workdir)
  data = _build_data(config, per_process_stream=per_process)
  auto_record = None
  if setup is None:
    mesh = sharding.build_mesh(config.mesh)
    if grad_accum_lib.is_auto(config):   # compiled on these devices until one fits
      config, setup, auto_record = grad_accum_lib.resolve(config, workdir, mesh, say=say)
    setup = setup or train_lib.Setup(config, mesh)
  data.train_iter = prefetch.DevicePrefetch(
      data.train_iter, functools.partial(setup.global_batch, whole=not per_process),
      config.data.get('device_prefetch', 2), bound=data_bound(config, 'training data'))
  if tc.init_from and not ckpt_lib.step_dirs(workdir):   # before anything is written
    _check_init_from(tc.init_from, setup.abstract_params)
  checkpointer = ckpt_lib.Checkpointer(workdir, every=tc.checkpoint_every,
                                       keep=tc.keep_checkpoints)
  latest = checkpointer.latest_step()
  if latest is not None and workdir_lib.read_saved_config(workdir) is None:
    # Checkpoints without their config.json: another model shape is refused by its parameters'
    # shapes before a config.json is written for it (with one, the configs are compared).
    checkpointer.check_shapes(latest, setup.abstract_params)
  workdir_lib.check_or_write_config(
      workdir, config, resuming_data=latest is not None and checkpointer.has_data(latest))
  if auto_record is not None:
    workdir_lib.write_grad_accum(workdir, auto_record)
  run = Run(config, workdir, data, setup, checkpointer, MetricsWriter(workdir),
             stability.Guard(tc, config.model.vocab_size), lock=lock,
             per_process_stream=per_process, account=account)
  account.lap('startup')
  restored = checkpointer.restore_latest(run.abstract_state, data.train_iter, warn=say)
  account.lap('restore')
  if restored is not None:
    _say_topology(restored, setup)
    run.adopt(restored)
  elif tc.init_from:
    _init_from(run, tc.init_from)
  else:
    run.params, run.opt_state = setup.init(config.seed)
  run.progress = Progress(run.step, tc.steps)
  return run


def describe_run(run: Run) -> str:
  config = run.config
  report = model_lib.param_report(run.setup.model_cfg)
  return (f'{config.variant} ({config.scale}): {report["total"]:,} parameters '
          f'({report["active"]:,} active), mesh {dict(run.setup.mesh.shape)}, '
          f'{"resuming at step " + str(run.step) if run.step else "starting"} in {run.workdir}; '
          f'data: {json.dumps(run.data.describe())}')


def close_run(run: Run, raise_errors: bool = True):
  """Stops the prefetch thread, waits for the last save, closes the files, frees the lock: each
  step runs whatever the ones before it raised (a full disk fails the files' close, and the lock
  is freed all the same); the first error is raised afterwards if `raise_errors`."""
  first = None
  for close in (run.data.train_iter.shutdown, run.checkpointer.close, run.progress.close,
                run.writer.close, run.lock.release):
    try:
      close()
    except BaseException as e:  # pylint: disable=broad-except
      first = first or e
  if first is not None and raise_errors:
    raise first
