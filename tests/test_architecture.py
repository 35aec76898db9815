"""The layers of gated_attention/ (docs/architecture.md): which package may import which.

Every import in every module counts, those inside functions included, so a lazy import cannot
hide a dependency that points the wrong way.
"""

import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('config', 'model', 'analysis', 'inference', 'runs', 'training', 'compile', 'modes')
# What each layer may import besides itself (core: the root modules errors, console, sharding,
# distributed, chips, storage; main: main.py and gated_attention/cli.py; configs/ and
# input_pipeline/ are the top-level packages of those names). No library layer imports configs/:
# the variant files sit above the library they configure.
ALLOWED = {
    'core': set(),
    'model': {'core'},
    'config': {'core', 'model'},
    'analysis': {'core', 'model', 'config'},
    'inference': {'core', 'model', 'analysis', 'input_pipeline'},
    'runs': {'core', 'model', 'config', 'input_pipeline'},
    'training': {'core', 'model', 'analysis', 'runs', 'config', 'input_pipeline'},
    'compile': {'core', 'model', 'runs', 'training', 'inference', 'config', 'input_pipeline'},
    'modes': {'core', 'model', 'analysis', 'inference', 'runs', 'training', 'compile', 'config',
              'input_pipeline'},
    'main': {'core', 'model', 'analysis', 'inference', 'runs', 'training', 'compile', 'modes',
             'config', 'input_pipeline', 'main'},
    'configs': {'core', 'config', 'runs', 'configs'},
    'input_pipeline': {'core', 'input_pipeline', 'config'},  # bpe.py's command line: data defaults
}


def layer(module: str) -> str | None:
  """The layer of a dotted module name inside this repository (None: a library)."""
  parts = module.split('.')
  if parts[0] in ('configs', 'input_pipeline', 'main'):
    return parts[0]
  if parts[:2] in (['gated_attention', 'input_pipeline'], ['gated_attention', 'configs']):
    return parts[1]       # the top-level folders, linked into the package (pyproject.toml)
  if parts[0] != 'gated_attention':
    return None
  if module == 'gated_attention.cli':       # main.py's command line, the console command's too
    return 'main'
  return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else 'core'


def imports(path: str):
  """(line, imported module) of every absolute import in the file."""
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:   # `from gated_attention import model`: the package imported
        yield node.lineno, f'{node.module}.{alias.name}'


def modules():
  for top in ('gated_attention', 'configs', 'input_pipeline'):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      for f in sorted(files):
        if f.endswith('.py'):
          path = os.path.join(d, f)
          yield os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.').removesuffix('.__init__')
  yield 'main'


def wrong_way(module: str) -> list[str]:
  src = layer(module)
  path = os.path.join(ROOT, *module.split('.'))
  path = path + '.py' if os.path.isfile(path + '.py') else os.path.join(path, '__init__.py')
  bad = []
  for line, target in imports(path):
    dst = layer(target)
    if dst is not None and dst != src and dst not in ALLOWED[src]:
      bad.append(f'{module}:{line} ({src}) imports {target} ({dst})')
  return bad


def test_every_import_points_down_the_layers():
  bad = [b for m in modules() for b in wrong_way(m)]
  assert not bad, 'imports against the layers of docs/architecture.md:\n' + '\n'.join(bad)


def test_input_pipeline_is_imported_by_one_name():
  """input_pipeline/ is gated_attention.input_pipeline for every module of the repository (the
  installed package has no top-level input_pipeline); importing it as `input_pipeline` too would
  load each of its modules twice, with two DataError classes."""
  bad = []
  for top in ('gated_attention', 'configs', 'input_pipeline', 'tests', 'benchmarks',
              'experiments'):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      for f in files:
        if f.endswith('.py'):
          path = os.path.join(d, f)
          bad += [f'{os.path.relpath(path, ROOT)}:{line} imports {target}'
                  for line, target in imports(path)
                  if target.split('.')[0] in ('input_pipeline', 'configs') and
                  not (target.startswith('configs.') and top in ('tests', 'experiments'))]
  assert not bad, '\n'.join(bad)
  for name in ('input_pipeline', 'configs'):    # the links the wheel follows
    link = os.path.join(ROOT, 'gated_attention', name)
    assert os.path.islink(link) and os.readlink(link) == os.path.join('..', name)


def test_the_check_sees_a_wrong_import(tmp_path, monkeypatch):
  """The rule fires on a model module importing training (and on a lazy import)."""
  pkg = tmp_path / 'gated_attention' / 'model'
  pkg.mkdir(parents=True)
  (pkg / 'bad.py').write_text('def f():\n  from gated_attention.training import loop\n')
  monkeypatch.setattr(__import__(__name__), 'ROOT', str(tmp_path), raising=False)
  globals()['ROOT'] = str(tmp_path)
  try:
    assert wrong_way('gated_attention.model.bad') == [
        'gated_attention.model.bad:2 (model) imports gated_attention.training.loop (training)']
  finally:
    globals()['ROOT'] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('package', PACKAGES)
def test_each_package_says_what_it_is(package):
  init = os.path.join(ROOT, 'gated_attention', package, '__init__.py')
  assert ast.get_docstring(ast.parse(open(init).read())), f'{init} has no docstring'


def test_the_documented_table_is_the_enforced_one():
  """docs/architecture.md's table of layers says, for each, what ALLOWED lets it import."""
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, 'docs', 'architecture.md')) as f:
    rows = [line for line in f if re.match(r'\| `\w+`', line)]
  documented = {}
  for row in rows:
    cells = [c.strip() for c in row.strip().strip('|').split('|')]
    name = re.match(r'`(\w+)`', cells[0]).group(1)
    may = re.sub(r'\([^)]*\)', '', cells[-1])
    documented[name] = (set() if may.strip() == 'nothing of the project' else
                        {m.strip() for m in may.split(',')})
  enforced = {name: allowed - {name} for name, allowed in ALLOWED.items()}
  assert documented == enforced


def _edits_sys_path_on_import(path: str) -> list[int]:
  """Lines of the module's top-level statements (those that run on import, `if __name__ ==
  '__main__':` blocks left out) that change sys.path."""
  tree = ast.parse(open(path).read())
  body = [s for s in tree.body if not (
      isinstance(s, ast.If) and isinstance(s.test, ast.Compare) and
      isinstance(s.test.left, ast.Name) and s.test.left.id == '__name__')]
  lines, todo = set(), list(body)
  while todo:
    node = todo.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue                                     # runs when called, not on import
    if (isinstance(node, ast.Attribute) and node.attr == 'path' and
        isinstance(node.value, ast.Name) and node.value.id == 'sys'):
      lines.add(node.lineno)
    todo.extend(ast.iter_child_nodes(node))
  return sorted(lines)


def test_scripts_run_as_modules_without_editing_sys_path(tmp_path):
  """benchmarks/ and experiments/ run from the repository root as modules (`python -m
  benchmarks.runner`), so none edits sys.path when imported (a worker function may)."""
  bad = [f'{os.path.relpath(p, ROOT)}:{line}'
         for folder in ('benchmarks', 'experiments')
         for p in sorted(glob.glob(os.path.join(ROOT, folder, '*.py')))
         for line in _edits_sys_path_on_import(p)]
  assert not bad, bad
  probe = tmp_path / 'probe.py'
  probe.write_text('import os, sys\nREPO = 1\nsys.path.insert(0, REPO)\n\n\ndef f():\n'
                   '  sys.path.append(2)\n\n\nif __name__ == "__main__":\n  sys.path.pop()\n')
  assert _edits_sys_path_on_import(str(probe)) == [3]
