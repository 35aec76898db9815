"""Costs read off a traced step's jaxpr and its compiled HLO text (for the AOT report, aot.py).

  jaxpr_cost(jaxpr)          matmul FLOPs, with scan bodies at their trip counts and once
  hlo_loop_cost(hlo_text)    bytes accessed and collective bytes, while loops at trip counts
  count_collectives(hlo)     collective ops by kind
  hlo_arrays(hlo)            the largest arrays a device's program holds, with their JAX op

XLA's cost analysis counts each while-loop body once; the layers (scan) and micro-batches
(grad_accum scan) are loops, so the report scales XLA's numbers by the ratio of the true and
once-counted costs measured here.
"""

import math
import re

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


def _computations(hlo_text: str) -> tuple[dict, str | None]:
  """{computation name: its instruction lines}, and the entry computation's name."""
  comps, cur, entry = {}, None, None
  for line in hlo_text.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{') and '(' in line:
      name = (line.split()[1] if line.startswith('ENTRY') else line.split()[0]).lstrip('%')
      cur = comps.setdefault(name, [])
      entry = name if line.startswith('ENTRY') else entry
    elif line.startswith('}'):
      cur = None
    elif cur is not None and ' = ' in line:
      cur.append(line)
  return comps, entry


def _parse(lines):
  """(instructions [(name, op, operands, attrs)], result bytes by name, parameters by index,
  root name) of one computation."""
  insts, sizes, params, root = [], {}, {}, None
  for line in lines:
    m = INSTRUCTION.match(line)
    if not m:
      continue
    name, shape, op, rest = m.groups()
    sizes[name] = hlo_bytes(shape)
    depth, i = 1, 0
    while i < len(rest) and depth:
      depth += {'(': 1, ')': -1}.get(rest[i], 0)
      i += 1
    if op == 'parameter':
      params[int(rest[:i - 1])] = name
    if line.lstrip().startswith('ROOT'):
      root = name
    insts.append((name, op, re.findall(r'%([\w.-]+)', rest[:i - 1]), rest[i:]))
  return insts, sizes, params, root


_KEYS = ('bytes', 'bytes_once', 'collective_bytes', 'collective_bytes_once')


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
    insts, fsizes, params, root = self.parsed[fused]
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
      insts, sizes, _, _ = self.parsed.get(cname, ([], {}, {}, None))
      tot = dict.fromkeys(_KEYS, 0.0)
      for name, op, operands, attrs in insts:
        if op in ('while', 'call', 'conditional'):
          subs, n = self.subcomputations(op, attrs)
          for k in _KEYS:
            tot[k] += sum(c[k] for c in subs) * (1 if k.endswith('_once') else n)
        elif op not in NO_TRAFFIC:
          b = self.instruction_bytes(name, op, operands, attrs, sizes)
          tot['bytes'] += b
          tot['bytes_once'] += b
          if any(c in op for c in COLLECTIVES) or re.search(r'calls=%(?:all-)?reduce-scatter',
                                                            attrs):
            tot['collective_bytes'] += sizes.get(name, 0)
            tot['collective_bytes_once'] += sizes.get(name, 0)
      self.memo[cname] = tot
    return self.memo[cname]


def hlo_loop_cost(hlo_text: str) -> dict:
  """{bytes, bytes_once, collective_bytes, collective_bytes_once} of a compiled HLO module.
  Only the ratio true/once is used to scale XLA's own bytes accessed, which counts loops once."""
  c = _HloCost(hlo_text)
  return c.cost(c.entry) if c.entry else dict.fromkeys(_KEYS, 0.0)


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
  for line in hlo_text.splitlines():
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
