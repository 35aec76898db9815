"""Costs read off a traced step's jaxpr and its compiled HLO text (for the AOT report, aot.py).

  jaxpr_cost(jaxpr)          matmul FLOPs, with scan bodies at their trip counts and once
  hlo_loop_cost(hlo_text)    bytes accessed and collective bytes, while loops at trip counts;
                             the Pallas kernels XLA cannot cost (kernel_cost.py); bytes and
                             matmul FLOPs by category, and the instructions moving most bytes
  count_collectives(hlo)     collective ops by kind
  hlo_arrays(hlo)            the largest arrays a device's program holds, with their JAX op

XLA's cost analysis counts each while-loop body once; the layers (scan) and micro-batches
(grad_accum scan) are loops, so the report scales XLA's numbers by the ratio of the true and
once-counted costs measured here.
"""

import math
import re

from gated_attention.compile import kernel_cost

COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute')
_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's4': .5, 'u4': .5, 'bf16': 2, 'f16': 2, 's16': 2,
                'u16': 2, 'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8, 'c64': 8}
_ARRAY = re.compile(r'\b(pred|[suf]\d+|bf16|c64|f8\w*)\[([\d,]*)\]')
INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.-]+) = (.*?) ([a-z][a-z0-9-]*)\((.*)$')
NO_TRAFFIC = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all',
              'partition-id', 'replica-id', 'opt-barrier'}


# ----------------------------------------------------------------------------------------------
# jaxpr


def _subjaxprs(params):
  from jax.extend import core as jcore  # pylint: disable=g-import-not-at-top
  for v in params.values():
    for x in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(x, jcore.ClosedJaxpr):
        yield x.jaxpr
      elif isinstance(x, jcore.Jaxpr):
        yield x


def _dot_flops(eqn) -> float:
  """2 x output size x contracted size of a dot_general / ragged_dot_general (a ragged
  contraction, the expert-weight gradient, counts each row once, not once per group)."""
  name = eqn.primitive.name
  lhs, out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
  dn = (eqn.params['dimension_numbers'] if name == 'dot_general'
        else eqn.params['ragged_dot_dimension_numbers'].dot_dimension_numbers)
  flops = 2.0 * math.prod(out) * math.prod(lhs[d] for d in dn[0][0])
  if name == 'ragged_dot_general' and \
      not eqn.params['ragged_dot_dimension_numbers'].rhs_group_dimensions:
    flops /= eqn.invars[2].aval.shape[0]  # output has a group axis; each row hits one group
  return flops


def jaxpr_cost(jaxpr) -> dict:
  """Matmul FLOPs of a jaxpr, with loops at their trip counts ('flops') and once ('flops_once').

  A scan body counts `length` times in 'flops' and once in 'flops_once' (as XLA's cost analysis
  counts it); a while loop of unknown trip count counts once in both; of a cond, the most
  expensive branch. A shard_map body (one shard's program) counts once per shard, so the result
  is the whole step's FLOPs.
  """
  cache = {}

  def walk(jx):
    if id(jx) not in cache:
      total = dict(flops=0.0, flops_once=0.0)
      for eqn in jx.eqns:
        subs = [walk(s) for s in _subjaxprs(eqn.params)]
        name = eqn.primitive.name
        if not subs:
          flops = _dot_flops(eqn) if name in ('dot_general', 'ragged_dot_general') else 0.0
          total = {k: v + flops for k, v in total.items()}
          continue
        sub = (max(subs, key=lambda c: c['flops']) if name == 'cond'
               else {k: sum(c[k] for c in subs) for k in total})
        n = eqn.params.get('length', 1) if name == 'scan' else 1
        shards = (math.prod(dict(eqn.params['mesh'].shape)[a]
                            for a in eqn.params.get('newly_manual_axes', ()))
                  if name == 'shard_map' else 1)
        for k in total:
          total[k] += sub[k] * shards * (1 if k.endswith('_once') else n)
      cache[id(jx)] = total
    return cache[id(jx)]

  return walk(jaxpr.jaxpr if hasattr(jaxpr, 'jaxpr') else jaxpr)


