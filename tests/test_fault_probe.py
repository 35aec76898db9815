"""The fault probe (issue 37): damage and bad input the way a user meets them, through the real
commands, by category (run directory, Hugging Face, data and config, imported runs, resources,
the experiment runner).

Each main.py case builds its damage in a fresh folder, runs the command (forked from a server
that has imported the project once, as the experiment runner starts its commands: the process is
main.py's, without ~3 s of imports) and asserts:
  - the exit status;
  - the output is one paragraph naming the problem (the message's words, the `--verbosity=1` hint
    line once), and holds no "Traceback";
  - the run directory's files are byte for byte what they were (its `logs/` aside: a training
    command writes the libraries' log there);
  - what the case adds (nothing set aside, no workdir left, the exported ids ...).
The base run is an import of tests/fixtures/hf/elementwise_tied (a checkpoint at step 0, a BPE
tokenizer): no compilation. docs/faults.md ("The probe") lists the cases and the counts.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
from typing import Callable

import numpy as np
import pytest

from experiments import processes
from experiments import run as runner
from gated_attention.runs import rundir
from gated_attention.runs.hf import interop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(REPO, 'tests', 'fixtures', 'hf', 'elementwise_tied')
HINT = '(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)'
TINY = ['--config.model.num_layers=2', '--config.model.hidden_size=64',
        '--config.model.head_dim=16', '--config.model.ffn_size=128', '--config.data.seq_len=32',
        '--config.train.batch_size=8', '--config.data.val_batches=2']
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


@dataclasses.dataclass
class Case:
  """argv: main.py's arguments; watch: folders whose files must not change; rc: the exit status;
  match: words of the message (whitespace-insensitive regex); check: more assertions(tmp)."""
  argv: list
  rc: int = 1
  match: str = ''
  watch: list = dataclasses.field(default_factory=list)
  check: Callable | None = None


def snapshot(folder: str) -> dict:
  """{relative path: sha256 or 'dir'} of everything under `folder`, logs/ aside."""
  out = {}
  for root, dirs, files in os.walk(folder):
    rel = os.path.relpath(root, folder)
    if rel.split(os.sep)[0] == rundir.LOGS_DIR:
      continue
    for d in dirs:
      out[os.path.normpath(os.path.join(rel, d))] = 'dir'
    for f in files:
      path = os.path.join(root, f)
      with open(path, 'rb') as fh:
        out[os.path.normpath(os.path.join(rel, f))] = hashlib.sha256(fh.read()).hexdigest()
  out.pop(rundir.LOGS_DIR, None)
  return out


def flat(text: str) -> str:
  return ' '.join(text.split())


def assert_one_paragraph(text: str, match: str):
  """No traceback; the hint line once; the message (the lines from 'Error' or the first line
  of the failure to the hint) at most 10 lines (100 columns each); `match` in it."""
  assert 'Traceback' not in text, text
  assert text.count(HINT) == 1, text
  lines = text[:text.index(HINT)].rstrip('\n').split('\n')
  start = max((i for i, line in enumerate(lines) if line.startswith('Error')), default=None)
  assert start is not None, text
  message = lines[start:]
  assert len(message) <= 10 and all(line.strip() for line in message), text
  assert re.search(match, flat(' '.join(message))), (match, text)


# --- the base run and the damage -------------------------------------------------------------

@pytest.fixture(scope='module')
def base(tmp_path_factory) -> str:
  """An imported run: config.json, checkpoint 0 (parameters), the fixture's tokenizer.json."""
  workdir = str(tmp_path_factory.mktemp('base') / 'run')
  interop.import_run(HF, workdir)
  return workdir


def copy(base: str, tmp) -> str:
  dst = str(tmp / 'run')
  shutil.copytree(base, dst)
  return dst


def hf_copy(tmp, name='hf') -> str:
  dst = str(tmp / name)
  shutil.copytree(HF, dst)
  return dst


def edit_json(path: str, **changes):
  with open(path) as f:
    d = json.load(f)
  d.update(changes)
  with open(path, 'w') as f:
    json.dump(d, f)


def _raw_safetensors(path: str, header, data: bytes = b''):
  raw = json.dumps(header).encode()
  with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(raw)) + raw + data)


