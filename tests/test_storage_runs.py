"""Run directories on object storage (issue 36): main.py with --workdir=gs://... against a real
GCS API server (fake-gcs-server, tests/gcs_server.py), compared with the same runs on a local
disk (tests/test_faults.py's tiny config, its reference run and helpers).

  - train on gs://, kill -9 while checkpoint 20 is being written, the same command again: the
    run ends with the reference's per-step losses and parameters, bitwise;
  - analyze, export (to gs://) and compare read it there; the export's weights are byte for byte
    the local reference's export;
  - a missing bucket, an unreachable endpoint and missing credentials are one paragraph before
    any training.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from gated_attention import storage
from gated_attention.runs import rundir
from tests.test_faults import (REPO, STEPS, assert_like_reference, env, kill_when, main_cmd,  # noqa: F401  pylint: disable=unused-import
                               one_paragraph, reference, run_main)

pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


@pytest.fixture(scope='module')
def bucket(gcs_server):
  from tests.conftest import Bucket  # pylint: disable=g-import-not-at-top
  return Bucket(gcs_server)


def _saving(workdir, step):
  """While orbax writes checkpoint `step` on object storage: objects under checkpoints/<step>/
  and no commit_success.txt yet (orbax's mark of a finished step there; no rename)."""
  step_dir = storage.join(workdir, 'checkpoints', str(step))
  def ready():
    names = storage.listdir(step_dir)
    return bool(names) and 'commit_success.txt' not in names
  ready.what = f'mid-save of checkpoint {step} on gs://'
  return ready


@pytest.fixture(scope='module')
def gcs_run(env, reference, bucket, tmp_path_factory):
  """A run trained on gs://, killed mid-save of checkpoint 20, then resumed to the end."""
  del reference
  workdir = bucket.url('runs/g1')
  log = str(tmp_path_factory.mktemp('gcs_run') / 'log')
  kill_when(main_cmd(workdir), env, _saving(workdir, 20), log)
  done = run_main(main_cmd(workdir), env)
  assert done.returncode == 0, done.stderr[-3000:]
  return workdir, done


def test_train_on_gcs_kill9_mid_save_resumes_bitwise(gcs_run, reference):
  workdir, done = gcs_run
  assert 'resuming at step' in done.stdout
  assert_like_reference(workdir, reference)       # per-step losses and parameters, bitwise
  # The files of the run are on the bucket, none under a local folder named after the URL.
  names = storage.listdir(workdir)
  assert {'config.json', 'checkpoints', 'metrics', 'tensorboard'} <= set(names), names
  assert not os.path.exists(os.path.join(REPO, 'gs:'))
  # Metrics as numbered chunk objects, one per checkpoint at least, read back in order.
  chunks = rundir.metrics_chunk_numbers(workdir)
  assert len(chunks) >= 3 and chunks == sorted(chunks)
  rows = rundir.read_metrics(workdir, every_row=True)
  assert [r['step'] for r in rows if r['split'] == 'train'][-1] == STEPS
  assert json.loads(storage.read_bytes(storage.join(workdir, 'config.json')))['train'][
      'steps'] == STEPS


def test_analyze_export_and_compare_read_from_gcs(gcs_run, reference, env, bucket, tmp_path):
  workdir, _ = gcs_run
  analyzed = run_main([sys.executable, 'main.py', '--mode=analyze', f'--workdir={workdir}'], env)
  assert analyzed.returncode == 0, analyzed.stderr[-3000:]
  report = rundir.read_report(workdir)
  assert report['step'] == STEPS and report['workdir'] == workdir
  assert {'report.json', 'f_attn.png', 'attention_maps.npz'} <= set(
      storage.listdir(rundir.analysis_dir(workdir)))
  # Export to gs:// and locally from the reference: the same weights, byte for byte.
  out = bucket.url('exports/g1_hf')
  for w, o in ((workdir, out), (reference.workdir, str(tmp_path / 'hf'))):
    exported = run_main([sys.executable, 'main.py', '--mode=export', f'--workdir={w}',
                         f'--out={o}'], env)
    assert exported.returncode == 0, exported.stderr[-3000:]
  assert storage.read_bytes(storage.join(out, 'model.safetensors')) == (
      tmp_path / 'hf' / 'model.safetensors').read_bytes()
  assert json.loads(storage.read_bytes(storage.join(out, 'config.json'))) == json.loads(
      (tmp_path / 'hf' / 'config.json').read_text())
  # compare, with its output on gs:// too.
  from gated_attention.modes import compare  # pylint: disable=g-import-not-at-top
  table = compare.compare([workdir, reference.workdir], bucket.url('compare'))
  assert 'g1_elementwise' in table
  assert {'compare.md', 'compare.json', 'loss_curves.png'} <= set(
      storage.listdir(bucket.url('compare')))


def _fails_before_training(args, env, *, timeout=120):
  start = time.time()
  done = subprocess.run([sys.executable, 'main.py', '--config=configs/g1_elementwise.py'] + args,
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert done.returncode == 1, (done.stdout, done.stderr)
  one_paragraph(done.stderr)
  assert 'step 1/' not in done.stdout and 'loss' not in done.stdout
  return ' '.join(done.stderr.split()), time.time() - start


def test_missing_bucket_is_one_paragraph_before_training(env, gcs_server):
  del gcs_server                  # the emulator answers; the bucket is not there
  err, _ = _fails_before_training(['--workdir=gs://no-such-bucket-36/run'], env)
  assert 'gs://no-such-bucket-36 ' in err and 'does not exist' in err
  assert 'gcloud storage buckets create' in err


def test_unreachable_endpoint_is_one_paragraph(env):
  err, _ = _fails_before_training(
      ['--workdir=gs://bucket/run'],
      {**env, 'STORAGE_EMULATOR_HOST': 'http://127.0.0.1:9',   # nothing listens there
       'GATED_ATTENTION_STORAGE_TIMEOUT_S': '2'})
  assert 'cannot be reached' in err


def test_missing_credentials_are_one_paragraph(env, tmp_path):
  no_emulator = {k: v for k, v in env.items() if k != 'STORAGE_EMULATOR_HOST'}
  err, _ = _fails_before_training(
      ['--workdir=gs://bucket/run'],
      {**no_emulator, 'GOOGLE_APPLICATION_CREDENTIALS': str(tmp_path / 'missing-key.json')})
  assert 'credentials' in err and 'gcloud auth application-default login' in err


@pytest.mark.slow   # ~13 s more (run with -m slow)
def test_damaged_newest_checkpoint_on_gcs_is_set_aside_and_redone(gcs_run, reference, env,
                                                                   bucket):
  """Flipped bytes in checkpoint 30 of a copy of the gs:// run: the resumed run sets 30 aside as
  30.unusable (a checked server-side copy, then the original deleted: no rename there), goes
  back to 20 and trains 21-30 again, ending bitwise on the reference."""
  workdir = bucket.url('runs/damaged')
  storage.copy_tree(gcs_run[0], workdir)
  step_dir = storage.join(workdir, 'checkpoints', str(STEPS))
  fs, root = storage.filesystem(step_dir)
  data = {f: i['size'] for f, i in fs.find(root + '/state', detail=True).items() if '/d/' in f}
  target = f'gs://{max(data, key=data.get)}'
  raw = bytearray(storage.read_bytes(target))
  raw[len(raw) // 2:len(raw) // 2 + 4] = bytes(b ^ 0x5A for b in raw[len(raw) // 2:][:4])
  storage.write(target, bytes(raw))
  def objects(prefix):
    f, r = storage.filesystem(prefix)
    return {p[len(r):]: size for p, size in f.find(r, detail=True).items()
            for size in [int(size['size'])]}
  before = objects(step_dir)
  done = run_main(main_cmd(workdir), env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'checkpoint {STEPS} is unusable' in done.stdout + done.stderr
  aside = storage.join(workdir, 'checkpoints', f'{STEPS}.unusable')
  assert objects(aside) == before                 # every object of the bad step, kept
  assert storage.read_bytes(aside + target[len(step_dir):]) == bytes(raw)
  assert_like_reference(workdir, reference)


@pytest.mark.slow   # ~30 s: three more main.py commands (run with -m slow)
def test_sample_long_context_and_import_on_gcs(gcs_run, env, bucket):
  """The remaining commands on gs://: sample and long_context read the run there and write
  their reports there; import writes a run directory there that analyze opens."""
  workdir, _ = gcs_run
  sampled = run_main([sys.executable, 'main.py', '--mode=sample', f'--workdir={workdir}',
                      '--prompt=def ', '--max_new_tokens=4'], env)
  assert sampled.returncode == 0 and "--- 'def ' ->" in sampled.stdout, sampled.stderr[-2000:]
  evaluated = run_main([sys.executable, 'main.py', '--mode=long_context', f'--workdir={workdir}',
                        '--config.long_context.lengths=32,64'], env)
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  tags = storage.listdir(storage.join(workdir, 'long_context'))
  assert len(tags) == 1 and {'report.json', 'long_context.md'} <= set(
      storage.listdir(storage.join(workdir, 'long_context', tags[0])))
  imported = bucket.url('runs/imported')
  hf = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied')
  done = run_main([sys.executable, 'main.py', '--mode=import', f'--hf={hf}',
                   f'--workdir={imported}'], env)
  assert done.returncode == 0, done.stderr[-2000:]
  assert rundir.checkpoint_steps(imported) == [0]
  assert rundir.read_config(imported).variant == 'g1_elementwise'


@pytest.mark.parametrize('where', ['local', 'gcs'])
def test_a_failed_import_leaves_nothing_and_a_good_one_names_its_workdir(where, tmp_path,
                                                                         monkeypatch, request):
  """--mode=import whose checkpoint write fails part-way (a refused upload on gs://, a full disk
  locally) removes what it wrote, config.json and the partial step alike, on either storage; the
  same import then succeeds and reports the workdir as given (gs://..., not a local path)."""
  from gated_attention.errors import CheckpointError  # pylint: disable=g-import-not-at-top
  from gated_attention.runs import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  root = (request.getfixturevalue('gcs').url('imports') if where == 'gcs'
          else str(tmp_path / 'imports'))
  storage.makedirs(root)
  storage.write(storage.join(root, 'other.txt'), 'not ours')
  workdir = storage.join(root, 'run')
  hf = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied')
  save = ckpt_lib.Checkpointer.save_params

  def partial_then_fail(self, step, params):
    del params
    storage.makedirs(storage.join(workdir, 'checkpoints', str(step)))
    storage.write(storage.join(workdir, 'checkpoints', str(step), 'part'), b'x' * 100)
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(ckpt_lib.Checkpointer, 'save_params', partial_then_fail)
  with pytest.raises(CheckpointError, match='failed while writing it: OSError.*was removed'):
    interop.import_run(hf, workdir)
  assert storage.listdir(root) == ['other.txt']
  monkeypatch.setattr(ckpt_lib.Checkpointer, 'save_params', save)
  summary = interop.import_run(hf, workdir)
  assert summary['workdir'] == storage.abspath(workdir)
  assert summary['workdir'].startswith('gs://') == (where == 'gcs')
  assert rundir.checkpoint_steps(workdir) == [0]
  with pytest.raises(CheckpointError, match='already holds a run'):
    interop.import_run(hf, workdir)


def test_export_of_a_run_whose_tokenizer_is_on_gcs(gcs, tmp_path):
  """A run trained with --config.data.tokenizer=gs://.../tokenizer.json (the pipeline reads it
  there) exports with that tokenizer's files, byte for byte as from a local copy of them."""
  from gated_attention.runs.hf import convert  # pylint: disable=g-import-not-at-top
  hf = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied')
  config, params = convert.load_hf(hf)
  tok = tmp_path / 'tok'
  tok.mkdir()
  with open(os.path.join(hf, 'tokenizer.json'), 'rb') as f:
    fixture_tokenizer = f.read()
  files = {'tokenizer.json': fixture_tokenizer,
           'special_tokens_map.json': b'{"bos_token": "<|endoftext|>"}\n'}
  for name, data in files.items():
    (tok / name).write_bytes(data)
    storage.write(gcs.url(f'tok/{name}'), data)
  exports = {}
  for where, path in (('local', str(tok / 'tokenizer.json')),
                      ('gcs', gcs.url('tok/tokenizer.json'))):
    config.data.tokenizer = path
    out = tmp_path / f'hf_{where}'
    convert.save_hf(config, params, str(out))
    exports[where] = {p.name: p.read_bytes() for p in out.iterdir()}
  assert exports['gcs'] == exports['local']
  for name, data in files.items():
    assert exports['gcs'][name] == data


def test_import_from_a_model_directory_on_gcs(env, gcs, tmp_path):
  """--mode=import --hf=gs://...: the directory is downloaded, imported and the download deleted;
  the run holds the same parameters as an import of the local directory, and its tokenizer is
  the one on gs:// (the copy it was read from is gone). A prefix with no files is one line."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  hf = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied')
  storage.upload_tree(hf, gcs.url('models/et'))
  workdir = gcs.url('runs/et')
  done = run_main([sys.executable, 'main.py', '--mode=import', f'--hf={gcs.url("models/et")}',
                   f'--workdir={workdir}'], env)
  assert done.returncode == 0, done.stderr[-2000:]
  summary = json.loads(done.stdout[:done.stdout.rindex('}') + 1])
  assert summary['source'] == gcs.url('models/et') and summary['workdir'] == workdir
  assert rundir.read_config(workdir).data.tokenizer == gcs.url('models/et/tokenizer.json')
  interop.import_run(hf, str(tmp_path / 'local'))
  remote, local = rundir.load_run(workdir), rundir.load_run(str(tmp_path / 'local'))
  assert remote.step == local.step == 0
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(remote.params),
               jax.device_get(local.params))
  empty = run_main([sys.executable, 'main.py', '--mode=import', f'--hf={gcs.url("models/none")}',
                    f'--workdir={gcs.url("runs/none")}'], env)
  assert empty.returncode != 0 and 'holds no files' in empty.stderr
  assert storage.listdir(gcs.url('runs/none')) == []


def test_a_reader_sees_the_checkpoints_written_since_it_last_listed(gcs):
  """A long-lived reader (a notebook, the test process of a pod) lists a gs:// run, a trainer
  elsewhere commits a new step, and the next listing shows it: orbax's gcsfs instance caches
  listings (issue 45's gs:// pod test read a run with no checkpoint at all after its trainer
  rotated the ones it had listed)."""
  from google.cloud import storage as gcs_client  # pylint: disable=g-import-not-at-top
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  hf = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied')
  workdir = gcs.url('runs/reader')
  interop.import_run(hf, workdir)
  assert rundir.checkpoint_steps(workdir) == [0]
  bucket = gcs_client.Client(project='test').bucket(gcs.name)
  for blob in list(bucket.list_blobs(prefix='runs/reader/checkpoints/0/')):   # another writer
    bucket.copy_blob(blob, bucket, blob.name.replace('/checkpoints/0/', '/checkpoints/7/'))
  assert rundir.checkpoint_steps(workdir) == [0, 7]