# ----------------------------------------------------------------------------------------------
# HLO text


def hlo_bytes(shape: str) -> float:
  return sum(_DTYPE_BYTES.get(dt, 1) * math.prod(int(d) for d in dims.split(',') if d)
             for dt, dims in _ARRAY.findall(shape))


def _logical_lines(hlo_text: str):
  """The lines of HLO text with each instruction on one line: Pallas kernels' frontend
  attributes hold JSON with newlines, which would otherwise end the computation early (the
  continuation line starts with '}')."""
  pending = None
  for line in hlo_text.splitlines():
    if pending is not None:
      pending += ' ' + line
      if pending.count('{') <= pending.count('}'):
        yield pending
        pending = None
    elif line.startswith(' ') and ' = ' in line and line.count('{') > line.count('}'):
      pending = line
    else:
      yield line
  if pending is not None:
    yield pending


def _computations(hlo_text: str) -> tuple[dict, str | None]:
  """{computation name: its instruction lines}, and the entry computation's name."""
  comps, cur, entry = {}, None, None
  for line in _logical_lines(hlo_text):
    if not line.startswith(' ') and line.rstrip().endswith('{') and '(' in line:
      name = (line.split()[1] if line.startswith('ENTRY') else line.split()[0]).lstrip('%')
      cur = comps.setdefault(name, [])
      entry = name if line.startswith('ENTRY') else entry
    elif line.startswith('}'):
      cur = None
    elif cur is not None and ' = ' in line:
      cur.append(line)
  return comps, entry


def hlo_dims(shape: str) -> list[tuple[int, ...]]:
  """The dimensions of each array in an HLO shape (a tuple shape gives several)."""
  return [tuple(int(d) for d in dims.split(',') if d) for _, dims in _ARRAY.findall(shape)]


def _parse(lines):
  """(instructions [(name, op, operands, attrs)], result bytes by name, parameters by index,
  root name, result dims by name) of one computation."""
  insts, sizes, params, root, dims = [], {}, {}, None, {}
  for line in lines:
    m = INSTRUCTION.match(line)
    if not m:
      continue
    name, shape, op, rest = m.groups()
    sizes[name] = hlo_bytes(shape)
    dims[name] = hlo_dims(shape)
    depth, i = 1, 0
    while i < len(rest) and depth:
      depth += {'(': 1, ')': -1}.get(rest[i], 0)
      i += 1
    if op == 'parameter':
      params[int(rest[:i - 1])] = name
    if line.lstrip().startswith('ROOT'):
      root = name
    insts.append((name, op, re.findall(r'%([\w.-]+)', rest[:i - 1]), rest[i:]))
  return insts, sizes, params, root, dims



_KEYS = ('bytes', 'bytes_once', 'collective_bytes', 'collective_bytes_once',
         'kernel_flops', 'kernel_flops_once', 'kernel_bytes', 'kernel_bytes_once')
TOP = 12  # instructions moving most bytes, kept for the report


