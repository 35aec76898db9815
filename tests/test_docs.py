"""README.md and the guides in docs/: every relative link points at a file that exists, every
`--mode=` named there is a mode of main.py, and the README stays a front door."""

import glob
import math
import os
import re

from gated_attention.modes import MODES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def _prose(text):
  """The text without fenced code blocks and inline code (where `[a](b)` is not a link)."""
  text = re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)
  return re.sub(r'`[^`\n]*`', '', text)


def broken_links(path):
  """'target' for each relative link of the markdown file at path whose file does not exist."""
  with open(path) as f:
    text = _prose(f.read())
  bad = []
  for target in re.findall(r'\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)', text):
    if re.match(r'[a-z][a-z0-9+.-]*:', target) or target.startswith('#'):
      continue                                    # http(s):, mailto:, an anchor on this page
    file = target.split('#')[0]
    if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file))):
      bad.append(target)
  return bad


def unknown_modes(path):
  """Each `--mode=NAME` written in the file (code blocks included) that main.py has no mode for."""
  with open(path) as f:
    return [m for m in re.findall(r'--mode=(\w+)', f.read()) if m not in MODES]


def test_every_relative_link_points_at_a_file():
  bad = {os.path.relpath(p, ROOT): broken_links(p) for p in PAGES}
  assert not {p: b for p, b in bad.items() if b}
  assert len(PAGES) > 8                           # README.md and the guides were read


def test_every_mode_named_is_a_mode():
  named = {os.path.relpath(p, ROOT): unknown_modes(p) for p in PAGES}
  assert not {p: m for p, m in named.items() if m}


def test_the_checks_see_a_broken_link_and_an_unknown_mode(tmp_path):
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'docs' / 'here.md').write_text('x')
  page = tmp_path / 'README.md'
  page.write_text('[a](docs/here.md) [b](docs/gone.md#part) [c](https://example.com) [d](#top)\n'
                  '`[e](not/a/link.md)` main.py --mode=train, main.py --mode=trian\n'
                  '```\n[f](inside/a/block.md)\n```\n')
  assert broken_links(str(page)) == ['docs/gone.md#part']
  assert unknown_modes(str(page)) == ['trian']


def linked_pages(path):
  """The markdown files the file at path links to (absolute paths)."""
  with open(path) as f:
    targets = re.findall(r'\]\(([^)#\s]+\.md)(?:#[^)]*)?\)', _prose(f.read()))
  return {os.path.normpath(os.path.join(os.path.dirname(path), t)) for t in targets
          if not re.match(r'[a-z][a-z0-9+.-]*:', t)}


def test_the_readme_is_a_front_door():
  """At most ~250 lines; its table of modes names each mode of main.py once; every guide in docs/
  is reached from it by links."""
  with open(PAGES[0]) as f:
    text = f.read()
  assert len(text.splitlines()) <= 250
  rows = re.findall(r'^\| `(\w+)`', text.split('## Modes of `main.py`')[1].split('\n## ')[0],
                    flags=re.M)
  assert sorted(rows) == sorted(MODES)
  reached, todo = set(), [PAGES[0]]
  while todo:
    page = todo.pop()
    if page not in reached and os.path.exists(page):
      reached.add(page)
      todo.extend(linked_pages(page))
  assert not set(PAGES) - reached, 'not reached from README.md'


# ----------------------------------------------------------------------------------------------
# Paths inside a run directory, as the guides write them (`RUN/...`, `checkpoints/...`): each must
# be one the code writes. The grammar is built from the names runs/rundir.py (and the checkpoint
# module, the experiment runner) define, so a renamed file fails here until the guides follow.