def _header(path: str) -> tuple[dict, bytes]:
  with open(path, 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    return json.loads(f.read(n)), f.read()


def mount_tmpfs(path, size: str, read_only: bool = False):
  """A tmpfs at `path` (made read-only after `fill(path)` if asked), or a skip where mounting
  is not permitted (CI containers without CAP_SYS_ADMIN)."""
  os.makedirs(path, exist_ok=True)
  done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                        capture_output=True, text=True, check=False)
  if done.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {done.stderr.strip()}')


def remount_read_only(path):
  subprocess.run(['mount', '-o', 'remount,ro', str(path)], check=True)


def umount(path):
  subprocess.run(['umount', '-l', str(path)], check=False)


# --- the cases -------------------------------------------------------------------------------
# Each returns a Case; `t` is the case's folder (pathlib), `b` the base run.

def _config_json(text):
  def make(t, b):
    run = copy(b, t)
    with open(os.path.join(run, 'config.json'), 'w') as f:
      f.write(text)
    return Case(['--mode=analyze', f'--workdir={run}'], watch=[run],
                match={'[1, 2]': 'holds a JSON list', '{"model": null}': 'model is null',
                       }.get(text, r'config\.json'))
  return make


def _num_layers_string(t, b):
  run = copy(b, t)
  edit_json(os.path.join(run, 'config.json'), model={'num_layers': 'two'})
  return Case(['--mode=analyze', f'--workdir={run}'], watch=[run],
              match='model.num_layers is "two", not a number')


def _truncated_config(t, b):
  run = copy(b, t)
  path = os.path.join(run, 'config.json')
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2])
  return Case(['--mode=analyze', f'--workdir={run}'], watch=[run], match='is unreadable')


def _no_config(t, b):
  run = copy(b, t)
  os.remove(os.path.join(run, 'config.json'))
  return Case(['--mode=analyze', f'--workdir={run}'], watch=[run], match='has no config.json')


def _no_config_other_shape(t, b):
  """Item 1: a shape mismatch is not corruption: nothing set aside, the setting named."""
  run = copy(b, t)
  os.remove(os.path.join(run, 'config.json'))

  def check(_):
    assert not [n for n in os.listdir(os.path.join(run, 'checkpoints')) if 'unusable' in n]
  return Case(['--config=configs/g1_elementwise.py', f'--workdir={run}', *TINY,
               '--config.train.steps=2'], watch=[run], check=check,
              match='model.hidden_size: checkpoint 48, this config 64.*config.json missing or '
              'replaced')


def _checkpoints_a_file(t, b):
  run = copy(b, t)
  shutil.rmtree(os.path.join(run, 'checkpoints'))
  with open(os.path.join(run, 'checkpoints'), 'w') as f:
    f.write('not a folder')
  return Case(['--config=configs/from_run.py:' + run, f'--workdir={run}'], watch=[run],
              match='checkpoints')


def _wrong_kind(name):
  def make(t, b):
    run = copy(b, t)
    path = os.path.join(run, name)
    if os.path.isfile(path):
      os.remove(path)
    os.makedirs(path)
    return Case(['--config=configs/from_run.py:' + run, f'--workdir={run}'], watch=[run],
                match=re.escape(name))
  return make


def _from_run_corrupt(t, b):
  run = copy(b, t)
  with open(os.path.join(run, 'config.json'), 'w') as f:
    f.write('{bad')
  return Case([f'--config=configs/from_run.py:{run}', '--mode=params'], watch=[run],
              match='is not valid JSON')


def _init_from_other_shape(t, b):
  new = str(t / 'new')
  return Case(['--config=configs/g1_elementwise.py', f'--workdir={new}', *TINY,
               f'--config.train.init_from={b}', '--config.train.steps=2'], watch=[b],
              check=lambda _: not os.path.exists(new),
              match='init_from=.* holds a model of other shapes than this config: '
              'model.hidden_size: checkpoint 48, this config 64')


def _missing_step(t, b):
  run = copy(b, t)
  return Case(['--mode=sample', f'--workdir={run}', '--prompt=ab', '--step=7'], watch=[run],
              match='7')


def _truncated_report(t, b):
  a, c = copy(b, t / 'a'), copy(b, t / 'c')
  for run in (a, c):
    os.makedirs(os.path.join(run, 'analysis'), exist_ok=True)
    with open(os.path.join(run, 'analysis', 'report.json'), 'w') as f:
      json.dump({'variant': 'g1_elementwise', 'step': 0, 'f_attn_mean': 0.1}, f)
  with open(os.path.join(c, 'analysis', 'report.json'), 'w') as f:
    f.write('{"variant": "g1_elementwise", "f_at')
  return Case(['--mode=compare', a, c], watch=[a, c],
              match='Run the analysis again: python main.py --mode=analyze')


