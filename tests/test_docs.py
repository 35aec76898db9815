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
