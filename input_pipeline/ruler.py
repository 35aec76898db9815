"""RULER-style long-context tasks as plain text: needles in a haystack and variable tracking.

After RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?", arXiv 2404.06654): each example is a prompt of a requested number of tokens, mostly
"haystack" text (consecutive lines of random documents of a `Documents` corpus: the held-out
documents for evaluation, the training documents for the training mixture), with "needle" lines
inserted between its lines at uniform random depths, and a question at the end that the model
answers by continuing the prompt. V is a random VALUE_DIGITS-digit number (no leading zero), K and
A..E random NAME_LETTERS-letter uppercase names; all values (and names) of an example are distinct.

  niah_single        needle   "The pass key is V. Remember it."
                     question "What is the pass key? The pass key is"
                     target   " V"
  niah_multikey      needles  "The magic number for K is V.", MULTIKEY_KEYS keys, one asked for
                     question "What is the magic number for K? The magic number for K is"
                     target   " V"
  niah_multivalue    needles  "The magic number for K is V.", one key, 2..MULTIVALUE_MAX values
                     question "What are all the magic numbers for K? The magic numbers for K are"
                     target   " V1, V2, V3" (in text order)
  variable_tracking  needles  "VAR A = V.", "VAR B = A.", ...: a chain of VT_HOPS hops, in order
                     question "Which variables have the value V? The variables with the value V are"
                     target   " A, B, C, D, E" (in chain order)

Every target ends with TERMINATOR ('\n'), where generation can stop. The prompt ends on a word and
the target starts with a space, so that the tokens of the prompt are a prefix of those of prompt +
target under byte, BPE and sentencepiece tokenizers alike: the model is asked to continue exactly
where a training document of the same task continues.

Lengths: the haystack fills the budget, so that len(tokenizer.encode_doc(prompt + target)) is at
most `num_tokens` (exactly it for the byte tokenizer, up to a multi-byte character; a few tokens
under it for BPE). Haystack lines longer than _MAX_LINE_CHARS characters are wrapped and the last
line is cut to fit. Minimum lengths with the byte tokenizer (no haystack at all): niah_single 81,
niah_multikey 215, niah_multivalue 244 (four values), variable_tracking 193; `min_tokens` computes
them for any tokenizer. The depth of an example is the fraction of the haystack's tokens before the
needle that holds the answer (the first of them in the text for multi-needle answers).

`examples(task, num_tokens=, count=, seed=, ...)` is deterministic in (task, num_tokens, seed, i)
for the same haystack documents; `TaskStream` makes the unbounded stream of training documents
(prompt + target) of the training mixture (pipeline.py, data.mix_*).
"""

import dataclasses
import zlib

import numpy as np

from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.sources import Documents
from gated_attention.input_pipeline.tokenizer import Tokenizer