def _workdir_a_file(t, b):
  path = str(t / 'file')
  with open(path, 'w') as f:
    f.write('x')
  return Case(['--mode=analyze', f'--workdir={path}'], match='is not a directory')


# Hugging Face folders

def _import(hf, t):
  return ['--mode=import', f'--hf={hf}', f'--workdir={t / "imported"}']


def _index_outside(t, b):
  hf = hf_copy(t)
  shutil.move(os.path.join(hf, 'model.safetensors'), str(t / 'outside.safetensors'))
  header, _ = _header(str(t / 'outside.safetensors'))
  with open(os.path.join(hf, 'model.safetensors.index.json'), 'w') as f:
    json.dump({'weight_map': {k: '../outside.safetensors' for k in header
                              if k != '__metadata__'}}, f)
  return Case(_import(hf, t), watch=[hf], match='not a file in',
              check=lambda _: not os.path.exists(t / 'imported'))


def _safetensors_entry(change):
  def make(t, b):
    hf = hf_copy(t)
    path = os.path.join(hf, 'model.safetensors')
    header, data = _header(path)
    names = sorted(k for k in header if k != '__metadata__')
    change(header, names)
    _raw_safetensors(path, header, data)
    return Case(_import(hf, t), watch=[hf], match='data_offsets|overlap')
  return make


def _negative(header, names):
  header[names[0]]['data_offsets'] = [-8, header[names[0]]['data_offsets'][1]]


def _overlap(header, names):
  header[names[1]]['data_offsets'] = list(header[names[0]]['data_offsets'])


def _header_a_list(t, b):
  hf = hf_copy(t)
  _raw_safetensors(os.path.join(hf, 'model.safetensors'), [1, 2])
  return Case(_import(hf, t), watch=[hf], match='not an object')


def _index(text):
  def make(t, b):
    hf = hf_copy(t)
    with open(os.path.join(hf, 'model.safetensors.index.json'), 'w') as f:
      f.write(text)
    return Case(_import(hf, t), watch=[hf], match='index|weight_map')
  return make


def _hf_config(**changes):
  def make(t, b):
    hf = hf_copy(t)
    edit_json(os.path.join(hf, 'config.json'), **changes)
    key = next(iter(changes))
    return Case(_import(hf, t), watch=[hf], match=f'config.json: {key}=')
  return make


def _hf_config_a_list(t, b):
  hf = hf_copy(t)
  with open(os.path.join(hf, 'config.json'), 'w') as f:
    f.write('[]')
  return Case(_import(hf, t), watch=[hf], match='config.json')


def _hf_generation_config_a_list(t, b):
  hf = hf_copy(t)
  with open(os.path.join(hf, 'generation_config.json'), 'w') as f:
    f.write('[1]')
  return Case(_import(hf, t), watch=[hf], match='generation_config.json holds a JSON list')


def _hf_missing(t, b):
  return Case(_import(str(t / 'nowhere'), t), match='nowhere')


def _export_not_empty(t, b):
  out = t / 'out'
  out.mkdir()
  (out / 'keep.txt').write_text('mine')
  return Case(['--mode=export', f'--workdir={b}', f'--out={out}'], watch=[b, str(out)],
              match='not an empty directory')


def _export_symlink(t, b):
  """A symlink to an empty folder: the export is written where it points."""
  (t / 'target').mkdir()
  os.symlink(t / 'target', t / 'link')

  def check(_):
    assert os.path.islink(t / 'link')
    assert 'model.safetensors' in os.listdir(t / 'target')
  return Case(['--mode=export', f'--workdir={b}', f'--out={t / "link"}'], rc=0, watch=[b],
              check=check)


def _export_read_only(t, b):
  mount_tmpfs(t / 'ro', '1m')
  remount_read_only(t / 'ro')
  return Case(['--mode=export', f'--workdir={b}', f'--out={t / "ro" / "out"}'], watch=[b],
              match='Cannot write the export to .*Read-only file system')


def _import_full_disk(t, b):
  mount_tmpfs(t / 'small', '64k')
  return Case(['--mode=import', f'--hf={HF}', f'--workdir={t / "small" / "run"}'],
              match='The import needs about .* MiB are free',
              check=lambda _: os.listdir(t / 'small') == [])


