"""The shape of the code (docs/architecture.md), measured from its own imports: which layer may
import which (no arrow up), no circle of modules, and no private name taken from another module.

Every import in every module counts, those inside functions included, so a lazy import cannot
hide a dependency that points the wrong way, nor a circle.
"""

import ast
import collections
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('config', 'model', 'analysis', 'inference', 'runs', 'training', 'compile', 'modes',
            'storage', 'cluster')
# What each layer may import besides itself (errors: gated_attention/errors.py; core: the other
# root modules, console, sharding, chips, compilation_cache; storage/ and cluster/ are packages;
# main: main.py and gated_attention/cli.py; configs/ and input_pipeline/ are the top-level
# packages of those names). No library layer imports configs/: the variant files sit above the
# library they configure.
_LOW = {'errors', 'storage', 'core'}
ALLOWED = {
    'errors': set(),
    'storage': {'errors'},
    'core': {'errors', 'storage'},
    'cluster': _LOW,
    'model': _LOW,
    'config': _LOW | {'model'},
    'analysis': _LOW | {'model', 'config'},
    'inference': _LOW | {'model', 'analysis', 'input_pipeline'},
    'runs': _LOW | {'model', 'config', 'input_pipeline'},
    'training': _LOW | {'cluster', 'model', 'analysis', 'runs', 'config', 'input_pipeline'},
    'compile': _LOW | {'model', 'runs', 'training', 'inference', 'config', 'input_pipeline'},
    'modes': _LOW | {'cluster', 'model', 'analysis', 'inference', 'runs', 'training', 'compile',
                     'config', 'input_pipeline'},
    'main': _LOW | {'cluster', 'model', 'analysis', 'inference', 'runs', 'training', 'compile',
                    'modes', 'config', 'input_pipeline', 'main'},
    'configs': _LOW | {'config', 'runs', 'configs'},
    'input_pipeline': _LOW | {'input_pipeline', 'config'},  # bpe.py's command line: data defaults
}
# Code outside the library whose modules the circle and private-name rules cover too.
SCRIPTS = ('benchmarks', 'experiments')


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
  if parts[1:2] == ['errors']:
    return 'errors'
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


def floors(allowed: dict[str, set[str]]) -> dict[str, int]:
  """Each layer's floor: 1 for a layer that may import no other, else one above the highest it
  may import. A layer that could reach itself through what it may import has none: ValueError
  (an arrow back up would let a lower layer import a higher one)."""
  out, seen = {}, set()

  def floor(name, path=()):
    if name in out:
      return out[name]
    if name in path:
      raise ValueError(' -> '.join(path + (name,)))
    below = allowed[name] - {name}
    out[name] = 1 + max((floor(b, path + (name,)) for b in below), default=0)
    return out[name]
  for name in allowed:
    if name not in seen:
      seen.add(name)
      floor(name)
  return out


def test_the_layers_have_floors():
  """No arrow up: the layers' table is a picture with floors, each layer importing only those
  below it, so no two layers may import each other, however far round."""
  f = floors(ALLOWED)
  assert f['errors'] == 1 and f['storage'] < f['core'] < f['cluster'] < f['training']
  assert max(f.values()) == f['main']
  with pytest.raises(ValueError, match='storage -> core -> storage'):
    floors(dict(ALLOWED, storage={'errors', 'core'}))


def _canonical(module: str) -> str:
  """configs.x and input_pipeline.x are gated_attention.configs.x ... (the links)."""
  top = module.split('.')[0]
  return f'gated_attention.{module}' if top in ('configs', 'input_pipeline') else module


def module_files(root: str = ROOT) -> dict[str, str]:
  """{module: its file} of the library, configs/, input_pipeline/, main.py and SCRIPTS."""
  out = {}
  for top in ('gated_attention', 'configs', 'input_pipeline') + SCRIPTS:
    for d, _, files in os.walk(os.path.join(root, top)):
      for f in sorted(files):
        if f.endswith('.py'):
          path = os.path.join(d, f)
          name = os.path.relpath(path, root)[:-3].replace(os.sep, '.').removesuffix('.__init__')
          out[_canonical(name)] = path
  if os.path.isfile(os.path.join(root, 'main.py')):
    out['main'] = os.path.join(root, 'main.py')
  return out


