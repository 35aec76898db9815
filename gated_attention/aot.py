"""Ahead-of-time compilation of the sharded training step for a TPU topology, on any machine.

  python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=compile --topology=v5p:4x4x4

With libtpu installed (`pip install -r requirements-tpu.txt`) JAX can describe the devices of a
TPU slice it is not running on (`jax.experimental.topologies.get_topology_desc`). `report` builds
the config's mesh on those devices (`config.mesh`, one axis -1), builds `train.Setup` on it (the
same shardings and the same jit as training), lowers the real train step (forward, backward,
AdamW update, gradient accumulation) from abstract shapes and compiles it with the TPU compiler.
Nothing is allocated and no TPU is needed. The report gives:

- memory: per-device bytes from `compiled.memory_analysis()` (arguments, outputs, aliased
  (donated) bytes, temporaries, generated code, total) against the chip's HBM. The TPU compiler
  rejects most steps that do not fit (then the report gives its "needs X, has Y" and the largest
  buffers of its memory-usage report, which libtpu writes to its log); a step that compiles but
  exceeds HBM is reported as not fitting, with the largest arrays of the compiled program.
- flops: `compiled.cost_analysis()` against the analytic count (`model.train_flops_per_token`, the
  one function training uses too). XLA's cost analysis counts the body of every while loop once,
  and the layers (scan) and micro-batches (grad_accum scan) are while loops, so the raw number
  is scaled by the loop trip counts measured on the step's jaxpr (`_jaxpr_cost`); the bytes
  accessed likewise, by trip counts read from the compiled HLO (`_hlo_loop_cost`).
- roofline: step time = max(FLOPs / peak bf16 rate, bytes accessed / HBM bandwidth) per device,
  and the MFU that implies (analytic model FLOPs / (time x peak)). It ignores communication and
  MXU efficiency: an upper bound, useful to compare meshes and variants, not a promise.
- collectives: counts by kind in the compiled program, and their result bytes per step.

libtpu on a machine without TPUs: `_prepare_libtpu` keeps it quiet and off /tmp/libtpu_lockfile
and keeps JAX's default backend CPU (unless JAX_PLATFORMS says otherwise).

Per-device numbers: v5e/v5p/v6e expose one JAX device per chip; v4's compile-only topology has one
device per TensorCore (two per chip), so its chip figures are halved per device.
"""

import atexit
import glob
import math
import os
import re
import shutil
import tempfile
import time

# Peak dense bf16 FLOP/s, HBM bytes and HBM bandwidth per chip.
CHIPS = {
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOPs (bf16), HBM2 32 GiB, 1200 GBps; 2 TensorCores
    'v4': dict(peak_bf16_flops=275e12, hbm_bytes=32 * 2**30, hbm_bandwidth=1200e9),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOPs (bf16), HBM2 16 GB, 819 GBps
    'v5e': dict(peak_bf16_flops=197e12, hbm_bytes=16 * 2**30, hbm_bandwidth=819e9),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOPs (bf16), HBM2e 95 GB, 2765 GBps
    'v5p': dict(peak_bf16_flops=459e12, hbm_bytes=95 * 2**30, hbm_bandwidth=2765e9),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOPs (bf16), HBM 32 GB, 1640 GBps
    'v6e': dict(peak_bf16_flops=918e12, hbm_bytes=32 * 2**30, hbm_bandwidth=1640e9),
}
# Names libtpu's topology parser does not take -> the one it does.
ALIASES = {'v5litepod': 'v5e', 'v5lite': 'v5e', 'trillium': 'v6e', 'v6': 'v6e'}
# JAX device_kind -> chip (for training-time MFU on real devices).
DEVICE_KINDS = {'TPU v4': 'v4', 'TPU v5 lite': 'v5e', 'TPU v5e': 'v5e', 'TPU v5': 'v5p',
                'TPU v5p': 'v5p', 'TPU v6 lite': 'v6e', 'TPU v6e': 'v6e'}

COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute')

# libtpu, loaded on a machine without TPUs, otherwise prints warnings about the missing TPU
# metadata and takes /tmp/libtpu_lockfile (then fails while any other JAX process holds it).
_LIBTPU_ENV = {
    'TPU_SKIP_MDS_QUERY': '1',            # no GCE metadata server queries
    'TPU_WORKER_HOSTNAMES': 'localhost',  # silences "could not determine TPU worker hostnames"
    'TPU_HOST_BOUNDS': '1,1,1',           # silences "Failed to find host bounds"
    'ALLOW_MULTIPLE_LIBTPU_LOAD': '1',    # do not fail when another process holds the lockfile
}
_log_dir = None


def chip_spec(device_kind: str) -> dict | None:
  """CHIPS entry for a JAX device_kind ('TPU v5 lite' -> v5e), or None (CPU, GPU, unknown)."""
  name = DEVICE_KINDS.get(device_kind)
  return dict(CHIPS[name], chip=name) if name else None


def _prepare_libtpu():
  """Environment for a compile-only libtpu: quiet, no lockfile, logs in a known directory."""
  global _log_dir
  for k, v in _LIBTPU_ENV.items():
    os.environ.setdefault(k, v)
  if _log_dir is None:
    _log_dir = os.environ.get('TPU_LOG_DIR')
    if not _log_dir:
      _log_dir = tempfile.mkdtemp(prefix='tpu_aot_logs_')
      os.environ['TPU_LOG_DIR'] = _log_dir
      atexit.register(shutil.rmtree, _log_dir, ignore_errors=True)
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  # Compiling for a topology needs no TPU backend; keep the default backend CPU so JAX does not
  # also try (and fail) to open local TPUs. Only possible before any backend is initialised.
  if not os.environ.get('JAX_PLATFORMS') and not xla_bridge.backends_are_initialized():
    jax.config.update('jax_platforms', 'cpu')


def parse_topology(topology: str) -> tuple[str, str]:
  """'v5p:4x4x4' -> ('v5p', 'v5p:4x4x4'); 'v5litepod:2x2' -> ('v5e', 'v5e:2x2')."""
  if not topology or ':' not in topology:
    raise ValueError(f'--topology={topology!r}: expected a TPU topology name such as v5p:4x4x4, '
                     'v5e:4x4, v6e:2x2 or v4:2x2x2 (<generation>:<chip grid>).')
  gen, shape = topology.split(':', 1)
  gen = ALIASES.get(gen.lower(), gen.lower())
  if gen not in CHIPS:
    raise ValueError(f'--topology={topology!r}: unknown TPU generation {gen!r}; known: '
                     f'{", ".join(CHIPS)} (aliases: {", ".join(ALIASES)}).')
  return gen, f'{gen}:{shape}'


def topology_devices(topology: str):
  """(generation, compile-only devices) of a TPU slice, e.g. 64 for v5p:4x4x4."""
  gen, name = parse_topology(topology)
  _prepare_libtpu()
  try:
    import libtpu  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise RuntimeError('--mode=compile needs libtpu (compile-only, no TPU required): '
                       'pip install -r requirements-tpu.txt') from e
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    devices = topologies.get_topology_desc(topology_name=name, platform='tpu').devices
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'libtpu does not know the topology {name!r}: {e}') from e
  return gen, list(devices)


def abstract_batch(setup, cfg) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  shape = (cfg.train.batch_size, cfg.data.seq_len)
  return {k: jax.ShapeDtypeStruct(shape, dt, sharding=setup.batch_sharding)
          for k, dt in (('inputs', jnp.int32), ('targets', jnp.int32),
                        ('loss_mask', jnp.float32))}