# Data and config

def _corrupt_tokenizer_config(t, b):
  tok = t / 'tok'
  tok.mkdir()
  shutil.copy(os.path.join(HF, 'tokenizer.json'), tok / 'tokenizer.json')
  (tok / 'tokenizer_config.json').write_text('{"bos_token": ')
  new = t / 'new'
  return Case(['--config=configs/g1_elementwise.py', f'--workdir={new}', *TINY,
               f'--config.data.tokenizer={tok / "tokenizer.json"}'], watch=[str(tok)],
              match='tokenizer_config.json .* is not valid JSON',
              check=lambda _: not new.exists())


def _new_run(extra, match, config='configs/g1_elementwise.py'):
  def make(t, b):
    new = t / 'new'
    return Case([f'--config={config}', f'--workdir={new}', *TINY, *extra], match=match,
                check=lambda _: not new.exists())
  return make


def _raising_config(t, b):
  bad = t / 'bad.py'
  bad.write_text('def get_config(arg=None):\n  raise RuntimeError("boom in config")\n')
  return Case([f'--config={bad}', '--mode=params'],
              match='the config file raised RuntimeError: boom in config')


def _misspelt_field(t, b):
  """A variant file that sets a field that does not exist (ml_collections adds it): refused when
  the run starts, naming the field and the one meant, before anything is written (issue 38)."""
  bad = t / 'typo.py'
  bad.write_text('from gated_attention.config import scales\n\n\ndef get_config(scale="tiny"):\n'
                 '  c = scales.get_config(scale)\n  c.train.stepz = 10\n  return c\n')
  new = t / 'new'
  return Case([f'--config={bad}', f'--workdir={new}'],
              match=r'train\.stepz \(did you mean train\.steps\?\)',
              check=lambda _: not new.exists())


# Imported runs

def _no_tokenizer_run(t):
  hf = hf_copy(t)
  os.remove(os.path.join(hf, 'tokenizer.json'))
  run = str(t / 'imported')
  interop.import_run(hf, run)
  return run


def _no_tokenizer(mode):
  def make(t, b):
    run = _no_tokenizer_run(t)
    prompt = ['--prompt=ab'] if mode == 'sample' else []   # a flag only sample takes
    return Case([f'--mode={mode}', f'--workdir={run}', *prompt], watch=[run],
                match='records no tokenizer .* --config.data.tokenizer=byte')
  return make


def _export_ids(t, b):
  """Item 11: an imported BPE run's export names its BOS (config.json, generation_config.json,
  tokenizer_config.json) as the project's sampling uses it."""
  out = t / 'out'

  def check(_):
    from gated_attention.input_pipeline import make_tokenizer  # pylint: disable=g-import-not-at-top
    bos = make_tokenizer(os.path.join(HF, 'tokenizer.json')).bos_id
    for name in ('config.json', 'generation_config.json'):
      cfg = json.loads((out / name).read_text())
      assert (cfg['bos_token_id'], cfg['eos_token_id']) == (bos, bos), (name, cfg)
    tok_cfg = json.loads((out / 'tokenizer_config.json').read_text())
    assert tok_cfg['bos_token'] == '<s>'
    transformers = pytest.importorskip('transformers')
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok.bos_token_id == bos
  return Case(['--mode=export', f'--workdir={b}', f'--out={out}'], rc=0, watch=[b], check=check)


# Resources

def _analyze_read_only(t, b):
  mount_tmpfs(t / 'ro', '4m')
  run = str(t / 'ro' / 'run')
  shutil.copytree(b, run)
  remount_read_only(t / 'ro')
  return Case(['--mode=analyze', f'--workdir={run}'], watch=[run],
              match='Cannot write the analysis to .*Read-only file system.* --out=DIR')


