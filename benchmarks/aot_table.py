"""Smallest v5p slice on which the paper's models train, by ahead-of-time compilation.

  python -m benchmarks.aot_table                 # all rows; writes docs/tpu_aot.md
  python -m benchmarks.aot_table --scales=dense_1p7b_28l --variants=baseline

For the paper's three architectures (baseline and G1 elementwise) at sequence length 4096 and
the paper's global batch of 1024 sequences, walk up the v5p slices (4, 8, ... chips; full FSDP
over all chips: config.mesh data=1, fsdp=-1, rules=fsdp) and, on each, up the gradient
accumulation (1, 2, 4, ... until one sequence per chip per micro-batch) until the compiled
training step fits in HBM (`main.py --mode=compile`, gated_attention/compile/aot.py). Needs libtpu
(pip install -r requirements-tpu.txt), no TPU.

The long-context stage (--stage=long_context) writes its own section of docs/tpu_aot.md (from
LC_MARKER to the end; the pre-training run keeps it, and it keeps the rest):
  * the paper's 32k continued training (Sec. 4.4: RoPE base 1e6, sequence 32768, the same 1024
    sequences a step): smallest slice and grad_accum, walked as above;
  * --mode=long_context's evaluation at 64k and 128k with YaRN (factor 4 over the 32k training
    length): `main.py --mode=compile --plan=long_context`, the scoring step through the KV cache
    (gated_attention/compile/aot_long_context.py), at long_context.batch_size 8, 4, 2, 1 on each slice until
    one fits.

  python -m benchmarks.aot_table --stage=long_context --scales=dense_1p7b_28l --variants=baseline

Compiles that do not fit fail fast (seconds: the TPU compiler checks HBM early); a compile that
fits takes minutes on 2 CPU cores. Each compile runs in its own process (bounded by --timeout);
results are cached in benchmarks/aot_table.json, so an interrupted run resumes. The cache is
keyed by the code compiled (the git trees of gated_attention/ and configs/): an entry of other
code is never served (it is compiled again and replaced) but stays in the file until then, so
the tables of an earlier run keep their raw reports. The grad_accum walk is
gated_attention/training/fit.py's, the one `--fit_grad_accum` runs.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, 'benchmarks', 'aot_table.json')
DOC = os.path.join(ROOT, 'docs', 'tpu_aot.md')
SLICES = ('2x2x1', '2x2x2', '2x2x4', '2x4x4', '4x4x4', '4x4x8', '4x8x8')  # v5p: 4 ... 256 chips
SCALES = ('dense_1p7b_28l', 'dense_1p7b_48l', 'moe_15a2b')
VARIANTS = ('baseline', 'g1_elementwise')
BATCH, SEQ = 1024, 4096
HBM_V5P = 95 * 2**30
KEEP_MARKER = '<!-- Written by hand from here to the search log; benchmarks/aot_table.py keeps it. -->'
SEARCH_LOG = '## Search log'
LC_MARKER = ('<!-- benchmarks/aot_table.py --stage=long_context writes from here to the end; '
             'the pre-training run keeps it. -->')
LC_KEEP_MARKER = '<!-- Long-context notes, written by hand: kept by --stage=long_context. -->'
# The paper's context extension (PAPER.md "Long context"; configs/extend_context.py): RoPE base
# 1e6, continued training at 32k (the pre-training batch of 1024 sequences), YaRN beyond.
EXTEND_SEQ = 32768
EXTEND_FLAGS = ('--config.model.rope_base=1e6',)
EVAL_LENGTHS = (65536, 131072)
EVAL_BATCHES = (8, 4, 2, 1)            # long_context.batch_size (default 8), halved until it fits
# The MoE's evaluation with the default grouped matmul (megablox on TPU) does not compile on a
# slice: "Mosaic kernels cannot be automatically partitioned" (the evaluation's jit has no mesh
# context, so nothing wraps the Pallas kernel in a shard_map). Its rows use ragged_dot.
EVAL_EXTRA = {'moe_15a2b': ('--config.model.moe.grouped_matmul=ragged_dot',)}
YARN_FLAGS = ('--config.model.rope_scaling.type=yarn', '--config.model.rope_scaling.factor=4',
              f'--config.model.rope_scaling.original_max_len={EXTEND_SEQ}')


def chips(shape: str) -> int:
  n = 1
  for d in shape.split('x'):
    n *= int(d)
  return n


def key(variant, scale, topology, ga, extra=()):
  return '|'.join([variant, scale, topology, str(ga), *extra])


def compile_one(variant, scale, topology, ga, extra, timeout, seq=SEQ, flags=None):
  """One `main.py --mode=compile` in its own process: the train step at `seq` and grad_accum
  `ga`, or with `flags` given, those flags instead of the batch flags (the long-context plan)."""
  batch_flags = (f'--config.train.batch_size={BATCH}', f'--config.data.seq_len={seq}',
                 f'--config.train.grad_accum={ga}')
  cmd = [sys.executable, os.path.join(ROOT, 'main.py'),
         f'--config={os.path.join(ROOT, "configs", variant + ".py")}:{scale}',
         '--mode=compile', f'--topology={topology}', *(batch_flags if flags is None else flags),
         *extra]
  t = time.time()
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
  except subprocess.TimeoutExpired:
    return {'error': f'compile timed out after {timeout} s', 'wall_seconds': time.time() - t}
  if p.returncode:   # the exception's line, not JAX's note on filtered frames after it
    lines = [line for line in (p.stderr or p.stdout).strip().splitlines()
             if line.strip() and not line.startswith('For simplicity, JAX has removed')
             and set(line.strip()) != {'-'}]
    return {'error': (lines or ['?'])[-1][:500], 'wall_seconds': round(time.time() - t, 1)}
  r = json.loads(p.stdout[p.stdout.index('{'):])
  r['wall_seconds'] = round(time.time() - t, 1)
  r['code'] = code_version()
  return r


def _git(*a) -> str:
  return subprocess.run(['git', *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()


def _dirty() -> bool:
  return bool(_git('status', '--porcelain', '--untracked-files=no', '--', 'gated_attention',
                   'configs'))


def code_version() -> str:
  """Commit of the code compiled, '+dirty' when gated_attention/ or configs/ had changes."""
  return _git('rev-parse', '--short', 'HEAD') + ('+dirty' if _dirty() else '')


def code_tree() -> str:
  """What the cache is keyed by: the git trees of gated_attention/ and configs/ (a commit
  that changes neither, e.g. of docs, keeps the cache), '+dirty' with uncommitted changes."""
  trees = [_git('rev-parse', '--short', f'HEAD:{d}') for d in ('gated_attention', 'configs')]
  return '.'.join(trees) + ('+dirty' if _dirty() else '')


def estimate_state_bytes(scale, n_chips):
  """f32 params + AdamW m, v + f32 gradients, evenly sharded: a lower bound to skip slices."""
  from gated_attention.config import scales  # pylint: disable=g-import-not-at-top
  from gated_attention.model import transformer as model  # pylint: disable=g-import-not-at-top
  from gated_attention.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  model_cfg = ModelConfig.from_config(scales.get_config(scale).model)
  return model.param_report(model_cfg)['total'] * 16 / n_chips


NOT_COMPUTED = 'not computed (not asked for in this run, nor in the cache)'
LC_SEARCH_LOG = '### Search log (long context)'


def cached(cache, k, args, log, compile_fn):
  """The cached report of key `k` if it was compiled from this code, else compiled now (and
  saved at once, so an interrupted run resumes); with args.cache_only, not compiled: an error
  NOT_COMPUTED, which ends the walk."""
  if k not in cache or cache[k].get('code_tree') != args.code_tree:
    if getattr(args, 'cache_only', False):
      return {'fits': None, 'error': NOT_COMPUTED}
    log(f'compiling {k} ...')
    cache[k] = dict(compile_fn(), code_tree=args.code_tree)
    with open(CACHE, 'w') as f:
      json.dump(cache, f, indent=1)
  r = cache[k]
  args.used.add(k)
  log(f'  {k}: ' + (r.get('message') or r.get('error', ''))[:200] +
      f' [{r.get("wall_seconds")} s]')
  return r


def search(variant, scale, slices, cache, args, log, seq=SEQ, extra=None):
  """(report, attempts): the first of `slices` (and smallest grad_accum on it, walked by
  training/fit.py as --fit_grad_accum does) that fits, at sequence length `seq`."""
  from gated_attention.training import fit  # pylint: disable=g-import-not-at-top
  extra = args.extra if extra is None else extra
  attempts = []
  for shape in slices:
    n, topology = chips(shape), f'v5p:{shape}'
    if BATCH % n:
      continue
    if estimate_state_bytes(scale, n) > HBM_V5P:
      attempts.append({'topology': topology, 'skipped': 'parameters + AdamW state alone '
                       'exceed HBM'})
      continue

    def attempt(ga, topology=topology):
      k = key(variant, scale, topology, ga, extra if seq == SEQ else (f'seq={seq}', *extra))
      r = cached(cache, k, args, log, lambda: compile_one(
          variant, scale, topology, ga, extra, args.timeout, seq=seq))
      attempts.append(dict(topology=topology, grad_accum=ga, fits=r.get('fits'),
                           error=r.get('error'), wall_seconds=r.get('wall_seconds'),
                           compile_seconds=r.get('compile_seconds')))
      return r
    # Stops at the first that fits, or at an error (a timed-out compile: a bigger grad_accum
    # would be slower still): then the next slice.
    found, _ = fit.walk(fit.candidates(BATCH, n, 1), attempt, BATCH / n, log=lambda _: None)
    if found is not None or attempts[-1].get('error') == NOT_COMPUTED:
      return found and found.result, attempts
  return None, attempts


def search_eval(variant, scale, length, slices, cache, args, log):
  """(report, RULER's report, attempts): --mode=long_context's scoring step at `length` with
  YaRN: the first of `slices`, and on it the largest of EVAL_BATCHES, whose compiled step fits;
  then, on that slice, the largest batch at which RULER's generation fits too (its prefill
  logits added), or the report at batch 1 if none."""
  from gated_attention.training import fit  # pylint: disable=g-import-not-at-top
  attempts = []
  for shape in slices:
    topology = f'v5p:{shape}'

    def attempt(batch, topology=topology):
      flags = ('--plan=long_context', f'--config.data.seq_len={EXTEND_SEQ}',
               f'--config.long_context.lengths={length}',
               f'--config.long_context.batch_size={batch}', *EXTEND_FLAGS, *YARN_FLAGS,
               *EVAL_EXTRA.get(scale, ()))
      k = key(variant, scale, topology, f'eval{length}x{batch}',
              (*EVAL_EXTRA.get(scale, ()), *args.extra))
      r = cached(cache, k, args, log, lambda: compile_one(
          variant, scale, topology, None, args.extra, args.timeout, flags=flags))
      attempts.append(dict(topology=topology, grad_accum=f'eval batch {batch}',
                           fits=r.get('fits'), error=r.get('error'),
                           wall_seconds=r.get('wall_seconds'),
                           compile_seconds=r.get('compile_seconds')))
      return r
    found, _ = fit.walk(list(EVAL_BATCHES), attempt, 1, log=lambda _: None)
    if found is None and attempts[-1].get('error'):   # not computed, or no memory verdict:
      return None, None, attempts                      # a bigger slice would not change it
    if found is not None:
      def ruler_attempt(batch, attempt=attempt):
        r = attempt(batch)    # the same compile: RULER adds its prefill logits to its memory
        return dict(r, fits=r.get('ruler_fits') if r.get('fits') else r.get('fits'))
      ruler, tried = fit.walk([b for b in EVAL_BATCHES if b <= found.grad_accum], ruler_attempt,
                              1, log=lambda _: None)
      if ruler is None and tried[-1].result.get('error') != NOT_COMPUTED:
        ruler = tried[-1]     # none fits: the smallest batch's total
      return found.result, ruler and ruler.result, attempts
  return None, None, attempts


def fmt_row(variant, scale, r, last):
  if r is None:
    return f'| {scale} | {variant} | does not fit up to v5p:{last} | | | | | | | |'
  m, b, rf, fl = r['memory'], r['batch'], r['roofline'], r['flops']
  mesh = 'x'.join(f'{k}={v}' for k, v in r['mesh'].items() if v > 1)
  mfu2 = rf.get('mfu_traced_flops')
  mfu2 = f' [{mfu2:.1%}]' if mfu2 and abs(mfu2 - rf['mfu']) > 0.01 else ''
  return (f'| {scale} | {variant} | {r["topology"]} ({r["devices"]} chips) | {mesh} | '
          f'{b["grad_accum"]} ({b["per_device_micro_batch"]:g} seq/chip) | '
          f'{m["total_bytes"] / 2**30:.1f} GiB ({m["hbm_fraction"]:.0%}) | '
          f'{rf["mfu"]:.1%} ({rf["bound"]}){mfu2} | {rf["step_seconds"]:.2f} s | '
          f'{fl["xla_over_analytic"]:.2f} | {r["compile_seconds"]["compile"]:.0f} s |')


TIME_COLUMNS = (('compute: XLA ops', 'XLA ops'),
                ('compute: splash_attention kernel', 'splash'),
                ('compute: megablox kernel', 'megablox'),
                ('memory: matmuls (XLA fusions)', 'matmul fusions'),
                ('memory: splash_attention kernel', 'splash'),
                ('memory: megablox kernel', 'megablox'),
                ('memory: elementwise / reductions / other', 'elementwise, other'),
                ('memory: copies / transposes', 'copies'),
                ('memory: collectives', 'collectives (HBM side)'))


def fmt_time_row(variant, scale, r):
  """Seconds per step by category: compute (FLOPs / peak) and HBM traffic (bytes / bandwidth)."""
  if r is None:
    return f'| {scale} | {variant} |' + ' |' * (len(TIME_COLUMNS) + 3)
  rf = r['roofline']
  t = rf.get('seconds_by_category', {})
  cells = ' | '.join(f'{t[k]:.2f}' if k in t else '-' for k, _ in TIME_COLUMNS)
  own = sum(v for k, v in t.items() if k.startswith('memory'))
  coll = r['collectives']['result_bytes_per_device_per_step'] / 1e9
  return (f'| {scale} | {variant} | {r["topology"]} | {rf["compute_seconds"]:.2f} | '
          f'{rf["memory_seconds"]:.2f} | {own:.2f} | {cells} | {coll:.0f} GB |')


DOC_HEAD = """# Ahead-of-time compilation for TPU pods