def _shard_bytes(tree) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def _jaxpr_cost(jaxpr) -> dict:
  """Matmul FLOPs of a jaxpr, with loops at their trip counts ('flops') and once ('flops_once').

  2 x output size x contracted size for every dot_general / ragged_dot_general (a ragged
  contraction, the expert-weight gradient, counts each row once, not once per group). A scan body
  counts `length` times in 'flops' and once in 'flops_once' (as XLA's cost analysis counts it); a
  while loop of unknown trip count counts once in both. A shard_map body (one shard's program)
  counts once per shard, so the result is the whole step's FLOPs.
  """
  from jax.extend import core as jcore  # pylint: disable=g-import-not-at-top

  def subjaxprs(params):
    for v in params.values():
      for x in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(x, jcore.ClosedJaxpr):
          yield x.jaxpr
        elif isinstance(x, jcore.Jaxpr):
          yield x

  cache = {}

  def walk(jx):
    if id(jx) in cache:
      return cache[id(jx)]
    total = dict(flops=0.0, flops_once=0.0)
    for eqn in jx.eqns:
      name = eqn.primitive.name
      subs = list(subjaxprs(eqn.params))
      if subs:
        costs = [walk(s) for s in subs]
        if name == 'cond':  # one branch runs: take the most expensive
          sub = max(costs, key=lambda c: c['flops'])
        else:
          sub = {k: sum(c[k] for c in costs) for k in total}
        n = eqn.params.get('length', 1) if name == 'scan' else 1
        # A shard_map body is one shard's program: every device of its manual axes runs it.
        shards = (math.prod(dict(eqn.params['mesh'].shape)[a]
                            for a in eqn.params.get('newly_manual_axes', ()))
                  if name == 'shard_map' else 1)
        for k in total:
          total[k] += sub[k] * shards * (1 if k.endswith('_once') else n)
        continue
      flops = 0.0
      if name in ('dot_general', 'ragged_dot_general'):
        lhs = eqn.invars[0].aval.shape
        out = eqn.outvars[0].aval.shape
        dn = (eqn.params['dimension_numbers'] if name == 'dot_general'
              else eqn.params['ragged_dot_dimension_numbers'].dot_dimension_numbers)
        contracted = math.prod(lhs[d] for d in dn[0][0])
        flops = 2.0 * math.prod(out) * contracted
        if name == 'ragged_dot_general' and \
            not eqn.params['ragged_dot_dimension_numbers'].rhs_group_dimensions:
          flops /= eqn.invars[2].aval.shape[0]  # output has a group axis; each row hits one group
      total['flops'] += flops
      total['flops_once'] += flops
    cache[id(jx)] = total
    return total

  return walk(jaxpr.jaxpr if hasattr(jaxpr, 'jaxpr') else jaxpr)


_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's4': .5, 'u4': .5, 'bf16': 2, 'f16': 2, 's16': 2,
                'u16': 2, 'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8, 'c64': 8}
_ARRAY = re.compile(r'\b(pred|[suf]\d+|bf16|c64|f8\w*)\[([\d,]*)\]')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.-]+) = (.*?) ([a-z][a-z0-9-]*)\((.*)$')
_NO_TRAFFIC = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all',
               'partition-id', 'replica-id', 'opt-barrier'}


def _hlo_bytes(shape: str) -> float:
  return sum(_DTYPE_BYTES.get(dt, 1) * math.prod(int(d) for d in dims.split(',') if d)
             for dt, dims in _ARRAY.findall(shape))