CASES = {
    # run directory
    'config.json a list': _config_json('[1, 2]'),
    'config.json "model": null': _config_json('{"model": null}'),
    'config.json a string for a number': _num_layers_string,
    'config.json truncated': _truncated_config,
    'config.json missing': _no_config,
    'config.json missing, another model shape': _no_config_other_shape,
    'checkpoints a file': _checkpoints_a_file,
    'metrics.jsonl a folder': _wrong_kind('metrics.jsonl'),
    'trainer.lock a folder': _wrong_kind('trainer.lock'),
    'from_run.py on a corrupt config.json': _from_run_corrupt,
    'init_from another shape': _init_from_other_shape,
    'a step that does not exist': _missing_step,
    'truncated report.json in compare': _truncated_report,
    'workdir a file': _workdir_a_file,
    # Hugging Face
    'index maps to ../outside': _index_outside,
    'negative data_offsets': _safetensors_entry(_negative),
    'overlapping data_offsets': _safetensors_entry(_overlap),
    'safetensors header a list': _header_a_list,
    'index not JSON': _index('{not json'),
    'index weight_map a list': _index('{"weight_map": ["model.safetensors"]}'),
    'HF config.json: string rms_norm_eps': _hf_config(rms_norm_eps='1e-6'),
    'HF config.json: string num_key_value_heads': _hf_config(num_key_value_heads='2'),
    'HF config.json: "yes" for a bool': _hf_config(tie_word_embeddings='yes'),
    'HF config.json: string hidden_size': _hf_config(hidden_size='48'),
    'HF config.json a list': _hf_config_a_list,
    'HF generation_config.json a list': _hf_generation_config_a_list,
    '--hf missing': _hf_missing,
    'export into a non-empty folder': _export_not_empty,
    'export to a symlinked folder': _export_symlink,
    'export to a read-only folder': _export_read_only,
    'import to a full disk': _import_full_disk,
    # data and config
    'corrupt tokenizer_config.json': _corrupt_tokenizer_config,
    'data.val_batches=0': _new_run(['--config.data.val_batches=0'],
                                   'config.data.val_batches=0 must be positive'),
    'unknown override': _new_run(['--config.train.stepz=3'], 'stepz'),
    'missing data.path': _new_run(['--config.data.source=text', '--config.data.path=/no/such'],
                                  '/no/such'),
    'missing tokenizer file': _new_run(['--config.data.tokenizer=/no/tok.json'], '/no/tok.json'),
    'heads that do not divide': _new_run(['--config.model.num_heads=3',
                                          '--config.model.num_kv_heads=2'], 'multiple of'),
    'config file that raises': _raising_config,
    'config file that sets a misspelt field': _misspelt_field,
    # imported runs
    'sample, imported without tokenizer': _no_tokenizer('sample'),
    'analyze, imported without tokenizer': _no_tokenizer('analyze'),
    'export of an imported BPE run: BOS ids': _export_ids,
    # resources
    'analyze on a read-only filesystem': _analyze_read_only,
}


@pytest.mark.parametrize('name', list(CASES))
def test_probe(name, base, tmp_path):
  mounts = []
  try:
    case = CASES[name](tmp_path, base)
    mounts = [p for p in (tmp_path / 'ro', tmp_path / 'small') if p.exists()]
    before = {w: snapshot(w) for w in case.watch}
    log = str(tmp_path / 'command.log')
    rc, _ = processes.call(['main.py', *case.argv], log)   # pylint: disable=protected-access
    with open(log) as f:
      text = f.read()
    assert rc == case.rc, text
    if case.rc:
      assert_one_paragraph(text, case.match)
    else:
      assert 'Traceback' not in text and 'Error' not in text, text
    for w, files in before.items():
      assert snapshot(w) == files, f'{w} changed'
    if case.check is not None:
      assert case.check(tmp_path) is not False
  finally:
    for m in mounts:
      umount(m)


def test_probe_load_run_opens_an_import_without_tokenizer(tmp_path):
  """Item 11: load_run (the notebook's way in) opens the parameters of a run with no tokenizer."""
  run = _no_tokenizer_run(tmp_path)
  opened = rundir.load_run(run)
  assert opened.step == 0 and opened.tokenizer is None
  with open(os.path.join(HF, 'model.safetensors'), 'rb'):
    pass
  assert np.all(np.isfinite(np.asarray(opened.params['embed']['embedding'])))


# --- the experiment runner (in process: its main returns the exit status) ---------------------