def _resolver(files: dict[str, str]):
  def resolve(name: str) -> str | None:
    """The module of this repository an imported name lives in (None: a library)."""
    name = _canonical(name)
    while name and name not in files:
      name = name.rpartition('.')[0]
    return name or None
  return resolve


def import_graph(root: str = ROOT) -> dict[str, dict[str, int]]:
  """{module: {module of this repository it imports: the first line}}: `from pkg import sub`
  is an arrow to the module pkg/sub.py, `from mod import name` one to mod."""
  files = module_files(root)
  resolve = _resolver(files)
  graph = {}
  for module, path in files.items():
    arrows = graph.setdefault(module, {})
    for line, target in imports(path):
      dst = resolve(target)
      if dst is not None and dst != module:
        arrows.setdefault(dst, line)
  return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
  """The modules that import each other in a loop, each loop's modules sorted (Tarjan)."""
  index, low, stack, on, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      loop = []
      while not loop or loop[-1] != v:
        loop.append(stack.pop())
        on.discard(loop[-1])
      if len(loop) > 1:
        found.append(sorted(loop))
  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(found)


def _private(name: str) -> bool:
  return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def private_names(root: str = ROOT) -> list[str]:
  """'file:line takes NAME from MODULE' for each private name (a leading underscore) that a module
  imports from another module of this repository (`from m import _x`), or reads off one it
  imported (`m._x`). What two modules share is public in one of them, or below both."""
  files = module_files(root)
  resolve = _resolver(files)
  bad = []
  for module, path in sorted(files.items()):
    tree = ast.parse(open(path).read(), path)
    rel = os.path.relpath(path, root)
    bound = {}             # a name in this file -> the module of this repository it is
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for alias in node.names:
          if alias.asname and _canonical(alias.name) in files:
            bound[alias.asname] = _canonical(alias.name)
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
          full = _canonical(f'{node.module}.{alias.name}')
          if full in files:
            bound[alias.asname or alias.name] = full
          elif resolve(node.module) not in (None, module) and _private(alias.name):
            bad.append(f'{rel}:{node.lineno} takes {alias.name} from {resolve(node.module)}')
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
          bound.get(node.value.id, module) != module and _private(node.attr)):
        bad.append(f'{rel}:{node.lineno} takes {node.attr} from {bound[node.value.id]}')
  return bad


def test_no_circle_of_modules():
  graph = import_graph()
  assert len(graph) > 150 and 'gated_attention.storage.files' in graph   # the whole tree read
  found = circles(graph)
  assert not found, 'modules that import each other in a loop:\n' + '\n'.join(
      ' -> '.join(f'{a}:{graph[a][b]}' for a, b in zip(loop, loop[1:] + loop[:1]) if b in graph[a])
      or ', '.join(loop) for loop in found)


def test_no_private_name_from_another_module():
  bad = private_names()
  assert not bad, 'private names taken from another module:\n' + '\n'.join(bad)


def test_the_circle_and_private_name_checks_fire(tmp_path):
  """A loop through a lazy import, a private name imported and one read off a module."""
  pkg = tmp_path / 'gated_attention'
  pkg.mkdir()
  (pkg / '__init__.py').write_text('')
  (pkg / 'a.py').write_text('from gated_attention import b\nfrom gated_attention.c import _x\n')
  (pkg / 'b.py').write_text('def f():\n  from gated_attention import a\n  return a._y, a.z\n')
  (pkg / 'c.py').write_text('_x = 1\n')
  graph = import_graph(str(tmp_path))
  assert graph['gated_attention.a'] == {'gated_attention.b': 1, 'gated_attention.c': 2}
  assert circles(graph) == [['gated_attention.a', 'gated_attention.b']]
  assert private_names(str(tmp_path)) == [
      f'gated_attention{os.sep}a.py:2 takes _x from gated_attention.c',
      f'gated_attention{os.sep}b.py:3 takes _y from gated_attention.a']


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