`main.py --mode=compile --topology=<name>` lowers and compiles the real training step (forward,
backward, AdamW, gradient accumulation, with the shardings of `config.mesh.rules`) for a TPU
slice, on a machine without TPUs, and prints one JSON report (gated_attention/compile/aot.py):
per-device memory against HBM, XLA's FLOPs against the analytic count, a roofline step time and
MFU, the collectives in the program, and the compile time. When the step does not fit, the TPU
compiler usually refuses it and the report names the largest buffers of its memory report; a step
that compiles but exceeds HBM is flagged too, with the program's largest arrays.

    pip install -r requirements-tpu.txt          # libtpu: the TPU compiler, no TPU needed
    python main.py --config=configs/g1_elementwise.py:moe_15a2b --mode=compile --topology=v5p:4x4x4 \\
        --config.train.grad_accum=16
    python main.py --config=configs/baseline.py:dense_1p7b_28l --mode=compile --topology=v5p:2x2x2 \\
        --config.mesh.fsdp=4 --config.mesh.data=2    # any mesh; one axis may be -1
    python main.py --config=configs/baseline.py:dense_1p7b_28l --mode=compile --topology=v5p:2x2x1 \\
        --config.data.seq_len=32768 --fit_grad_accum  # the smallest grad_accum that fits, walked up
    python main.py --config=configs/baseline.py:dense_1p7b_28l --mode=compile --topology=v5p:2x2x1 \\
        --plan=long_context --config.long_context.lengths=131072 --config.long_context.batch_size=2