def _run_dir_grammar() -> re.Pattern:
  """A regex of every path below a run directory that the code writes (placeholders such as
  <step>, <n>, <tag> stand for a value)."""
  from experiments import rundata as runner_report   # pylint: disable=import-outside-toplevel
  from gated_attention.runs import checkpoint, rundir  # pylint: disable=import-outside-toplevel
  e = re.escape
  step = r'(?:\d+|<step>)'
  number = r'(?:\d+|<n>)'
  name = r'(?:[A-Za-z0-9_.-]+|<[a-z_]+>)'
  checkpoints = (rf'{e(checkpoint.CHECKPOINTS_DIR)}(?:/{step}'
                 r'(?:\.orbax-checkpoint-tmp[0-9-]*|\.unusable\d*)?'
                 rf'(?:/(?:state|data(?:/(?:{e(checkpoint.POSITION)}|process_(?:\d+|<i>)-of-'
                 r'(?:\d+|<n>)\.json))?|_CHECKPOINT_METADATA))?)?')
  tops = {
      rundir.CONFIG_FILE: '', rundir.METRICS_FILE: '', rundir.LOCK_FILE: '',
      rundir.GRAD_ACCUM_FILE: '',
      rundir.METRICS_DIR: rf'(?:/{number}\.jsonl)?',
      rundir.ANALYSIS_DIR: rf'(?:/(?:{e(rundir.REPORT_FILE)}|attention_maps\.npz|[a-z_]+\.png))?',
      rundir.LONG_CONTEXT_DIR: rf'(?:/{name}(?:/{name})?)?',
      rundir.QUANTIZATION_DIR: rf'(?:/(?:{e(rundir.REPORT_FILE)}|quantization\.md))?',
      rundir.GOODPUT_DIR: rf'(?:/session-{number}\.json)?',
      rundir.PROFILE_DIR: r'(?:/.*)?',              # the profiler's own tree (plugins/profile/...)
      rundir.TENSORBOARD_DIR: r'(?:/.*)?',          # TensorBoard's event files
      rundir.LOGS_DIR: r'(?:/.*)?',                 # the libraries' log files
      # the experiment runner's files in each of its runs (experiments/run.py, report.py)
      runner_report.RUNNER_FILE: '', 'train.log': '', 'analyze.log': '', 'extend.log': '',
      'long_context.log': '',
      runner_report.EXTENDED_DIR: r'(?:\.from_step_(?:\d+|N))?(?:/.*)?',  # a run directory itself
  }
  named = {v for k, v in vars(rundir).items() if k.endswith(('_FILE', '_DIR'))
           and isinstance(v, str)}
  missing = named - set(tops) - {rundir.REPORT_FILE}
  assert not missing, f'runs/rundir.py names {missing}: add them to this grammar'
  alternatives = [checkpoints] + [e(top) + rest for top, rest in tops.items()]
  return re.compile(r'(?:' + '|'.join(alternatives) + r')/?')


# Paths the guides name on purpose though no code writes them: damage that readers must survive.
DAMAGE = {'RUN/metrics/00000050.jsonl/inner'}


def wrong_run_paths(path) -> list[str]:
  """Each `RUN/...` or `checkpoints/...` path of the markdown file at path (code included) that
  is no path the code writes in a run directory."""
  grammar = _run_dir_grammar()
  with open(path) as f:
    text = f.read()
  bad = []
  for m in re.finditer(r'(?<![\w/.-])(RUN/|checkpoints/)([A-Za-z0-9_<>{}.*/-]*)', text):
    whole = (m.group(1) + m.group(2)).rstrip('.')
    rel = whole[len('RUN/'):] if whole.startswith('RUN/') else whole
    if whole in DAMAGE or not rel:
      continue
    if not grammar.fullmatch(rel):
      bad.append(whole)
  return bad


def test_every_run_directory_path_in_the_guides_is_one_the_code_writes():
  found = {os.path.relpath(p, ROOT): wrong_run_paths(p) for p in PAGES}
  assert not {p: b for p, b in found.items() if b}


def test_the_path_check_sees_a_wrong_path(tmp_path):
  page = tmp_path / 'x.md'
  page.write_text('`RUN/<step>/data/position.json` and `RUN/checkpoints/<step>/data/position.json`,'
                  ' RUN/analysis/report.json, RUN/analysis/reprt.json, RUN/metrics/00000001.jsonl,'
                  ' RUN/metric/1.jsonl, `checkpoints/30/state`, `checkpoints/30/stat`, RUN/profile/'
                  'a/b, RUN/goodput/session-<n>.json. RUN/config.json.')
  assert wrong_run_paths(str(page)) == ['RUN/<step>/data/position.json', 'RUN/analysis/reprt.json',
                                        'RUN/metric/1.jsonl', 'checkpoints/30/stat']


def test_the_sources_a_mixture_takes_are_the_guides():
  """docs/mixtures.md lists the sources that mix as input_pipeline/mixture.py takes them."""
  from gated_attention.input_pipeline import mixture  # pylint: disable=import-outside-toplevel
  with open(os.path.join(ROOT, 'docs', 'mixtures.md')) as f:
    text = f.read()
  listed = re.search(r'any source but `synthetic`:\s*(.*?);', text, flags=re.S).group(1)
  assert sorted(re.findall(r'`(\w+)`', listed)) == sorted(mixture.SOURCES)