def _hlo_loop_cost(hlo_text: str) -> dict:
  """Bytes accessed (operands + result of every non-trivial instruction, fusions as one) and
  collective result bytes of a compiled HLO module, with while loops at their trip counts and
  once. Trip counts come from the loop condition's s32 constant (jax scans count from 0).
  Only the ratio true/once is used to scale XLA's own bytes accessed, which counts loops once."""
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
  parsed = {}
  for cname, lines in comps.items():
    insts, sizes, params, root = [], {}, {}, None
    for line in lines:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      name, shape, op, rest = m.groups()
      sizes[name] = _hlo_bytes(shape)
      depth, i = 1, 0
      while i < len(rest) and depth:
        depth += {'(': 1, ')': -1}.get(rest[i], 0)
        i += 1
      operands = re.findall(r'%([\w.-]+)', rest[:i - 1])
      if op == 'parameter':
        params[int(rest[:i - 1])] = name
      if line.lstrip().startswith('ROOT'):
        root = name
      insts.append((name, op, operands, rest[i:]))
    parsed[cname] = (insts, sizes, params, root)

  def fusion_bytes(fused, operands, sizes):
    """Like XLA: a parameter read only through dynamic-slices costs the slices, the buffer a
    dynamic-update-slice writes in place costs nothing, and its result costs the update."""
    insts, fsizes, params, root = parsed[fused]
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
      elif uses and all(op == 'dynamic-update-slice' and j == 0 for _, op, j in uses):
        pass
      else:
        total += sizes.get(operand, 0)
    outs = by_name[root][1] if by_name.get(root, ('',))[0] == 'tuple' else [root]
    for o in outs:
      op, ops = by_name.get(o, ('', []))
      total += fsizes.get(ops[1], 0) if op == 'dynamic-update-slice' else fsizes.get(o, 0)
    return total

  def trip_count(cond):
    consts = re.findall(r's32\[\]\S* constant\((\d+)\)', '\n'.join(comps.get(cond, [])))
    return int(consts[0]) if len(consts) == 1 else 1

  keys = ('bytes', 'bytes_once', 'collective_bytes', 'collective_bytes_once')
  memo = {}

  def cost(cname):
    if cname in memo:
      return memo[cname]
    insts, sizes, _, _ = parsed.get(cname, ([], {}, {}, None))
    tot = dict.fromkeys(keys, 0.0)
    for name, op, operands, attrs in insts:
      if op == 'while':
        body = re.search(r'body=%([\w.-]+)', attrs).group(1)
        n = trip_count(re.search(r'condition=%([\w.-]+)', attrs).group(1))
        sub = cost(body)
        for k in keys:
          tot[k] += sub[k] * (1 if k.endswith('_once') else n)
      elif op in ('call', 'conditional'):
        subs = [cost(c) for c in re.findall(r'%([\w.-]+)', attrs.split('metadata=')[0])
                if c in parsed]
        if subs:
          pick = ([max(subs, key=lambda c: c['bytes'])] if op == 'conditional' else subs)
          for k in keys:
            tot[k] += sum(c[k] for c in pick)
      elif op not in _NO_TRAFFIC:
        fused = re.search(r'calls=%([\w.-]+)', attrs) if op == 'fusion' else None
        if fused and fused.group(1) in parsed:
          b = fusion_bytes(fused.group(1), operands, sizes)
        elif op == 'dynamic-slice':
          b = 2 * sizes.get(name, 0)
        elif op == 'dynamic-update-slice':
          b = 2 * sizes.get(operands[1], 0)
        else:
          b = sizes.get(name, 0) + sum(sizes.get(o, 0) for o in operands)
        tot['bytes'] += b
        tot['bytes_once'] += b
        if any(c in op for c in COLLECTIVES) or re.search(r'calls=%(?:all-)?reduce-scatter', attrs):
          tot['collective_bytes'] += sizes.get(name, 0)
          tot['collective_bytes_once'] += sizes.get(name, 0)
    memo[cname] = tot
    return tot

  return cost(entry) if entry else dict.fromkeys(keys, 0.0)


