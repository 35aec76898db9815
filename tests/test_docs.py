"""README.md and the guides in docs/: every relative link points at a file that exists, every
`--mode=` named there is a mode of main.py, and the README stays a front door."""

import glob
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
  from experiments import report as runner_report   # pylint: disable=import-outside-toplevel
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