# ----------------------------------------------------------------------------------------------
# Every `main.py` command of the README and the guides parses: its flags exist and belong to its
# mode, its config file exists with a scale it has, its --config.* keys are fields of the schema
# with values of their kind; a documented training on a TPU slice fits it per docs/tpu_aot.md.

def _code_texts(text: str) -> list[str]:
  """The fenced code blocks (backslash-continued lines joined) and the inline code spans."""
  blocks = re.findall(r'^```[^\n]*\n(.*?)^```', text, flags=re.S | re.M)
  inline = re.findall(r'`([^`\n]+)`', re.sub(r'^```.*?^```', '', text, flags=re.S | re.M))
  return [re.sub(r'\\\n\s*', ' ', b) for b in blocks] + inline


def main_commands(text: str) -> list[list[str]]:
  """The argument lists of every `main.py ...` command in the markdown `text`'s code."""
  import shlex  # pylint: disable=import-outside-toplevel
  out = []
  for code in _code_texts(text):
    for name, value in re.findall(r'^([A-Z_]+)="([^"]*)"$', code, flags=re.M):
      code = code.replace(f'${name}', value)       # SINK="--config..." then main.py ... $SINK
    for line in code.splitlines():
      for m in re.finditer(r'(?:^|[\s;&(\'"])(?:\S*python3?\s+)?main\.py((?:\s|$).*)', line):
        rest = m.group(1)
        for attempt in (rest, rest.rstrip().rstrip('\'"'), rest.rstrip()[:-1]):
          try:
            lexer = shlex.shlex(attempt, posix=True, punctuation_chars=';&|<>()')
            lexer.whitespace_split = True
            tokens = list(lexer)
            break
          except ValueError:
            continue
        else:
          raise AssertionError(f'cannot split {line!r}')
        args = []
        for t in tokens:
          if t and set(t) <= set(';&|<>()') or t == '#':
            break
          args.append(t)
        out.append(args)
  return out


def _schema_field(path: str):
  """(the schema default of --config.<path>, or KeyError naming what is missing)."""
  from gated_attention.config import schema  # pylint: disable=import-outside-toplevel
  node, walked = schema.defaults(), ''
  entries = schema.entry_fields()
  parts = path.split('.')
  for i, part in enumerate(parts):
    if walked in entries:                       # data.mixture.<name>.<field>
      rest = parts[i + 1:]
      spec = schema.defaults(entries[walked])
      if not rest:
        return {}
      if len(rest) != 1 or rest[0] not in spec:
        raise KeyError(path)
      return spec[rest[0]]
    if not isinstance(node, dict) or part not in node:
      raise KeyError(path)
    node, walked = node[part], f'{walked}.{part}'.lstrip('.')
  return node


def command_problems(args: list[str]) -> list[str]:
  """What main.py would refuse in `args` (a documented command's arguments), by static reading
  of the same tables main.py reads (modes.MODES / FLAGS, the schema, the scales)."""
  import ast  # pylint: disable=import-outside-toplevel
  from gated_attention import cli  # pylint: disable=import-outside-toplevel
  from gated_attention.config import scales, schema  # pylint: disable=import-outside-toplevel
  problems, mode, positional = [], 'train', []
  for a in args:
    if a.startswith('--mode='):
      mode = a.split('=', 1)[1]
  if mode not in MODES:
    return [f'--mode={mode}']
  known = {'mode', 'config', 'workdir', 'verbosity', 'v', 'help', 'helpfull'}
  for a in args:
    if not a.startswith('-'):
      positional.append(a)
      continue
    name, _, value = a.lstrip('-').partition('=')
    if name.startswith('config.'):
      try:
        default = _schema_field(name[len('config.'):])
      except KeyError:
        problems.append(f'{a}: no field of the config')
        continue
      if not value or re.fullmatch(r'[A-Z_]+|\.\.\.', value):
        continue                                      # a placeholder the reader fills in
      try:
        parsed = ast.literal_eval(value)
      except (SyntaxError, ValueError):
        parsed = value
      if isinstance(default, str):
        parsed = value
      elif isinstance(default, bool) and value.lower() in ('true', 'false', '1', '0'):
        parsed = value.lower() in ('true', '1')          # absl's boolean parser
      field = name[len('config.'):]
      errors = schema.type_errors({'v': parsed}, {'v': default})
      if errors and not (field in schema.AUTO_FIELDS and schema.is_auto(parsed)):
        problems.append(f'{a}: {errors[0]}')
    elif name == 'config' and value in ('...', 'FILE'):
      continue                                        # a placeholder
    elif name == 'config':
      path, _, arg = cli.resolve_config_path(value).partition(':')
      if not os.path.isfile(path if os.path.isabs(path) else os.path.join(ROOT, path)):
        problems.append(f'{a}: no such config file')
      elif arg and os.path.basename(path) not in ('from_run.py', 'extend_context.py') and (
          arg not in scales.SCALES):
        problems.append(f'{a}: no scale {arg!r}')
    elif name.startswith('no') and name[2:] in MODES[mode].flags:
      continue
    elif name in MODES[mode].flags:
      continue
    elif name not in known:
      problems.append(f'{a}: not a flag of --mode={mode}')
  if positional and not MODES[mode].takes_runs and positional != ['...']:
    problems.append(f'positional {positional}: only --mode=compare takes run directories')
  return problems