def largest_hlo_arrays(hlo_text: str, cfg, n_dev: int, top: int = 10) -> list:
  """The largest arrays one device's compiled program holds (arguments and instruction results
  outside fusions, loop bodies included), with the JAX op that made them. Sizes only: which of
  them are live at the same time is the compiler's business (its report on an OOM says)."""
  fused = set(re.findall(r'fusion\(.*calls=%([\w.-]+)', hlo_text))
  found, cur = {}, None
  for line in hlo_text.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{') and '(' in line:
      name = (line.split()[1] if line.startswith('ENTRY') else line.split()[0]).lstrip('%')
      cur = None if name in fused else name
    elif cur is not None and ' = ' in line:
      m = _INSTRUCTION.match(line)
      if not m or m.group(3) in _NO_TRAFFIC - {'parameter'} or m.group(2).startswith('('):
        continue
      size = _hlo_bytes(m.group(2))
      op = re.search(r'op_name="((?:[^"\\]|\\.)*)"', line)
      shape = re.sub(r'\{[^}]*\}', '', m.group(2))
      key = (shape, op.group(1).replace('\\', '')[-100:] if op else m.group(3))
      n, _ = found.get(key, (0, size))
      found[key] = (n + 1, size)
  rows = sorted(found.items(), key=lambda kv: -kv[1][1])[:top]
  return [{'size': _human(size), 'count': n, 'shapes': shape, 'op': op,
           'likely': _describe_shape(shape, cfg, n_dev)} for (shape, op), (n, size) in rows]


def count_collectives(hlo_text: str) -> dict:
  """Collective ops in compiled HLO text. TPU emits reduce-scatters as fusions whose called
  computation is named all-reduce-scatter.*, so those count as reduce-scatter too."""
  counts = {}
  for op in COLLECTIVES:
    counts[op] = len(re.findall(r'(?<![%\w.-])' + op + r'(?:-start)?\(', hlo_text))
  counts['reduce-scatter'] += len(re.findall(r'calls=%(?:all-)?reduce-scatter', hlo_text))
  return counts


def _human(n: float) -> str:
  return f'{n / 2**30:.2f}GiB' if n >= 2**30 else f'{n / 2**20:.1f}MiB'


def _gib(x) -> float:
  return round(x / 2**30, 3)


_SIZE = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


def _parse_size(s: str) -> float:
  m = re.match(r'([\d.]+)\s*([KMGT]?)', s)
  return float(m.group(1)) * _SIZE[m.group(2)] if m else float('nan')


def _describe_shape(shapes: str, cfg, n_dev: int) -> str:
  """A guess at what a buffer is, from its shape(s), for the largest-buffer list."""
  m, tc, T = cfg.model, cfg.train, cfg.data.seq_len
  dims = {int(d) for d in re.findall(r'(?<=[\[,])\d+(?=[\],])', shapes)}
  micro = tc.batch_size // tc.grad_accum
  if m.moe.num_experts and dims & {tc.batch_size * T * m.moe.top_k, micro * T * m.moe.top_k}:
    return ('MoE dispatch over ALL tokens of the global (micro-)batch x top_k: the token sort / '
            'ragged_dot is not sharded, every device holds it')
  if m.moe.num_experts and dims & {micro * T * m.moe.top_k // n_dev}:
    return 'MoE dispatch (this device\'s tokens x top_k)'
  if m.vocab_size in dims and T in dims:
    return 'logits (or their gradient) [B, T, vocab]'
  if re.search(rf'\b{T},{T}\]', shapes):
    return 'attention scores/probabilities [.., T, T]'
  if m.vocab_size in dims:
    return 'embedding / LM head (or its gradient / optimizer state)'
  lead = re.match(r'\D*\[(\d+),(\d+)', shapes)
  if lead and int(lead.group(1)) == m.num_layers:
    if m.moe.num_experts and int(lead.group(2)) == m.moe.num_experts:
      return 'stacked expert weights, their gradients or AdamW moments'
    return 'stacked per-layer weights (or gradients, AdamW moments, saved activations)'
  return ''


def _log_sizes() -> dict:
  """This process's libtpu WARNING logs -> size. libtpu reads TPU_LOG_DIR when it loads, which
  may have happened before _prepare_libtpu (JAX probing for TPUs): look in the default too."""
  dirs = {d for d in (_log_dir, os.path.join(tempfile.gettempdir(), 'tpu_logs')) if d}
  return {p: os.path.getsize(p) for d in dirs
          for p in glob.glob(os.path.join(d, f'*.log.WARNING.*.{os.getpid()}'))}


def _oom_details(err: str, cfg, n_dev: int, logs_before: dict) -> dict:
  """Compiler's 'used X of Y' and the largest buffers of its memory-usage report, which libtpu
  writes to its WARNING log (only what this compile appended to it is read)."""
  out = {'compiler_error': err.strip().splitlines()[0][:500]}
  m = (re.search(r'required for HLO temporaries \(([\d.]+[KMGT]?)\) exceeds available HBM '
                 r'\(([\d.]+[KMGT]?)\)', err) or
       re.search(r'Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?)', err) or
       re.search(r'Requires ([\d.]+[KMGT]?), has ([\d.]+[KMGT]?) available', err))
  report = ''
  for path in _log_sizes():
    with open(path, errors='replace') as f:
      f.seek(logs_before.get(path, 0))
      text = f.read()
    i = text.rfind('Ran out of memory in memory space hbm')
    if i >= 0:
      report = text[i:]
      break
  if report:
    m = re.search(r'Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) hbm', report) or m
    rows = re.findall(r'^\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+\w+);\s*\d+;\s*(\d+);\s*(.+)$', report,
                      re.M)
    out['largest_buffers'] = [
        {'size': size, 'values': int(n), 'shapes': shapes.strip()[:200],
         'likely': _describe_shape(shapes, cfg, n_dev)} for size, n, shapes in rows[:10]]
  if m:
    out['required_bytes'] = _parse_size(m.group(1))
    out['hbm_available_to_xla_bytes'] = _parse_size(m.group(2))
  return out


def report(config, topology: str, *, keep_hlo: bool = False) -> dict:
  """Compile the training step of `config` for a TPU topology; returns the JSON-able report."""
  gen, devices = topology_devices(topology)
  import jax  # pylint: disable=g-import-not-at-top
  from gated_attention import model as model_lib  # pylint: disable=g-import-not-at-top
  from gated_attention import sharding  # pylint: disable=g-import-not-at-top
  from gated_attention import train  # pylint: disable=g-import-not-at-top

  cores_per_chip = len({getattr(d, 'core_on_chip', 0) for d in devices})
  chip = CHIPS[gen]
  per_device = {k: v / cores_per_chip for k, v in chip.items()}
  n_dev = len(devices)
  mesh = sharding.build_mesh(config.mesh, devices)
  setup = train.Setup(config, mesh)
  tc, T = config.train, config.data.seq_len
  batch_shards = setup.batch_shards
  params = model_lib.param_report(config.model)
  tokens = tc.batch_size * T
  analytic = model_lib.train_flops_per_token(config.model, T) * tokens
  out = {
      'config': f'{config.variant}:{config.scale}',
      'topology': f'{gen}:{topology.split(":", 1)[1]}',
      'chip': gen,
      'devices': n_dev,
      'devices_per_chip': cores_per_chip,
      'device_kind': devices[0].device_kind,
      'mesh': dict(mesh.shape),
      'rules': config.mesh.rules,
      'params': {'total': params['total'], 'active': params['active']},
      'batch': {
          'global_batch': tc.batch_size, 'seq_len': T, 'tokens_per_step': tokens,
          'grad_accum': tc.grad_accum, 'data_parallel_shards': batch_shards,
          'per_device_batch': tc.batch_size / batch_shards,
          'per_device_micro_batch': tc.batch_size / batch_shards / tc.grad_accum,
          'remat': config.model.remat,
      },
      'chip_spec': dict(chip, per_device={k: v for k, v in per_device.items()}),
  }
  if config.mesh.get('dcn_data', 1) != 1:
    out['note'] = ('config.mesh.dcn_data > 1 (multi-slice) is not modelled: this compiles one '
                   'slice holding the whole mesh.')

  batch = abstract_batch(setup, config)
  t0 = time.time()
  with jax.set_mesh(mesh):
    traced = setup.train_step.trace(setup.abstract_params, setup.abstract_opt, batch)
    lowered = traced.lower()
  t1 = time.time()
  cost = _jaxpr_cost(traced.jaxpr)
  state_bytes = _shard_bytes((setup.abstract_params, setup.abstract_opt))
  logs_before = _log_sizes()
  try:
    compiled = lowered.compile()
    error = None
  except Exception as e:  # pylint: disable=broad-except
    compiled, error = None, str(e)
  t2 = time.time()
  out['compile_seconds'] = {'lower': round(t1 - t0, 2), 'compile': round(t2 - t1, 2)}

  flops = {
      'analytic_per_step': analytic,
      'analytic_per_device': analytic / n_dev,
      'analytic_formula': '6 x active matmul params x tokens + 6 x layers x heads x head_dim '
                          'x seq_len x tokens (causal attention)',
      'program_matmul_per_step': cost['flops'],
      'program_over_analytic': round(cost['flops'] / analytic, 3),
  }
  out['flops'] = flops
  if compiled is None:
    if 'RESOURCE_EXHAUSTED' not in error and 'memory' not in error.lower():
      raise RuntimeError(f'Compiling {out["config"]} for {topology} failed: {error}')
    details = _oom_details(error, config, n_dev, logs_before)
    out['fits'] = False
    out['memory'] = dict(details, state_bytes_per_device=state_bytes,
                         hbm_bytes_per_device=per_device['hbm_bytes'])
    req = details.get('required_bytes')
    out['message'] = (
        f'Does NOT fit: the step needs {_gib(req) if req else "?"} GiB per device, the '
        f'{gen} device has {_gib(details.get("hbm_available_to_xla_bytes", per_device["hbm_bytes"]))}'
        f' GiB. Largest buffers: ' + '; '.join(
            f'{b["size"]} {b["shapes"][:120]}' + (f' ({b["likely"]})' if b['likely'] else '')
            for b in details.get('largest_buffers', [])[:3]) +
        '. Try a larger slice, more --config.train.grad_accum, --config.model.remat=full, or '
        'other --config.mesh rules.')
    return out

  ma = compiled.memory_analysis()
  total = (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes +
           ma.temp_size_in_bytes + ma.generated_code_size_in_bytes)
  # The TPU compiler rejects most programs that exceed HBM (above), but not all: check too.
  fits = total <= per_device['hbm_bytes']
  out['fits'] = fits
  out['memory'] = {
      'arguments_bytes': ma.argument_size_in_bytes,
      'outputs_bytes': ma.output_size_in_bytes,
      'aliased_bytes': ma.alias_size_in_bytes,
      'temporaries_bytes': ma.temp_size_in_bytes,
      'generated_code_bytes': ma.generated_code_size_in_bytes,
      'total_bytes': total,
      'total_gib': _gib(total),
      'hbm_bytes_per_device': per_device['hbm_bytes'],
      'hbm_fraction': round(total / per_device['hbm_bytes'], 4),
      'state_bytes_per_device': state_bytes,
      'host_bytes': (ma.host_argument_size_in_bytes + ma.host_output_size_in_bytes -
                     ma.host_alias_size_in_bytes + ma.host_temp_size_in_bytes),
      'total_formula': 'arguments + outputs - aliased (donated) + temporaries + generated code',
  }
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  raw_flops, raw_bytes = float(ca.get('flops', 0.0)), float(ca.get('bytes accessed', 0.0))
  hlo = compiled.as_text()
  hlo_cost = _hlo_loop_cost(hlo)
  f_scale = cost['flops'] / cost['flops_once'] if cost['flops_once'] else 1.0
  b_scale = hlo_cost['bytes'] / hlo_cost['bytes_once'] if hlo_cost['bytes_once'] else 1.0
  xla_flops, xla_bytes = raw_flops * f_scale, raw_bytes * b_scale
  flops.update({
      'xla_per_device': xla_flops,
      'xla_per_step': xla_flops * n_dev,
      'xla_over_analytic': round(xla_flops * n_dev / analytic, 3),
      'xla_cost_analysis_raw_per_device': raw_flops,
      'loop_scale': round(f_scale, 3),
      'note': ('XLA cost analysis counts each while-loop body once; xla_per_device scales it by '
               'the loop trip counts of the step (loop_scale, from the jaxpr). '
               'program_matmul_per_step: the matmul FLOPs of the traced step, all devices. '
               'xla/analytic > 1 from remat (recomputed forward), full (not causal-halved) '
               'attention matmuls and, for MoE with grad_accum > 1, the forward that gathers the '
               'global load-balancing statistics; xla/program > 1 means devices repeat work '
               '(replicated computation).'),
  })
  t_compute = xla_flops / per_device['peak_bf16_flops']
  t_memory = xla_bytes / per_device['hbm_bandwidth']
  step = max(t_compute, t_memory)
  out['roofline'] = {
      'step_seconds': step,
      'compute_seconds': t_compute,
      'memory_seconds': t_memory,
      'bound': 'compute' if t_compute >= t_memory else 'memory',
      'mfu': round(analytic / n_dev / (step * per_device['peak_bf16_flops']), 4) if step else None,
      'tokens_per_second': tokens / step if step else None,
      # The same with the traced step's matmul FLOPs (spread evenly) instead of XLA's: differs
      # where XLA's count is not the real work, e.g. MoE grouped matmuls (Mosaic kernels, costed
      # by their own tile-padded estimates).
      'mfu_traced_flops': round(analytic / n_dev / (max(
          cost['flops'] / n_dev / per_device['peak_bf16_flops'], t_memory) *
          per_device['peak_bf16_flops']), 4) if cost['flops'] else None,
      'xla_bytes_accessed_per_device': xla_bytes,
      'xla_bytes_accessed_raw_per_device': raw_bytes,
      'bytes_loop_scale': round(b_scale, 3),
      'note': 'max(FLOPs/peak, bytes/HBM bandwidth) per device; ignores ICI communication and '
              'MXU efficiency, so the MFU is an upper bound. Bytes: XLA\'s bytes accessed, '
              'scaled by bytes_loop_scale, the loop trip-count factor measured on the compiled '
              'HLO (XLA counts each loop body once).',
  }
  out['collectives'] = dict(count_collectives(hlo),
                           result_bytes_per_device_per_step=hlo_cost['collective_bytes'])
  if fits:
    out['message'] = (f'Fits: {_gib(total)} GiB of {_gib(per_device["hbm_bytes"])} GiB per '
                      f'device; roofline MFU {out["roofline"]["mfu"]:.1%} '
                      f'({out["roofline"]["bound"]}-bound).')
  else:
    arrays = largest_hlo_arrays(hlo, config, n_dev)
    out['memory']['largest_arrays'] = arrays
    out['message'] = (
        f'Does NOT fit: the compiled step needs {_gib(total)} GiB per device, the {gen} device '
        f'has {_gib(per_device["hbm_bytes"])} GiB. Largest arrays: ' + '; '.join(
            f'{a["size"]} {a["shapes"][:100]} x{a["count"]} ({a["likely"] or a["op"][-60:]})'
            for a in arrays[:3]) +
        '. Try a larger slice, more --config.train.grad_accum, or other --config.mesh rules.')
  if keep_hlo:
    out['_hlo'] = hlo
  return out