TASKS = ('niah_single', 'niah_multikey', 'niah_multivalue', 'variable_tracking')
TERMINATOR = '\n'
VALUE_DIGITS = 5      # digits of a needle's value
NAME_LETTERS = 4      # letters of a key or variable name
MULTIKEY_KEYS = 4     # niah_multikey: needles (keys), one of them asked for
MULTIVALUE_MAX = 4    # niah_multivalue: values of the key, 2..MULTIVALUE_MAX
VT_HOPS = 4           # variable_tracking: assignments after the first (VT_HOPS + 1 variables)
_MAX_LINE_CHARS = 256  # longer haystack lines are wrapped (insertion points, the cut at the end)
_FIT_ROUNDS = 6       # haystack-size corrections for tokenizers whose counts are not additive
_MIN_TOKENS_DRAWS = 16  # min_tokens: skeletons drawn per task
_EXAMPLES_TAG, _STREAM_TAG, _MIN_TAG = 0, 1, 2  # first words of the seed sequences


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt; a model that continues `prompt` with `target` answers right."""
  task: str
  prompt: str                # haystack with needles, the question and the answer prefix
  answers: tuple[str, ...]   # gold answers (one for niah_single / niah_multikey)
  target: str                # ' ' + answers joined by ', ' + TERMINATOR
  depth: float               # depth of the answer's (first) needle in the haystack, in [0, 1]


@dataclasses.dataclass(frozen=True)
class _Skeleton:
  """An example without its haystack: needle lines (in text order), question, answers."""
  needles: tuple[str, ...]
  question: str
  answers: tuple[str, ...]
  answer_needle: int  # index in `needles` of the needle whose depth is reported


def check_task(task: str):
  """Raises DataError, listing the tasks, unless `task` is one."""
  if task not in TASKS:
    raise DataError(f'Unknown RULER task {task!r}; choose one of {", ".join(TASKS)}.')


def _values(rng: np.random.Generator, n: int) -> list[str]:
  """n distinct VALUE_DIGITS-digit numbers without a leading zero."""
  out = []
  while len(out) < n:
    v = str(int(rng.integers(10 ** (VALUE_DIGITS - 1), 10 ** VALUE_DIGITS)))
    if v not in out:
      out.append(v)
  return out


def _names(rng: np.random.Generator, n: int) -> list[str]:
  """n distinct NAME_LETTERS-letter uppercase names."""
  out = []
  while len(out) < n:
    name = ''.join(chr(ord('A') + int(c)) for c in rng.integers(26, size=NAME_LETTERS))
    if name not in out:
      out.append(name)
  return out


def _skeleton(task: str, rng: np.random.Generator, num_values: int = 0) -> _Skeleton:
  """The random needles and question of one example (`num_values`: niah_multivalue's, 0: drawn)."""
  if task == 'niah_single':
    (v,) = _values(rng, 1)
    return _Skeleton((f'The pass key is {v}. Remember it.\n',),
                     'What is the pass key? The pass key is', (v,), 0)
  if task == 'niah_multikey':
    keys, values = _names(rng, MULTIKEY_KEYS), _values(rng, MULTIKEY_KEYS)
    asked = int(rng.integers(MULTIKEY_KEYS))
    k = keys[asked]
    return _Skeleton(tuple(f'The magic number for {a} is {v}.\n' for a, v in zip(keys, values)),
                     f'What is the magic number for {k}? The magic number for {k} is',
                     (values[asked],), asked)
  if task == 'niah_multivalue':
    (k,) = _names(rng, 1)
    values = _values(rng, num_values or int(rng.integers(2, MULTIVALUE_MAX + 1)))
    return _Skeleton(tuple(f'The magic number for {k} is {v}.\n' for v in values),
                     f'What are all the magic numbers for {k}? The magic numbers for {k} are',
                     tuple(values), 0)
  check_task(task)
  names, (v,) = _names(rng, VT_HOPS + 1), _values(rng, 1)
  chain = [f'VAR {names[0]} = {v}.\n'] + [f'VAR {b} = {a}.\n' for a, b in zip(names, names[1:])]
  return _Skeleton(tuple(chain),
                   f'Which variables have the value {v}? The variables with the value {v} are',
                   tuple(names), 0)


def _target(answers) -> str:
  return ' ' + ', '.join(answers) + TERMINATOR


def _num_tokens(tokenizer: Tokenizer, text: str) -> int:
  return len(tokenizer.encode_array(text))


def _doc_tokens(tokenizer: Tokenizer, text: str) -> int:
  """len(tokenizer.encode_doc(text)): BOS and the text's tokens."""
  return 1 + _num_tokens(tokenizer, text)


def min_tokens(task: str, tokenizer: Tokenizer) -> int:
  """The fewest tokens an example of `task` takes (no haystack): exact for the byte tokenizer, the
  largest of _MIN_TOKENS_DRAWS random draws otherwise (digits and names vary in BPE tokens)."""
  check_task(task)
  rng = np.random.default_rng([_MIN_TAG, zlib.crc32(task.encode())])
  most = 0
  for _ in range(_MIN_TOKENS_DRAWS):
    s = _skeleton(task, rng, num_values=MULTIVALUE_MAX)
    most = max(most, _doc_tokens(tokenizer, ''.join(s.needles) + s.question + _target(s.answers)))
  return most


def _split_lines(text: str) -> list[str]:
  """The lines of `text`, each ending in '\n', those over _MAX_LINE_CHARS characters wrapped."""
  pieces = text.split('\n')
  if pieces[-1] == '':
    pieces.pop()
  return [p[k:k + _MAX_LINE_CHARS] + '\n'
          for p in pieces for k in range(0, max(len(p), 1), _MAX_LINE_CHARS)]


def _haystack_lines(haystack: Documents, tokenizer: Tokenizer, rng: np.random.Generator,
                    budget: int) -> tuple[list[str], list[int]]:
  """Lines of consecutive text of random documents (the first from a random line, the others
  from their start) and their token counts, `budget` tokens or just over in all."""
  lines, counts, total, empty, first = [], [], 0, set(), True
  while total < budget:
    doc_id = int(rng.integers(len(haystack)))
    text = haystack[doc_id]
    if not text.strip():
      empty.add(doc_id)
      if len(empty) == len(haystack):
        raise DataError(f'{_name(haystack)}: all {len(haystack)} haystack documents are empty; '
                        'pass documents with text.')
      continue
    doc_lines = _split_lines(text)
    start = int(rng.integers(len(doc_lines))) if first else 0
    first = False
    for line in doc_lines[start:]:
      lines.append(line)
      counts.append(_num_tokens(tokenizer, line))
      total += counts[-1]
      if total >= budget:
        break
  return lines, counts


def _name(haystack) -> str:
  return getattr(haystack, 'name', '') or 'the haystack'


def _cut(tokenizer: Tokenizer, line: str, budget: int) -> str:
  """The longest start of `line` (plus '\n') of at most `budget` >= 1 tokens, by bisection."""
  body = line[:-1]
  lo, hi = 0, len(body)  # body[:lo] + '\n' fits; body[:hi + 1] + '\n' may not
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if _num_tokens(tokenizer, body[:mid] + '\n') <= budget:
      lo = mid
    else:
      hi = mid - 1
  return body[:lo] + '\n'


def _assemble(skeleton: _Skeleton, depths_n: np.ndarray, lines: list[str], counts: list[int],
              budget: int, tokenizer: Tokenizer) -> tuple[str, float]:
  """(prompt, depth): `budget` tokens of haystack lines (by their separate counts), the needles
  at the line boundaries nearest to their depths, then the question."""
  cum = np.cumsum(counts) if counts else np.zeros(0, np.int64)
  k = int(np.searchsorted(cum, budget, side='right'))  # whole lines that fit
  hay, hay_counts = lines[:k], list(counts[:k])
  rest = budget - (int(cum[k - 1]) if k else 0)
  if rest > 0 and k < len(lines):
    hay.append(_cut(tokenizer, lines[k], rest))
    hay_counts.append(_num_tokens(tokenizer, hay[-1]))
  bounds = np.concatenate([[0], np.cumsum(hay_counts)])  # tokens before each line boundary
  total = int(bounds[-1])
  at = np.zeros(len(depths_n), np.int64)
  if len(hay):
    x_n = depths_n * total
    at = np.clip(np.searchsorted(bounds, x_n), 1, len(bounds) - 1)
    at -= (x_n - bounds[at - 1]) < (bounds[at] - x_n)  # the nearer boundary
  pieces, j = [], 0
  for b in range(len(hay) + 1):
    while j < len(at) and at[j] == b:
      pieces.append(skeleton.needles[j])
      j += 1
    if b < len(hay):
      pieces.append(hay[b])
  depth = float(bounds[at[skeleton.answer_needle]] / total) if total else 0.0
  return ''.join(pieces) + skeleton.question, depth


def make_example(task: str, *, num_tokens: int, tokenizer: Tokenizer, haystack: Documents,
                 rng: np.random.Generator) -> Example:
  """One example of `task` whose prompt + target is at most `num_tokens` tokens (BOS included),
  as close to it as the haystack's line boundaries and the tokenizer allow."""
  check_task(task)
  if len(haystack) == 0:
    raise DataError(f'{_name(haystack)} has no documents; pass documents with text.')
  s = _skeleton(task, rng)
  target = _target(s.answers)
  fixed = _doc_tokens(tokenizer, ''.join(s.needles) + s.question + target)
  if fixed > num_tokens:
    raise DataError(f'num_tokens={num_tokens} is too small for {task}: its needles, question and '
                    f'answer take {fixed} tokens with the {tokenizer.name} tokenizer; use at least '
                    f'{min_tokens(task, tokenizer)} tokens (more leaves room for the haystack).')
  # In the needles' order, so their depths are in text order (variable_tracking's chain order).
  depths_n = np.sort(rng.random(len(s.needles)))
  budget = num_tokens - fixed
  lines, counts = _haystack_lines(haystack, tokenizer, rng, budget + budget // 8 + 64)
  best = None  # (tokens, prompt, depth) of the longest fit
  for _ in range(_FIT_ROUNDS):
    prompt, depth = _assemble(s, depths_n, lines, counts, budget, tokenizer)
    n = _doc_tokens(tokenizer, prompt + target)
    if n <= num_tokens and (best is None or n > best[0]):
      best = (n, prompt, depth)
    new_budget = max(0, budget + num_tokens - n)
    if n == num_tokens or new_budget == budget:
      break
    budget = new_budget
  if best is None:  # no haystack at all fits, as `fixed` said
    prompt, depth = _assemble(s, depths_n, lines, counts, 0, tokenizer)
    best = (0, prompt, depth)
  return Example(task, best[1], s.answers, target, best[2])


def _examples_rng(task: str, num_tokens: int, seed: int, i: int) -> np.random.Generator:
  return np.random.default_rng([_EXAMPLES_TAG, zlib.crc32(task.encode()), num_tokens, seed, i])


def examples(task: str, *, num_tokens: int, count: int, seed: int, tokenizer: Tokenizer,
             haystack: Documents) -> list[Example]:
  """`count` examples; example i depends on (task, num_tokens, seed, i) and the haystack only."""
  check_task(task)
  if seed < 0 or count < 0 or num_tokens < 1:
    raise DataError(f'RULER examples need seed >= 0, count >= 0 and num_tokens >= 1 (got seed='
                    f'{seed}, count={count}, num_tokens={num_tokens}).')
  return [make_example(task, num_tokens=num_tokens, tokenizer=tokenizer, haystack=haystack,
                       rng=_examples_rng(task, num_tokens, seed, i)) for i in range(count)]


def _answer_part(text: str) -> str:
  """`text` up to the first TERMINATOR, without surrounding whitespace."""
  return text.split(TERMINATOR, 1)[0].strip()


def score(example: Example, generated: str) -> float:
  """Exact match of the continuation `generated` (cut at TERMINATOR) with the target's answer:
  1.0 or 0.0; the answers of niah_multivalue and variable_tracking in any order."""
  got, want = _answer_part(generated), _answer_part(example.target)
  if len(example.answers) == 1:
    return float(got == want)
  return float({a.strip() for a in got.split(',')} == set(example.answers))


class DocumentSubset(Documents):
  """The documents `ids` of `docs`: one split as a haystack (train for the training mixture,
  held-out for evaluation)."""

  def __init__(self, docs: Documents, ids, split: str = ''):
    self.docs, self.ids = docs, np.asarray(ids, np.int64)
    self.name = f'{docs.name} ({split + " " if split else ""}{len(self.ids)} documents)'
    self.sizes = None if docs.sizes is None else docs.sizes[self.ids]
    self.info = {}

  def __len__(self):
    return len(self.ids)

  def __getitem__(self, i):
    return self.docs[int(self.ids[i])]


def parse_tasks(spec: str) -> tuple[str, ...]:
  """'all' or comma-separated task names -> the tasks; raises DataError for unknown names."""
  if spec.strip() == 'all':
    return TASKS
  tasks = tuple(dict.fromkeys(t.strip() for t in spec.split(',') if t.strip()))
  unknown = [t for t in tasks if t not in TASKS]
  if unknown or not tasks:
    raise DataError(f'Unknown RULER task(s) {", ".join(map(repr, unknown)) or repr(spec)}; '
                    f'choose "all" or some of {", ".join(TASKS)}, comma-separated.')
  return tasks


class TaskStream:
  """Document index -> int32 [<= num_tokens]: encode_doc(prompt + target) of an example of a
  task drawn at random, all from (seed, index); picklable for grain's worker processes."""

  def __init__(self, tasks: tuple[str, ...], num_tokens: int, tokenizer: Tokenizer,
               haystack: Documents, seed: int):
    self.tasks, self.num_tokens, self.tokenizer = tuple(tasks), int(num_tokens), tokenizer
    self.haystack, self.seed = haystack, int(seed)

  def example(self, index: int) -> Example:
    rng = np.random.default_rng([_STREAM_TAG, self.seed, int(index)])
    task = self.tasks[int(rng.integers(len(self.tasks)))]
    return make_example(task, num_tokens=self.num_tokens, tokenizer=self.tokenizer,
                        haystack=self.haystack, rng=rng)

  def __call__(self, index) -> np.ndarray:
    e = self.example(index)
    return self.tokenizer.encode_doc(e.prompt + e.target)