class _HloCost:
  """Bytes accessed (operands + result of every non-trivial instruction, fusions as one) and
  collective result bytes, while loops at their trip counts (from the loop condition's s32
  constant: jax scans count from 0) and once."""

  def __init__(self, hlo_text: str):
    self.comps, self.entry = _computations(hlo_text)
    self.parsed = {name: _parse(lines) for name, lines in self.comps.items()}
    self.memo = {}

  def fusion_bytes(self, fused, operands, sizes):
    """Like XLA: a parameter read only through dynamic-slices costs the slices, the buffer a
    dynamic-update-slice writes in place costs nothing, and its result costs the update."""
    insts, fsizes, params, root, _ = self.parsed[fused]
    by_name = {n: (op, ops) for n, op, ops, _ in insts}
    users = {}
    for n, op, ops, _ in insts:
      for j, o in enumerate(ops):
        users.setdefault(o, []).append((n, op, j))
    total = 0.0
    for idx, operand in enumerate(operands):
      uses = users.get(params.get(idx), [])
      if uses and all(op == 'dynamic-slice' and j == 0 for _, op, j in uses):
        total += sum(fsizes[n] for n, _, _ in uses)
      elif not (uses and all(op == 'dynamic-update-slice' and j == 0 for _, op, j in uses)):
        total += sizes.get(operand, 0)
    outs = by_name[root][1] if by_name.get(root, ('',))[0] == 'tuple' else [root]
    for o in outs:
      op, ops = by_name.get(o, ('', []))
      total += fsizes.get(ops[1], 0) if op == 'dynamic-update-slice' else fsizes.get(o, 0)
    return total

  def trip_count(self, cond):
    consts = re.findall(r's32\[\]\S* constant\((\d+)\)', '\n'.join(self.comps.get(cond, [])))
    return int(consts[0]) if len(consts) == 1 else 1

  def instruction_bytes(self, name, op, operands, attrs, sizes):
    fused = re.search(r'calls=%([\w.-]+)', attrs) if op == 'fusion' else None
    if fused and fused.group(1) in self.parsed:
      return self.fusion_bytes(fused.group(1), operands, sizes)
    if op == 'dynamic-slice':
      return 2 * sizes.get(name, 0)
    if op == 'dynamic-update-slice':
      return 2 * sizes.get(operands[1], 0)
    return sizes.get(name, 0) + sum(sizes.get(o, 0) for o in operands)

  def has_matmul(self, op, attrs) -> bool:
    """Whether an instruction is a dot / convolution or a fusion holding one."""
    if op in ('dot', 'convolution'):
      return True
    fused = re.search(r'calls=%([\w.-]+)', attrs) if op == 'fusion' else None
    return bool(fused and fused.group(1) in self.parsed and any(
        o in ('dot', 'convolution') for _, o, _, _ in self.parsed[fused.group(1)][0]))

  def custom_call(self, name, operands, attrs, sizes, dims):
    return kernel_cost.custom_call_cost(
        name, attrs, [((dims.get(o) or [()])[0], sizes.get(o, 0)) for o in operands],
        sizes.get(name, 0), dims.get(name, []))

  def category(self, op, attrs) -> str:
    if any(c in op for c in COLLECTIVES) or re.search(r'calls=%(?:all-)?reduce-scatter', attrs):
      return 'collectives'
    if self.has_matmul(op, attrs):
      return 'matmuls (XLA fusions)'
    if op.startswith('copy') or op in ('transpose',) or re.search(r'calls=%\w*(copy|transpose)',
                                                                   attrs):
      return 'copies / transposes'
    return 'elementwise / reductions / other'

  def subcomputations(self, op, attrs) -> tuple[list, int]:
    """(costs of the computations a while / call / conditional runs, repetitions)."""
    if op == 'while':
      body = re.search(r'body=%([\w.-]+)', attrs).group(1)
      return [self.cost(body)], self.trip_count(re.search(r'condition=%([\w.-]+)', attrs).group(1))
    subs = [self.cost(c) for c in re.findall(r'%([\w.-]+)', attrs.split('metadata=')[0])
            if c in self.parsed]
    if op == 'conditional' and subs:
      subs = [max(subs, key=lambda c: c['bytes'])]
    return subs, 1

  def cost(self, cname):
    if cname not in self.memo:
      insts, sizes, _, _, dims = self.parsed.get(cname, ([], {}, {}, None, {}))
      tot, top = dict.fromkeys(_KEYS, 0.0), []

      def add(key, value, cat=None):
        for k in (key, key + '_once'):
          tot[k] = tot.get(k, 0.0) + value
        if cat:
          tot[key.split('_')[-1] + ':' + cat] = tot.get(key.split('_')[-1] + ':' + cat, 0.0) + value

      for name, op, operands, attrs in insts:
        if op in ('while', 'call', 'conditional'):
          subs, n = self.subcomputations(op, attrs)
          for k in {k for c in subs for k in c if k != 'top'}:
            tot[k] = tot.get(k, 0.0) + sum(c.get(k, 0.0) for c in subs) * (
                1 if k.endswith('_once') else n)
          top += [(b * n, *rest) for c in subs for b, *rest in c['top']]
          continue
        if op in NO_TRAFFIC:
          continue
        op_name = re.search(r'op_name="([^"]*)"', attrs)
        where = (op_name.group(1) if op_name else op)[-90:]
        if op == 'custom-call' and 'tpu_custom_call' in attrs:
          kc = self.custom_call(name, operands, attrs, sizes, dims)
          cat = kc['kernel'] + ' kernel'
          add('bytes', kc['xla_bytes'], cat)          # what XLA's cost analysis counted
          add('kernel_bytes', kc['bytes'] - kc['xla_bytes'], cat)   # what the report adds
          add('kernel_flops', kc['flops'] - kc['xla_flops'])
          tot['flops:' + cat] = tot.get('flops:' + cat, 0.0) + kc['flops']
          top.append((kc['bytes'], cat, where,
                      ';'.join('x'.join(map(str, d)) for d in dims.get(name, []))))
          continue
        b = self.instruction_bytes(name, op, operands, attrs, sizes)
        cat = self.category(op, attrs)
        add('bytes', b, cat)
        if cat == 'collectives':
          add('collective_bytes', sizes.get(name, 0))
        top.append((b, cat, where, ';'.join('x'.join(map(str, d)) for d in dims.get(name, []))))
      tot['top'] = sorted(top, key=lambda t: -t[0])[:TOP]
      self.memo[cname] = tot
    return self.memo[cname]


