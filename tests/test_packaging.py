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
