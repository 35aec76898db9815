"""A fake "released" checkpoint at the real 1.7B shapes, and the time and memory of importing and
exporting it (gated_attention/runs/hf). No torch, no network: random bf16 weights, written in the
authors' gated-Qwen3 layout (config.json + sharded safetensors), as their 1B_gate_headwise.

  python -m benchmarks.fake_release make --out=/tmp/fake_1b_gate_headwise
  python -m benchmarks.fake_release make --scale=tiny --out=/tmp/fake_tiny   # tiny's shapes (tests)
  python -m benchmarks.fake_release measure --src=/tmp/fake_1b_gate_headwise --out=/tmp/exported
  # the run-directory path (docs/huggingface.md, "Import the authors' models"):
  /usr/bin/time -v python main.py --mode=import --hf=/tmp/fake_1b_gate_headwise --workdir=/tmp/r
  /usr/bin/time -v python main.py --mode=analyze --workdir=/tmp/r --config.data.seq_len=4096 \
      --config.train.batch_size=1 --config.data.val_batches=1

`measure` runs each step in a fresh process and prints one JSON object per step: wall seconds
and the process's peak resident memory (ru_maxrss). Write under /tmp, never into the repo.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import ml_dtypes
import numpy as np


from gated_attention.runs.hf import hf_config, layout, safetensors_io

# The paper's 1.7B-28L dense model (appendix table) in the authors' Hugging Face config.
CONFIG = dict(architectures=['Qwen3ForCausalLM'], model_type='qwen3', vocab_size=151_936,
              hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
              num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act='silu',
              max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
              rope_scaling=None, tie_word_embeddings=True, attention_bias=False, qkv_bias=False,
              use_qk_norm=True, use_sliding_window=False, torch_dtype='bfloat16',
              bos_token_id=151643, eos_token_id=151643)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def release_config(scale: str = 'dense_1p7b_28l') -> dict:
  """The authors' config.json (CONFIG) with the architecture of `scale`'s dense model
  (gated_attention/config/scales.py): the 1.7B release's own for dense_1p7b_28l."""
  from gated_attention.config import scales  # pylint: disable=g-import-not-at-top
  m = scales.model_config(scale)
  if m.moe.num_experts:
    raise ValueError(f'{scale} is a MoE; a release is a dense Qwen3.')
  return dict(CONFIG, vocab_size=m.vocab_size, hidden_size=m.hidden_size,
              intermediate_size=m.ffn_size, num_hidden_layers=m.num_layers,
              num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
              head_dim=m.head_dim, tie_word_embeddings=m.tie_embeddings)


def make(out: str, gate: str, max_shard_bytes: int, scale: str = 'dense_1p7b_28l'):
  """Writes `out`: config.json and bf16 safetensors shards (+ index) of random weights, at the
  architecture of `scale`, with a BPE tokenizer.json that fits its vocabulary."""
  cfg = dict(release_config(scale), headwise_attn_output_gate=gate == 'headwise',
             elementwise_attn_output_gate=gate == 'elementwise')
  dims = hf_config.dims_from_hf(cfg)
  os.makedirs(out, exist_ok=False)
  rng = np.random.default_rng(0)
  bf16 = np.dtype(ml_dtypes.bfloat16)

  def random(shape):
    if len(shape) == 1:
      return (1.0 + 0.1 * rng.standard_normal(shape, np.float32)).astype(bf16)
    return (rng.standard_normal(shape, np.float32) * 0.02).astype(bf16)

  entries = layout.entries(dims)
  shards = safetensors_io.plan_shards([(e.name, int(np.prod(e.shape)) * 2) for e in entries],
                                      max_shard_bytes)
  shape = {e.name: e.shape for e in entries}
  weight_map, total = {}, 0
  for i, names in enumerate(shards):
    fname = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
    total += safetensors_io.write_file(
        os.path.join(out, fname), [(n, shape[n], bf16, lambda n=n: random(shape[n]))
                                   for n in names], {'format': 'pt'})
    weight_map.update({n: fname for n in names})
  with open(os.path.join(out, safetensors_io.INDEX_FILE), 'w') as f:
    json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2)
  with open(os.path.join(out, 'config.json'), 'w') as f:
    json.dump(cfg, f, indent=2)
  # A tokenizer.json, so that an import of it can be analysed: a byte-level BPE trained offline
  # on 5 MB of the built-in corpus (Qwen's is not on this machine; the vocabulary only needs to
  # fit in the model's).
  from gated_attention.config import scales  # pylint: disable=g-import-not-at-top
  from gated_attention.input_pipeline import bpe  # pylint: disable=g-import-not-at-top
  vocab = min(8192, cfg['vocab_size'] - 1)   # BOS is one more
  bpe.train_bpe(scales.data_config(), vocab, os.path.join(out, 'tokenizer.json'),
                max_bytes=5 * 10**6 if vocab == 8192 else 2 * 10**5)
  print(json.dumps({'step': 'make', 'out': out, 'files': len(shards), 'bytes': total}))


def _step(step: str, src: str, out: str, dtype: str):
  """One measured step in this process: load, or load + save."""
  from gated_attention.runs.hf import load_hf, save_hf  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  config, params = load_hf(src)
  t_load = time.perf_counter() - t0
  n = sum(x.size for x in _leaves(params))
  result = {'step': step, 'params': int(n), 'load_s': round(t_load, 1)}
  if step == 'save':
    t0 = time.perf_counter()
    info = save_hf(config, params, out, dtype=dtype)
    result.update(save_s=round(time.perf_counter() - t0, 1), dtype=dtype, files=info['files'],
                  bytes=sum(os.path.getsize(os.path.join(out, f)) for f in info['files']))
  result['peak_rss_gib'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
  print(json.dumps(result))


def _leaves(tree):
  for v in tree.values():
    yield from (_leaves(v) if isinstance(v, dict) else [v])


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('cmd', choices=('make', 'measure', 'load', 'save'))
  ap.add_argument('--out', default='/tmp/fake_1b_gate_headwise')
  ap.add_argument('--src', default='/tmp/fake_1b_gate_headwise')
  ap.add_argument('--gate', default='headwise', choices=('none', 'headwise', 'elementwise'))
  ap.add_argument('--dtype', default='bfloat16', choices=('float32', 'bfloat16'))
  ap.add_argument('--max_shard_bytes', type=int, default=2 * 10**9)
  ap.add_argument('--scale', default='dense_1p7b_28l',
                  help='the architecture: a dense scale of gated_attention/config/scales.py')
  args = ap.parse_args()
  if os.path.abspath(args.out).startswith(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))):
    sys.exit('--out must be outside the repository (e.g. under /tmp).')
  if args.cmd == 'make':
    make(args.out, args.gate, args.max_shard_bytes, args.scale)
  elif args.cmd in ('load', 'save'):
    _step(args.cmd, args.src, args.out, args.dtype)
  else:                                    # each step in a fresh process: its own peak RSS
    for step in ('load', 'save'):
      subprocess.run([sys.executable, '-m', 'benchmarks.fake_release', step, f'--src={args.src}',
                      f'--out={args.out}', f'--dtype={args.dtype}'], check=True, cwd=ROOT)


if __name__ == '__main__':
  main()