def _commands_of_pages():
  for page in PAGES:
    with open(page) as f:
      for args in main_commands(f.read()):
        yield os.path.relpath(page, ROOT), args


def test_every_documented_main_py_command_parses():
  from gated_attention import cli  # pylint: disable=import-outside-toplevel
  found = list(_commands_of_pages())
  assert len(found) > 40, len(found)                # the README's and the guides' were read
  bad = [(page, ' '.join(args), command_problems(args)) for page, args in found]
  assert not [b for b in bad if b[2]]
  examples = [command.split()[1:] for _, command in cli.EXAMPLES]   # --help's examples
  assert not [c for c in examples if command_problems(main_commands(f'`{" ".join(["main.py"] + c)}`')[0])]


def test_the_command_check_sees_what_main_py_refuses():
  text = ('```bash\npython main.py --config=configs/g1_elementwise.py:dense_1p7b_28l \\\n'
          '    --config.train.grad_accum=auto --config.train.stepz=3 > log 2>&1 &\n'
          'cd x && .venv/bin/python main.py --mode=sample --workdir=R --prompt="a b" --seeds=1\n'
          'python main.py --config=configs/nope.py --config.train.steps=many --mode=analyze R\n'
          "ssh --command='python main.py --config=configs/baseline.py:huge'\n```\n"
          'and `main.py --mode=compare runs/a runs/b --out=x`')
  commands = main_commands(text)
  assert commands[0] == ['--config=configs/g1_elementwise.py:dense_1p7b_28l',
                         '--config.train.grad_accum=auto', '--config.train.stepz=3']
  assert [command_problems(c) for c in commands] == [
      ['--config.train.stepz=3: no field of the config'],
      ['--seeds=1: not a flag of --mode=sample'],
      ['--config=configs/nope.py: no such config file',
       '--config.train.steps=many: v is "many", not a number',
       "positional ['R']: only --mode=compare takes run directories"],
      ["--config=configs/baseline.py:huge: no scale 'huge'"],
      []]


def tpu_table() -> dict:
  """{(scale, variant, chips): grad_accum} of docs/tpu_aot.md's tables at sequence 4096: the
  smallest grad_accum whose compiled step fits that many v5p chips."""
  with open(os.path.join(ROOT, 'docs', 'tpu_aot.md')) as f:
    text = f.read()
  table = {}
  for section in re.split(r'^## ', text, flags=re.M):
    if not section.startswith(('Smallest v5p slice per model (sequence 4096',
                               'On v5p:4x4x4 (64 chips) (sequence 4096')):
      continue
    for scale, variant, chips, ga in re.findall(
        r'^\| (\w+) \| (\w+) \| v5p:\S+ \((\d+) chips\) \| [^|]+ \| (\d+) \(', section, flags=re.M):
      table[(scale, variant, int(chips))] = int(ga)
  return table


def _option(args, name, default=None):
  values = [a.split('=', 1)[1] for a in args if a.startswith(f'--{name}=')]
  return values[-1] if values else default


