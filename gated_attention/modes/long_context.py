"""--mode=long_context: how a run holds up beyond its training length (inference/long_context.py).

  python main.py --mode=long_context --workdir=runs/g1_1k
  python main.py --mode=long_context --workdir=runs/g1_1k --config.long_context.lengths=256,4096 \\
      --config.model.rope_scaling.type=yarn --config.model.rope_scaling.factor=4 \\
      --config.model.rope_scaling.original_max_len=1024        # evaluated with YaRN, no training

  python main.py --mode=long_context --workdir=runs/g1_1k --config.long_context.window=256 \
      --config.long_context.sinks=4     # streamed through a sliding-window cache (StreamingLLM)

Writes RUN/long_context/<tag>/ (report.json, long_context.md, loss_by_position.png, ruler.png).
With long_context.window, every sequence (the loss's documents, RULER's prompts) is streamed
token by token through a sliding-window KV cache of `sinks` + `window` slots (model/kv_cache.py,
StreamingLLM's perplexity evaluation), and the tag gains _window<W>_sinks<S>.
A synthetic run is scored on its task's generated validation documents, and a task with answer
positions (mqar) by its retrieval accuracy instead of the RULER text tasks.
"""

import json
import math
import time

from gated_attention import input_pipeline
from gated_attention import storage
from gated_attention.inference import generate, long_context
from gated_attention.model import kv_cache
from gated_attention.runs import rundir
from gated_attention.input_pipeline import ruler


def run(workdir: str, *, overrides: dict | None = None, step: int | None = None) -> dict:
  """Evaluates the run's checkpoint `step` (--step, default the latest) with the saved config
  and the evaluation overrides; writes RUN/long_context/<tag>/ and returns the report."""
  t0 = time.time()
  overrides = dict(overrides or {})
  cfg = rundir.eval_config(workdir, overrides, generation=True)
  opts = cfg.long_context
  lengths = long_context.evaluated_lengths(opts, cfg.data.seq_len)
  window = kv_cache.Window.from_settings(
      int(opts.window), int(opts.sinks),
      names=('--config.long_context.window', '--config.long_context.sinks'))
  rundir.check_tokenizer(workdir, cfg, '--mode=long_context')
  run_ = rundir.load_run(workdir, step, config=cfg)
  data = input_pipeline.build_data(cfg.data, global_batch_size=1, seed=cfg.seed)
  gen = generate.Generator(run_.model, max_len=long_context.cache_length(lengths), chunk=opts.chunk,
                           window=window)
  if window is not None:
    print(f'Streaming every sequence token by token through a sliding-window cache: the first '
          f'{gen.window.sinks} tokens and the last {gen.window.window} ({gen.cache_len} slots, '
          'RoPE positions by place in the cache).', flush=True)
  task = getattr(data, 'task', None)  # a synthetic task: generated documents, its own retrieval
  docs = (long_context.synthetic_documents(task, max(lengths) + 1, opts.docs) if task else
          long_context.long_documents(data, max(lengths) + 1, opts.docs))
  report = {'workdir': storage.abspath(workdir), 'variant': cfg.get('variant', ''),
            'step': run_.step, 'train_seq_len': int(cfg.data.seq_len),
            'rope_tag': long_context.rope_tag(run_.model_cfg),
            'rope_base': run_.model_cfg.rope_base,
            'rope_scaling': dict(cfg.model.rope_scaling), 'lengths': lengths}
  if window is not None:
    report['cache'] = long_context.cache_report(gen)
  report['loss'] = long_context.loss_by_position(gen, docs, lengths, opts.batch_size)
  print(f'loss by position over {report["loss"]["documents"]} held-out documents: ' +
        ', '.join(f'{b["from"]}-{b["to"]} {b["loss"]:.3f}' for b in report['loss']['buckets']),
        flush=True)
  if task is not None:  # the RULER tasks are text; a task with answers (mqar) scores its own
    report['ruler'] = {}
    if task.has_answers and opts.examples:
      report['retrieval'] = long_context.retrieval_accuracy(gen, task, lengths, opts.examples,
                                                            opts.batch_size)
      report['ruler'] = {task.spec.name: {n: None if r is None else r['accuracy']
                                          for n, r in report['retrieval']['lengths'].items()}}
  else:
    tasks = ruler.parse_tasks(opts.tasks) if opts.tasks else ()
    report['ruler'] = long_context.ruler_accuracy(
        gen, data, tasks, lengths, opts.examples, opts.seed,
        opts.batch_size) if tasks and opts.examples else {}
  report['examples_per_cell'] = int(opts.examples)
  report['seconds'] = round(time.time() - t0, 1)
  out_dir = rundir.long_context_dir(
      workdir, opts.tag or report['rope_tag'] + long_context.window_tag(gen.window))
  storage.makedirs(out_dir)
  storage.write(storage.join(out_dir, rundir.REPORT_FILE),
                json.dumps(report, indent=1, allow_nan=False))
  table = long_context.table(report)
  storage.write(storage.join(out_dir, 'long_context.md'), table)
  long_context.figures(report, out_dir)
  print(table + f'({report["seconds"]:.0f}s) -> {out_dir}', flush=True)
  if not all(math.isfinite(b['loss']) for b in report['loss']['buckets']):
    print('Warning: a loss is not finite.')
  return report


def main(args):
  run(args.workdir, overrides=args.overrides, step=args.step)
