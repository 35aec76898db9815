"""--mode=quantization: a checkpoint's held-out loss under simulated W8A8 / W4A8 / W4A16 / W8A16
quantization against the float model, and its linear inputs' outliers (inference/quantized.py).

  python main.py --mode=quantization --workdir=runs/g1
  python main.py --mode=quantization --workdir=runs/g1 --config.quantization.group_size=32 \\
      --config.quantization.settings=w8a16,w4a16,w16a8,w8a8,w4a8 --step=600

The run's saved config with the evaluation overrides (runs/rundir.py evaluation_config), as
--mode=analyze; the held-out batches are the analysis's (data.val_batches of train.batch_size
sequences, or quantization.num_batches / batch_size). Writes RUN/quantization/ (report.json,
quantization.md), or --out=DIR for a run that is read-only.
"""

import json
import time

import jax

from gated_attention import input_pipeline
from gated_attention import storage
from gated_attention.errors import ConfigError
from gated_attention.inference import quantized
from gated_attention.model import quantization
from gated_attention.runs import rundir

def run(workdir: str, *, overrides: dict | None = None, out_dir: str | None = None,
        step: int | None = None) -> dict:
  """Evaluates checkpoint `step` (default the latest) of the run in `workdir`; writes `out_dir`
  (default RUN/quantization) and returns the report."""
  t0 = time.time()
  cfg = rundir.eval_config(workdir, overrides)
  opts = cfg.quantization
  settings = quantized.parse(opts.settings, opts.activations, int(opts.group_size))
  if opts.num_batches:
    cfg.data.val_batches = int(opts.num_batches)
  if opts.batch_size:
    cfg.train.batch_size = int(opts.batch_size)
  cfg.train.grad_accum = 1
  if cfg.data.val_batches < 1:
    raise ConfigError('The quantized evaluation needs held-out batches: set '
                      '--config.quantization.num_batches (or data.val_batches) to at least 1.')
  rundir.check_tokenizer(workdir, cfg, 'the quantized evaluation (held-out text)')
  out_dir = out_dir or rundir.quantization_dir(workdir)
  if jax.process_index() == 0:
    storage.check_writable(out_dir, 'the quantized evaluation',
                           'Pass --out=DIR to write it elsewhere (the run is only read).')
  run_ = rundir.load_run(workdir, step, config=cfg)
  moe = run_.factory.model_cfg.moe is not None
  if any(s['weight_bits'] == 4 for s in settings):
    quantization.check_group(run_.params, int(opts.group_size), moe=moe)
  data = input_pipeline.build_data(
      cfg.data, global_batch_size=cfg.train.batch_size, seed=cfg.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  batches = data.val_batches()
  print(f'{cfg.get("variant", "")} step {run_.step}: {len(batches)} held-out batches of '
        f'{cfg.train.batch_size} x {cfg.data.seq_len} tokens, float then '
        f'{len(settings)} quantized setting(s)', flush=True)
  report = {'workdir': storage.abspath(workdir), 'variant': cfg.get('variant', ''),
            'step': run_.step, 'seq_len': int(cfg.data.seq_len),
            'batch_size': int(cfg.train.batch_size), 'batches': len(batches),
            'group_size': int(opts.group_size)}
  report.update(quantized.evaluate(run_.factory, run_.params, batches, settings))
  report['kept_float'] = ['embedding', 'LM head', 'norms', 'MoE router', 'gate bias (input-'
                          'independent gates)', 'the attention scores and softmax']
  report['definitions'] = {
      'increase': 'quantized minus float mean token cross-entropy (nats) on the same batches',
      'absmax': 'max |x| of a linear\'s input over the batches (float model)',
      'kurtosis': 'E[(x - mean)^4] / var^2 over every element of a linear\'s input, pooled '
                  'over the batches (3 for a Gaussian)'}
  report['seconds'] = round(time.time() - t0, 1)
  table = quantized.table(report)
  if jax.process_index() == 0:
    storage.makedirs(out_dir)
    storage.write(storage.join(out_dir, rundir.REPORT_FILE),
                  json.dumps(report, indent=1, allow_nan=True))
    storage.write(storage.join(out_dir, 'quantization.md'), table)
  print(table + f'({report["seconds"]:.0f}s) -> {out_dir}', flush=True)
  return report


def main(args):
  run(args.workdir, overrides=args.overrides, out_dir=args.out or None, step=args.step)