RUNNER_CASES = {
    'syntax error': ('SEEDS = [0\nVARIANTS = ["baseline"]\n', r'does not parse: .* at line 1'),
    'exception at import': ('import no_such_module_here\nVARIANTS = ["baseline"]\n',
                            r'raised ModuleNotFoundError when it was read \(line 1'),
    'seeds not integers': ('VARIANTS = ["baseline"]\nSEEDS = ["a", 1.5]\n',
                           'SEEDS must be a list of distinct integers'),
    'seeds of bools': ('VARIANTS = ["baseline"]\nSEEDS = [True]\n',
                       'SEEDS must be a list of distinct integers'),
    'OVERRIDES a list': ('VARIANTS = ["baseline"]\nOVERRIDES = [("train.steps", 3)]\n',
                         'OVERRIDES must be a dict'),
    'OVERRIDES value a list': ('VARIANTS = ["baseline"]\nOVERRIDES = {"train.steps": [3]}\n',
                               r"OVERRIDES\['train.steps'\] = \[3\] is a list"),
    'OVERRIDES unknown key': ('VARIANTS = ["baseline"]\nOVERRIDES = {"train.stepz": 3}\n',
                              r"names \['train.stepz'\]"),
    'GRID value not a list': ('VARIANTS = ["baseline"]\nGRID = {"train.learning_rate": 1e-3}\n',
                              'GRID must be a dict'),
    'VARIANTS a string': ('VARIANTS = "baseline"\n', 'VARIANTS must be a list of names'),
    'POINT_NAMES not one per point': ('VARIANTS = ["baseline"]\nPOINTS = [{}, {"train.steps": 3}]'
                                      '\nPOINT_NAMES = ["a"]\n',
                                      'POINT_NAMES must give each of the 2 POINTS'),
}


@pytest.mark.parametrize('name', list(RUNNER_CASES))
def test_probe_runner(name, tmp_path, capsys):
  text, match = RUNNER_CASES[name]
  path = tmp_path / 'experiment.py'
  path.write_text(text)
  rc = runner.main([str(path), '--print-commands', '--out', str(tmp_path / 'out')])
  err = capsys.readouterr().err
  assert rc == 2, err
  assert 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
  assert re.search(match, err), (match, err)
  assert not (tmp_path / 'out').exists()


# --- a disk that fills while the run trains ----------------------------------------------------

def test_probe_closing_on_a_full_disk_frees_the_lock(tmp_path):
  """Item 10: the close after a failed metrics write failed itself (buffered rows, ENOSPC) and
  the lock was left behind; each close step now runs and the first error is the one raised."""
  from gated_attention.runs import lock as lock_lib  # pylint: disable=g-import-not-at-top
  from gated_attention.training import loop  # pylint: disable=g-import-not-at-top
  lock = lock_lib.RunLock(str(tmp_path))
  lock.acquire()
  assert os.path.exists(lock.path)
  calls = []

  def fail(what):
    def close():
      calls.append(what)
      raise OSError(28, f'No space left on device ({what})')
    return close
  run = type('R', (), {})()
  run.data = type('D', (), {'train_iter': type('I', (), {
      'shutdown': lambda: calls.append('iter')})})
  run.checkpointer = type('C', (), {'close': lambda: calls.append('ckpt')})
  run.progress = type('P', (), {'close': lambda: calls.append('progress')})
  run.writer = type('W', (), {'close': fail('writer')})
  run.lock = lock
  loop.close_run(run, raise_errors=False)
  assert calls == ['iter', 'ckpt', 'progress', 'writer']
  assert not os.path.exists(lock.path)
  lock.acquire()
  with pytest.raises(OSError, match='writer'):
    loop.close_run(run)
  assert not os.path.exists(lock.path)


@pytest.mark.slow   # one compilation of the training step (~20 s here)
def test_probe_a_disk_that_fills_while_training(tmp_path):
  """Item 10, for real: a tmpfs fills after the run has started (rows are written every step);
  the run stops with one paragraph, the lock is gone, and the half-written last row is ended
  before the next run's first one."""
  mount_tmpfs(tmp_path / 'small', '96k')
  try:
    run = str(tmp_path / 'small' / 'run')
    log = str(tmp_path / 'command.log')
    rc, _ = processes.call(['main.py', '--config=configs/g1_elementwise.py', f'--workdir={run}',
                          *TINY, '--config.train.steps=5000', '--config.train.log_every=1',
                          '--config.train.eval_every=5000',
                          '--config.train.checkpoint_every=5000'], log)
    text = open(log).read()
    assert rc == 1, text
    assert_one_paragraph(text, 'Writing the metrics of step .* No space left on device')
    assert not os.path.exists(os.path.join(run, rundir.LOCK_FILE)), os.listdir(run)
  finally:
    umount(tmp_path / 'small')
