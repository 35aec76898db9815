"""pyproject.toml: the wheel holds one package, gated_attention (the repository's input_pipeline/
and configs/ inside it, no generic top-level name), and the console command; the installed
command does what `python main.py` does, from outside the repository."""

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ('gated_attention', 'input_pipeline', 'configs')   # copied to build the wheel
LINKED = ('input_pipeline', 'configs')   # gated_attention/<name> -> ../<name>


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """(wheel path, --target directory it is installed into)."""
  root = tmp_path_factory.mktemp('packaging')
  src = root / 'src'             # a copy: setuptools builds in the source tree (build/, egg-info)
  for name in ('pyproject.toml', 'README.md', 'requirements.txt'):
    os.makedirs(src, exist_ok=True)
    shutil.copy(os.path.join(ROOT, name), src / name)
  for folder in FOLDERS:          # the links as links: the wheel must follow them
    shutil.copytree(os.path.join(ROOT, folder), src / folder, symlinks=True,
                    ignore=shutil.ignore_patterns('__pycache__'))
  pip = [sys.executable, '-m', 'pip', '-q', '--disable-pip-version-check']
  subprocess.run(pip + ['wheel', '--no-deps', '--no-build-isolation', str(src), '-w', str(root)],
                 check=True, capture_output=True, timeout=600)
  wheel, = glob.glob(str(root / '*.whl'))
  target = root / 'site'
  subprocess.run(pip + ['install', '--no-deps', '--target', str(target), wheel], check=True,
                 capture_output=True, timeout=600)
  return wheel, target


def test_the_wheel_holds_every_module_and_the_command(installed):
  wheel, _ = installed
  names = set(zipfile.ZipFile(wheel).namelist())
  for folder in FOLDERS:
    for d, _, files in os.walk(os.path.join(ROOT, folder)):
      for f in files:
        if f.endswith('.py'):
          rel = os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, '/')
          if folder in LINKED:
            rel = f'gated_attention/{rel}'
          assert rel in names, f'{rel} is not in {os.path.basename(wheel)}'
  tops = {n.split('/')[0] for n in names if not n.split('/')[0].endswith('.dist-info')}
  assert tops == {'gated_attention'}, tops
  entry, = (n for n in names if n.endswith('entry_points.txt'))
  text = zipfile.ZipFile(wheel).read(entry).decode()
  assert 'gated-attention = gated_attention.cli:run' in text


def test_the_installed_command_is_main_py(installed, tmp_path):
  """`gated-attention --mode=params` from a directory without configs/ prints what `python
  main.py --mode=params` prints in the repository, default config and a named one alike; the
  installed copy is the one imported."""
  _, target = installed
  env = dict(os.environ, PYTHONPATH=str(target))
  command = str(target / 'bin' / 'gated-attention')
  where = subprocess.run([sys.executable, '-c',
                          'import gated_attention; print(gated_attention.__file__)'],
                         env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
  assert where.stdout.startswith(str(target)), where.stdout
  for generic in LINKED:         # nothing of that name was installed
    assert not (target / generic).exists()
    found = subprocess.run([sys.executable, '-c', f'import {generic}'], env=env, cwd=tmp_path,
                           capture_output=True, text=True)
    assert found.returncode != 0 and 'ModuleNotFoundError' in found.stderr
  for flags in ([], ['--config=configs/baseline.py:moe_tiny'],
                ['--config', 'configs/g1_headwise.py']):
    got = subprocess.run([sys.executable, command, '--mode=params'] + flags, env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    want = subprocess.run([sys.executable, 'main.py', '--mode=params'] + flags, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(got.stdout) == json.loads(want.stdout)


def _older_pythons() -> list[str]:
  """Interpreters older than 3.11 on this machine (PATH, pyenv), if any."""
  found = [shutil.which(f'python3.{minor}') for minor in (10, 9, 8)]
  pyenv = os.environ.get('PYENV_ROOT', os.path.expanduser('~/.pyenv'))
  found += sorted(glob.glob(os.path.join(pyenv, 'versions', '3.1[0]*', 'bin', 'python')))
  older = []
  for python in filter(None, found):         # a shim that names a version it lacks does not run
    try:
      out = subprocess.run([python, '-c', 'import sys; print(sys.version_info < (3, 11))'],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
      continue
    if out.returncode == 0 and out.stdout.strip() == 'True':
      older.append(python)
  return older


def test_an_older_python_is_refused_in_one_line():
  """pyproject.toml requires 3.11 (pip refuses the package), and main.py, the console command
  and the notebook stop at the package's import with one line naming the fix."""
  with open(os.path.join(ROOT, 'pyproject.toml')) as f:
    assert 'requires-python = ">=3.11"' in f.read()
  fake = ('import sys; sys.version_info = (3, 10, 13, "final", 0); import runpy; '
          'sys.argv = ["main.py", "--help"]; runpy.run_path("main.py", run_name="__main__")')
  out = subprocess.run([sys.executable, '-c', fake], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr
  assert out.stderr.startswith('gated-attention needs Python 3.11 or later; this is Python '
                               '3.10.13'), out.stderr
  assert 'python3.11 -m venv .venv' in out.stderr
  for python in _older_pythons()[:1]:        # the real thing, where an older Python is installed
    out = subprocess.run([python, 'main.py', '--help'], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 1 and 'needs Python 3.11 or later' in out.stderr, out.stderr
    assert 'Traceback' not in out.stderr