def hlo_loop_cost(hlo_text: str) -> dict:
  """Costs of a compiled HLO module, loops at their trip counts and (`*_once`) once:
    bytes, collective_bytes        what XLA's cost analysis also sees (the report uses only
                                   the ratio true/once, to scale XLA's own bytes accessed);
    kernel_flops, kernel_bytes     Pallas kernels XLA counts nothing for (kernel_cost.py);
    'bytes:<category>'             bytes by category (matmul fusions, Pallas kernels,
                                   collectives, copies, other); 'flops:<kernel> kernel' too;
    top                            [(bytes, category, op_name, shapes)] of the instructions moving
                                   most bytes, at their trip counts."""
  c = _HloCost(hlo_text)
  return dict(c.cost(c.entry)) if c.entry else dict(dict.fromkeys(_KEYS, 0.0), top=[])


def count_collectives(hlo_text: str) -> dict:
  """Collective ops in compiled HLO text. TPU emits reduce-scatters as fusions whose called
  computation is named all-reduce-scatter.*, so those count as reduce-scatter too."""
  counts = {}
  for op in COLLECTIVES:
    counts[op] = len(re.findall(r'(?<![%\w.-])' + op + r'(?:-start)?\(', hlo_text))
  counts['reduce-scatter'] += len(re.findall(r'calls=%(?:all-)?reduce-scatter', hlo_text))
  return counts


def hlo_arrays(hlo_text: str, top: int = 10) -> list[tuple[str, str, int, float]]:
  """The largest arrays one device's compiled program holds (arguments and instruction results
  outside fusions, loop bodies included): (shape, JAX op, count, bytes), largest first. Sizes
  only: which of them are live at the same time is the compiler's business."""
  fused = set(re.findall(r'fusion\(.*calls=%([\w.-]+)', hlo_text))
  found, cur = {}, None
  for line in _logical_lines(hlo_text):
    if not line.startswith(' ') and line.rstrip().endswith('{') and '(' in line:
      name = (line.split()[1] if line.startswith('ENTRY') else line.split()[0]).lstrip('%')
      cur = None if name in fused else name
    elif cur is not None and ' = ' in line:
      m = INSTRUCTION.match(line)
      if not m or m.group(3) in NO_TRAFFIC - {'parameter'} or m.group(2).startswith('('):
        continue
      op = re.search(r'op_name="((?:[^"\\]|\\.)*)"', line)
      key = (re.sub(r'\{[^}]*\}', '', m.group(2)),
             op.group(1).replace('\\', '')[-100:] if op else m.group(3))
      n, _ = found.get(key, (0, 0.0))
      found[key] = (n + 1, hlo_bytes(m.group(2)))
  rows = sorted(found.items(), key=lambda kv: -kv[1][1])[:top]
  return [(shape, op, n, size) for (shape, op), (n, size) in rows]