def slice_problems(text: str, table: dict) -> list[str]:
  """In each code block of `text` that creates a TPU slice (--accelerator-type=v5p-N: N/2
  chips): every training command of a scale in `table` fits the slice per the table (its slice
  no smaller than the table's smallest; its grad_accum 'auto', or a number the table has for those
  chips at least); every --mode=memory / compile command plans that model and that slice."""
  problems = []
  for block in re.findall(r'^```[^\n]*\n(.*?)^```', text, flags=re.S | re.M):
    rented = re.search(r'--accelerator-type=v5p-(\d+)', block)
    if not rented:
      continue
    chips = int(rented.group(1)) // 2
    commands = main_commands(f'```\n{block}```')
    trained = {_option(c, 'config') for c in commands if _option(c, 'mode', 'train') == 'train'}
    for c in commands:
      config = _option(c, 'config', '')
      variant, _, scale = os.path.basename(config).replace('.py', '').partition(':')
      mode = _option(c, 'mode', 'train')
      if mode in ('memory', 'compile'):
        if config not in trained:
          problems.append(f'plans {config}, trains {sorted(trained)}')
        topology = _option(c, 'topology')
        if mode == 'compile' and topology:
          planned = math.prod(int(x) for x in topology.split(':')[1].split('x'))
          if planned != chips:
            problems.append(f'compiles for {topology} ({planned} chips), rents {chips}')
        continue
      sizes = sorted(n for (s, v, n) in table if (s, v) == (scale, variant))
      if mode != 'train' or not sizes:
        continue
      if chips < sizes[0]:
        problems.append(f'{variant}:{scale} on {chips} chips: the table\'s smallest is {sizes[0]}')
        continue
      ga = _option(c, 'config.train.grad_accum', '1')
      if ga == 'auto':
        continue
      need = table.get((scale, variant, chips))
      if need is None or int(ga) < need:
        problems.append(f'{variant}:{scale} on {chips} chips at grad_accum={ga}: the table '
                        f'says {need if need is not None else "nothing for that slice (use auto)"}')
  return problems


def test_the_pod_recipes_train_what_they_plan_and_fit_the_slice():
  table = tpu_table()
  assert table[('dense_1p7b_28l', 'g1_elementwise', 4)] == 8        # the table was read
  assert table[('moe_15a2b', 'baseline', 64)] == 1
  for page in PAGES:
    with open(page) as f:
      assert not slice_problems(f.read(), table), page
  with open(os.path.join(ROOT, 'docs', 'pods.md')) as f:
    pods = f.read()
  assert '--accelerator-type=v5p-' in pods and '--config.train.grad_accum=auto' in pods


def test_the_slice_check_sees_a_recipe_that_does_not_fit():
  table = tpu_table()
  recipe = ('```bash\ngcloud compute tpus tpu-vm create x --accelerator-type=v5p-8\n'
            'python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=compile '
            '--topology=v5p:4x4x4\n'
            "ssh --command='python main.py --config=configs/g1_elementwise.py:dense_1p7b_28l "
            "--workdir=gs://B/r'\n"
            'python main.py --config=configs/baseline.py:dense_1p7b_48l --config.train.grad_accum=16\n'
            'python main.py --config=configs/baseline.py:moe_15a2b --config.train.grad_accum=auto\n'
            'python main.py --config=configs/baseline.py:dense_1p7b_28l --config.train.grad_accum=auto\n'
            '```\n')
  assert slice_problems(recipe, table) == [
      "plans configs/g1_elementwise.py:moe_15a2b, trains ['configs/baseline.py:dense_1p7b_28l', "
      "'configs/baseline.py:dense_1p7b_48l', 'configs/baseline.py:moe_15a2b', "
      "'configs/g1_elementwise.py:dense_1p7b_28l']",
      'compiles for v5p:4x4x4 (64 chips), rents 4',
      'g1_elementwise:dense_1p7b_28l on 4 chips at grad_accum=1: the table says 8',
      'baseline:moe_15a2b on 4 chips: the table\'s smallest is 8']


def test_the_architecture_page_lists_every_guide():
  """docs/architecture.md's map names every page of docs/ (a merge dropped mixtures.md once)."""
  with open(os.path.join(ROOT, 'docs', 'architecture.md')) as f:
    listing = f.read().split('`docs/` (the guides:')[1].split(')')[0]
  named = set(re.findall(r'`([\w.]+\.md)`', listing)) | {'architecture.md'}
  assert named == {os.path.basename(p) for p in PAGES[1:]}