`--fit_grad_accum` compiles the step at the config's grad_accum x 1, 2, 4, ... (while every chip
keeps at least one sequence per micro-batch; most steps that do not fit are refused in seconds) and
prints one line per attempt, then the report of the first that fits; if none does, one paragraph
names the largest tried and what else to change (a bigger slice, `remat=full`). `--mode=memory
--fit_grad_accum` walks the same grad_accums against its estimate and
`config.memory.device_memory_gib`. `--plan=long_context` compiles `--mode=long_context`'s scoring
step (config.long_context: the largest length, batch_size, chunk) instead of the train step;
`--mode=memory --plan=long_context` estimates it.

Topology names are libtpu's: `v5p:2x2x1` (4 chips) ... `v5p:8x8x8`, `v5e:4x4` (`v5litepod:` is
accepted), `v6e:2x2`, `v4:2x2x2`. Chip figures (`gated_attention/chips.py`, sources in the comments):

| chip | peak bf16 | HBM | HBM bandwidth |
|---|---|---|---|
{chips}

How to read the numbers:
- **Memory** is XLA's `compiled.memory_analysis()` for one device: arguments (this device's shard
  of params and AdamW state, and of the batch) + outputs - donated (aliased) + temporaries +
  generated code. The compiler's own HBM limit for v5p is 95.74 GiB.
