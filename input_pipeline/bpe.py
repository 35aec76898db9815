"""A byte-level BPE tokenizer trained offline on the training split of a data source.

  python -m input_pipeline.bpe --vocab_size=16384 --out=runs/bpe16k/tokenizer.json
  python main.py ... --config.data.tokenizer=runs/bpe16k/tokenizer.json

No network: it reads the documents of `data.source` (default: the built-in corpus) with the same
train/validation split as training (held-out documents are never seen), and writes a Hugging
Face `tokenizer.json` (`tokenizers`' ByteLevel BPE, `<|endoftext|>` as the BOS every document
starts with) that `config.data.tokenizer` takes.
"""

import argparse
import os
import time

import numpy as np

from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.sources import load_documents, split_documents

BOS = '<|endoftext|>'


def train_bpe(data_cfg, vocab_size: int, out_path: str, *, max_bytes: int = 0,
              seed: int = 0) -> dict:
  """Trains on the training documents of `data_cfg` (a random subset of at most `max_bytes`
  bytes when > 0); writes `out_path`; returns a summary."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  if vocab_size < 257:
    raise DataError(f'vocab_size={vocab_size} must be at least 257 (the 256 bytes and BOS).')
  t0 = time.time()
  docs = load_documents(data_cfg)
  train_ids, _ = split_documents(len(docs), data_cfg.val_fraction)
  order = np.random.default_rng(seed).permutation(train_ids)
  texts, total = [], 0
  for i in order:
    texts.append(docs[int(i)])
    total += len(texts[-1].encode('utf-8', 'replace'))
    if max_bytes and total >= max_bytes:
      break
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[BOS], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tok.save(out_path)
  return {'out': os.path.abspath(out_path), 'vocab_size': tok.get_vocab_size(),
          'documents': len(texts), 'megabytes': round(total / 1e6, 2),
          'seconds': round(time.time() - t0, 1)}


def main():
  from gated_attention.config import scales  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--vocab_size', type=int, default=16384)
  p.add_argument('--out', required=True, help='the tokenizer.json to write')
  p.add_argument('--source', default='builtin', help='data.source (builtin, text, jsonl, ...)')
  p.add_argument('--path', default='', help='data.path for file sources')
  p.add_argument('--max_megabytes', type=float, default=0.0, help='0: every training document')
  a = p.parse_args()
  data_cfg = scales.data_config()
  data_cfg.update(source=a.source, path=a.path)
  print(train_bpe(data_cfg, a.vocab_size, a.out, max_bytes=int(a.max_megabytes * 1e6)))


if __name__ == '__main__':
  main()