- **FLOPs**: XLA's `cost_analysis()` counts a while loop's body once; the layers are a scan and
  grad accumulation is a scan, so the report scales it by the trip counts measured on the step's
  jaxpr (`flops.loop_scale`).
- **Pallas kernels** (`gated_attention/compile/kernel_cost.py`): XLA's cost analysis counts nothing for a
  Pallas kernel without a cost estimate, neither FLOPs nor bytes. Splash attention gives none,
  so the report adds its FLOPs, 2 x block_q x block_kv x head_dim per matmul per tile that the
  causal mask leaves to compute (diagonal tiles whole; 36 of 64 tiles at T=4096 with 512-token
  tiles), per query head: forward 2 matmuls, fused backward 5 (dq, dk, dv in one kernel; 3 + 4
  in the unfused pair); and its bytes, every operand and output once plus the K/V (forward) or
  Q/dO (backward) tiles it re-reads per computed tile. Megablox (the MoE's grouped matmuls)
  does give an estimate, which XLA uses: its bytes (the weight tile re-read per row tile, the
  rows per output tile) stand; its FLOPs (2 m k n) miss the row tiles that straddle a group
  boundary, which the kernel computes once per group, so the report charges every visited tile
  (an upper bound, +12% with 512-row tiles and 128 experts). Tests check the counts against the
  reference attention's matmuls and the kernel's own mask processing, and on a TPU compile.
- **XLA / analytic FLOPs** compares the counted FLOPs (XLA's + the kernels') with
  `model.train_flops_per_token` (6 x active parameters + causal attention, the function training
  logs TFLOP/s with): above 1 from remat (one more forward of every matmul), splash's diagonal
  tiles and its backward's recomputation (QK^T again), the MoE's repeated row tiles, and, for the
  MoE with grad_accum > 1, the extra forward that gathers the global load-balancing statistics.
- **Roofline**: step time = max(FLOPs / peak, bytes accessed / HBM bandwidth) per device; MFU =
  analytic FLOPs / (step time x peak). It ignores inter-chip communication (FSDP gathers the
  weights for every micro-batch, twice with remat; on these slices XLA compiles the gathers as
  all-reduces) and MXU efficiency: an upper bound. Bytes accessed are XLA's, scaled by the loop
  trip counts read from the compiled HLO, plus the kernels' bytes XLA does not count. In
  brackets where it differs by more than a point: the MFU with the traced step's matmul FLOPs
  (and the kernels') in place of XLA's (`roofline.mfu_traced_flops`).
- **Where the time goes** (`roofline.seconds_by_category`): compute seconds of XLA's ops and of
  each kernel (they sum to the roofline's compute time), and HBM seconds by kind of instruction
  from this module's own count of the HLO's bytes (`hlo_cost.py`: operands and results of each
  instruction, fusions as one, loops at their trip counts). XLA's cost analysis gives no split,
  and its total, which the roofline uses, differs from the own count: 10-18% below it for the
  dense steps, 12-41% above it for the MoE (the cause is not pinned down). The split shows
  where the traffic is, not its exact size. Collectives are
  counted as HBM traffic only; their bytes per chip and step are in the last column (ICI time
  is not modelled).
"""


def write_doc(tables, attempts_by_row, cache, args):
  os.makedirs(os.path.dirname(DOC), exist_ok=True)
  from gated_attention import chips as chip_table  # pylint: disable=g-import-not-at-top
  chips_tbl = '\n'.join(f'| {k} | {v["peak_bf16_flops"] / 1e12:.0f} TFLOP/s | '
                        f'{v["hbm_bytes"] / 2**30:.0f} GiB | {v["hbm_bandwidth"] / 1e9:.0f} GB/s |'
                        for k, v in chip_table.CHIPS.items() if k in chip_table.TPU_CHIPS)
  out = [DOC_HEAD.replace('{chips}', chips_tbl)]
  codes = sorted({cache[k].get('code', '?') for k in args.used})
  for i, (title, rows, time_rows) in enumerate(tables):
    out.append(f'## {title} (sequence {SEQ}, global batch {BATCH})\n')
    if i == 0:
      out.append(
          f'Produced by `python -m benchmarks.aot_table --also={",".join(args.also)}` (code: '
          f'{", ".join(codes)}; libtpu 0.0.42.1; raw reports: `benchmarks/aot_table.json`). '
          'Full FSDP over all chips (data=1, fsdp=-1, rules=fsdp, the config default for these '
          'scales), remat=save_attention, bf16 compute, splash attention (512-token tiles, fused '
          'backward), chunked cross-entropy (512 tokens), megablox for the MoE; the smallest '
          'slice, then the smallest grad accumulation, whose compiled step fits.'
          + (f' Extra flags: `{" ".join(args.extra)}`.' if args.extra else '') + '\n')
    out.append('| model | variant | slice | mesh | grad_accum (micro-batch) | '
               'memory / chip | roofline MFU | roofline step | XLA / analytic FLOPs | compile |')
    out.append('|---|---|---|---|---|---|---|---|---|---|')
    out += rows
    out.append('')
    out.append('Where the step\'s time goes, seconds per chip: compute (FLOPs / peak), HBM '
               '(bytes / bandwidth: XLA\'s count, which the roofline uses, then this '
               'module\'s own count split by category), and collective bytes per chip:\n')
    out.append('| model | variant | slice | compute | HBM (XLA) | HBM (own count) | ' + ' | '.join(
        ('compute: ' if k.startswith('compute') else 'HBM: ') + name
        for k, name in TIME_COLUMNS) + ' | collectives |')
    out.append('|---' * (len(TIME_COLUMNS) + 7) + '|')
    out += time_rows
    out.append('')
  kept, long_context = '', ''
  if os.path.exists(DOC):  # the hand-written findings (marker .. search log) survive a rerun
    with open(DOC) as f:
      old = f.read()
    if LC_MARKER in old:     # and the long-context stage's section
      old, long_context = old[:old.index(LC_MARKER)], old[old.index(LC_MARKER):]
    if KEEP_MARKER in old:
      kept = old[old.index(KEEP_MARKER):]
      kept = kept[:kept.index(SEARCH_LOG)] if SEARCH_LOG in kept else kept
  out.append((kept or KEEP_MARKER + '\n').rstrip() + '\n')
  out.append('\n' + SEARCH_LOG + '\n')
  out.append('Every compile tried (a "no" fails in seconds; a "yes" is a full compile). '
             'Compile times: a 2-core CPU machine shared with other jobs (load 3-7), so they vary 2-3x.\n')
  out.append('| model | variant | topology | grad_accum | fits | compile (s) | wall (s) |')
  out.append('|---|---|---|---|---|---|---|')
  for (variant, scale), attempts in attempts_by_row.items():
    for a in attempts:
      if 'skipped' in a:
        out.append(f'| {scale} | {variant} | {a["topology"]} | - | no: {a["skipped"]} | | |')
        continue
      fits = 'yes' if a['fits'] else ('no' if a['fits'] is False else f'error: {a["error"]}')
      cs = (a.get('compile_seconds') or {}).get('compile', '')
      out.append(f'| {scale} | {variant} | {a["topology"]} | {a["grad_accum"]} | {fits} | '
                 f'{cs} | {a["wall_seconds"]} |')
  if long_context:
    out.append('\n' + long_context.rstrip())
  with open(DOC, 'w') as f:
    f.write('\n'.join(out).rstrip() + '\n')


def fmt_eval_row(variant, scale, length, r, ruler, attempts, last):
  """A row of the long-context evaluation table."""
  if r is None:
    if attempts and attempts[-1].get('error') == NOT_COMPUTED:
      return f'| {scale} | {variant} | {length} | not computed | | | | | | |'
    if attempts and attempts[-1].get('error'):
      return (f'| {scale} | {variant} | {length} | error on {attempts[-1]["topology"]}: '
              f'{attempts[-1]["error"][:120]} | | | | | |')
    return (f'| {scale} | {variant} | {length} | does not fit at batch 1 up to v5p:{last} | '
            '| | | | | |')
  m, e = r['memory'], r['evaluation']
  if ruler is None:
    cell = 'not computed'
  elif ruler.get('ruler_fits'):
    cell = f'batch {ruler["evaluation"]["batch"]}: {ruler["ruler_total_bytes"] / 2**30:.1f} GiB'
  elif 'ruler_total_bytes' in ruler:   # the scoring step compiled; with the logits, too big
    cell = (f'does NOT fit: {ruler["ruler_total_bytes"] / 2**30:.1f} GiB at batch '
            f'{ruler["evaluation"]["batch"]}')
  else:
    cell = f'does NOT fit ({ruler.get("message", ruler.get("error", ""))[:60]})'
  return (f'| {scale} | {variant} | {length} | {r["topology"]} ({r["devices"]} chips) | '
          f'{e["batch"]} | {m["total_bytes"] / 2**30:.1f} GiB ({m["hbm_fraction"]:.0%}) | '
          f'{r["kv_cache_bytes_per_device"] / 2**30:.1f} GiB | '
          f'{r["params_bytes_per_device"] / 2**30:.1f} GiB | {cell} | '
          f'{r["compile_seconds"]["compile"]:.0f} s |')


def write_lc_doc(train_rows, eval_rows, attempts, args):
  """The long-context section of docs/tpu_aot.md: from LC_MARKER to the end (the hand-written
  notes after LC_KEEP_MARKER kept), the rest of the doc untouched."""
  with open(DOC) as f:
    doc = f.read()
  head, old = (doc[:doc.index(LC_MARKER)], doc[doc.index(LC_MARKER):]) if LC_MARKER in doc else (
      doc, '')
  kept = LC_KEEP_MARKER + '\n'
  if LC_KEEP_MARKER in old:
    kept = old[old.index(LC_KEEP_MARKER):]
    kept = kept[:kept.index(LC_SEARCH_LOG)] if LC_SEARCH_LOG in kept else kept
  codes = sorted({args.cache[k].get('code', '?') for k in args.used})
  trees = sorted({args.cache[k].get('code_tree', '?') for k in args.used})
  out = [LC_MARKER, '',
         '## Long context: the 32k continued training and the 64k / 128k evaluation', '',
         f'Produced by `python -m benchmarks.aot_table --stage=long_context` (code: the trees '
         f'{", ".join(trees) or "-"} of gated_attention/ and configs/, at commits '
         f'{", ".join(codes) or "-"}; libtpu 0.0.42.1; raw reports: `benchmarks/aot_table.json`), '
         'one compile at a time on 2 shared CPU cores. The paper\'s recipe (PAPER.md, "Long '
         'context"; `configs/extend_context.py` makes it from a run): RoPE base raised to 1e6, '
         f'continued training at {EXTEND_SEQ} tokens (the pre-training batch of {BATCH} '
         'sequences a step), then evaluation beyond 32k with YaRN. A compile needs no run '
         'directory, so the rows compile `configs/<variant>.py:<scale>` with '
         f'`--config.data.seq_len={EXTEND_SEQ} {" ".join(EXTEND_FLAGS)}` (the same step '
         'extend_context.py gives: the RoPE base changes no shape).', '',
         f'### 32k continued training (sequence {EXTEND_SEQ}, global batch {BATCH}, RoPE base '
         '1e6)', '',
         'Smallest v5p slice, then smallest grad accumulation, whose compiled step fits '
         '(`--mode=compile --fit_grad_accum` walks the same grad_accums on one slice). Full FSDP '
         'over all chips as above.', '',
         '| model | variant | slice | mesh | grad_accum (micro-batch) | memory / chip | roofline '
         'MFU | roofline step | XLA / analytic FLOPs | compile |',
         '|---|---|---|---|---|---|---|---|---|---|', *train_rows, '',
         f'### --mode=long_context at {" and ".join(str(n) for n in EVAL_LENGTHS)} tokens with '
         'YaRN', '',
         '`--mode=compile --plan=long_context` compiles the evaluation\'s scoring step (loss by '
         'position and retrieval: one chunk of 256 tokens of every sequence of the batch through '
         'the KV cache of the largest length + 64, `Generator.token_nll` / `token_scores`) with '
         'the evaluation\'s shardings: parameters per config.mesh (full FSDP), the cache and the '
         'tokens replicated, as the evaluation makes them. Flags: '
         f'`--config.data.seq_len={EXTEND_SEQ} {" ".join(EXTEND_FLAGS + YARN_FLAGS)} '
         '--config.long_context.lengths=L --config.long_context.batch_size=B`; for the MoE also '
         f'`{" ".join(EVAL_EXTRA["moe_15a2b"])}` (with megablox, the default on TPU, the '
         'evaluation does not compile on a slice: see the notes below). The batch starts '
         f'at the evaluation\'s default 8 and halves ({", ".join(map(str, EVAL_BATCHES))}) until '
         'the step fits; then the next slice. "RULER generation": the RULER tasks generate, and '
         '`generate._prefill` keeps the float32 logits of every prompt chunk and concatenates '
         'them ([batch, length, vocab], twice while concatenating); the column gives the largest '
         'batch on that slice whose compiled step plus those logits (analytic; not compiled) '
         'fits, or the total at batch 1 when none does.', '',
         '| model | variant | length | slice | batch | memory / chip (scoring step) | KV cache '
         '(per chip, held twice) | parameters / chip | RULER generation | compile |',
         '|---|---|---|---|---|---|---|---|---|---|', *eval_rows, '',
         kept.rstrip(), '', LC_SEARCH_LOG, '',
         'Every compile tried for this section ("no" fails in seconds; "yes" is a full compile).',
         '', '| model | variant | stage | topology | grad_accum / eval batch | fits | compile (s) '
         '| wall (s) |', '|---|---|---|---|---|---|---|---|']
  for (variant, scale, stage), tried in attempts.items():
    for a in tried:
      if a.get('error') == NOT_COMPUTED:
        continue
      if 'skipped' in a:
        out.append(f'| {scale} | {variant} | {stage} | {a["topology"]} | - | no: '
                   f'{a["skipped"]} | | |')
        continue
      fits = 'yes' if a['fits'] else ('no' if a['fits'] is False else f'error: {a["error"]}')
      cs = (a.get('compile_seconds') or {}).get('compile', '')
      out.append(f'| {scale} | {variant} | {stage} | {a["topology"]} | {a["grad_accum"]} | '
                 f'{fits} | {cs} | {a["wall_seconds"]} |')
  with open(DOC, 'w') as f:
    f.write(head.rstrip() + '\n\n' + '\n'.join(out).rstrip() + '\n')


def long_context_stage(args, cache, log):
  """The 32k continued-training table and the 64k / 128k evaluation table; the scales and
  variants not asked for are filled from the cache where it has them ("not computed" else)."""
  train_rows, eval_rows, attempts = [], [], {}
  extra = (*EXTEND_FLAGS, *args.extra)
  for scale in SCALES:
    for variant in VARIANTS:
      args.cache_only = not (scale in args.scales.split(',') and
                             variant in args.variants.split(','))
      slices = args.train_slices.get(scale, args.slices)
      r, tried = search(variant, scale, slices, cache, args, log, seq=EXTEND_SEQ, extra=extra)
      attempts[(variant, scale, f'train {EXTEND_SEQ}')] = tried
      row = fmt_row(variant, scale, r, slices[-1])
      if r is None and tried and tried[-1].get('error') == NOT_COMPUTED:
        row = f'| {scale} | {variant} | not computed | | | | | | | |'
      train_rows.append(row)
      log(row)
  for scale in SCALES:
    for variant in VARIANTS:
      for length in EVAL_LENGTHS:
        args.cache_only = not (scale in args.scales.split(',') and
                               variant in args.variants.split(',') and
                               str(length) in args.lengths.split(','))
        r, ruler, tried = search_eval(variant, scale, length, args.slices, cache, args, log)
        attempts.setdefault((variant, scale, f'eval {length}'), []).extend(
            a for a in tried if a not in attempts.get((variant, scale, f'eval {length}'), []))
        eval_rows.append(fmt_eval_row(variant, scale, length, r, ruler, tried,
                                      args.slices[-1]))
        log(eval_rows[-1])
  args.cache_only = False
  if not args.no_doc:
    write_lc_doc(train_rows, eval_rows, attempts, args)
    log(f'wrote {DOC}')


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--scales', default=','.join(SCALES))
  p.add_argument('--variants', default=','.join(VARIANTS))
  p.add_argument('--slices', default=','.join(SLICES), help='v5p chip grids, smallest first')
  p.add_argument('--timeout', type=int, default=1800, help='seconds per compile')
  p.add_argument('--extra', default='', help='more main.py flags, space separated')
  p.add_argument('--also', default='',
                 help='v5p chip grids for extra tables (smallest grad_accum that fits there)')
  p.add_argument('--no-doc', action='store_true')
  p.add_argument('--stage', choices=('pretrain', 'long_context'), default='pretrain',
                 help='pretrain: the 4k tables; long_context: the 32k continued training and '
                 'the 64k / 128k evaluation (its own section of the doc)')
  p.add_argument('--lengths', default=','.join(map(str, EVAL_LENGTHS)),
                 help='--stage=long_context: the evaluation lengths to compile')
  p.add_argument('--train-slices', default='',
                 help='--stage=long_context: SCALE=GRID:GRID...,... the 32k training\'s slices '
                 'for a scale (default --slices), e.g. moe_15a2b=2x2x2:2x2x4 to skip a slice the '
                 '4k table already shows too small')
  args = p.parse_args()
  args.train_slices = {k: v.split(':') for k, v in (
      item.split('=') for item in args.train_slices.split(',') if item)}
  args.slices = args.slices.split(',')
  args.extra = tuple(args.extra.split())
  args.also = [a for a in args.also.split(',') if a]
  cache = {}
  args.code_tree = code_tree()
  args.used = set()
  if os.path.exists(CACHE):
    with open(CACHE) as f:
      cache = json.load(f)
  args.cache = cache
  stale = [k for k, r in cache.items() if r.get('code_tree') != args.code_tree]
  if stale:
    print(f'{len(stale)} cached compiles are of other code (now {args.code_tree}): not served, '
          'compiled again where asked for')

  def log(msg):
    print(time.strftime('%H:%M:%S'), msg, flush=True)

  if args.stage == 'long_context':
    long_context_stage(args, cache, log)
    return

  tables, attempts_by_row = [], {}
  for title, slices in [('Smallest v5p slice per model', args.slices)] + [
      (f'On v5p:{a} ({chips(a)} chips)', [a]) for a in args.also]:
    rows, time_rows = [], []
    for scale in args.scales.split(','):
      for variant in args.variants.split(','):
        r, attempts = search(variant, scale, slices, cache, args, log)
        rows.append(fmt_row(variant, scale, r, slices[-1]))
        time_rows.append(fmt_time_row(variant, scale, r))
        attempts_by_row.setdefault((variant, scale), []).extend(
            a for a in attempts if a not in attempts_by_row.get((variant, scale), []))
        log(rows[-1])
    tables.append((title, rows, time_rows))
  if not args.no_doc:
    write_doc(tables, attempts_by_row, cache, args)
    log(f'wrote {DOC}')


if __name__ == '__main__':
  main()
