"""--mode=tokenize --out=DIR: the config's data source tokenized once into sharded ArrayRecord
files of token ids (input_pipeline/tokenized.py), local or gs://; train from them with
--config.data.source=tokenized --config.data.path=DIR.

  python main.py --mode=tokenize --config=configs/g1_elementwise.py:dense_1p7b_28l \\
      --config.data.source=jsonl --config.data.path='gs://b/corpus/*.jsonl' \\
      --config.data.tokenizer=gs://b/qwen3/tokenizer.json --out=gs://b/tokens/corpus

Deterministic and resumable: run the same command again after a kill and it writes only the
shards that are missing, with the same bytes.
"""

import json
import sys

from gated_attention.input_pipeline import tokenized


def main(args):
  if not args.out:
    sys.exit('--mode=tokenize needs --out=DIR, the folder (local or gs://) for the shards.')
  manifest = tokenized.tokenize(args.config.data, args.out, progress=sys.stderr.isatty())
  shards = manifest['shards']
  print(json.dumps({'out': args.out, 'documents': manifest['num_documents'],
                    'tokens': manifest['num_tokens'], 'tokenizer': manifest['tokenizer'],
                    'shards': {split: len(s) for split, s in shards.items()}}, indent=1))
  print(f'Train from it with --config.data.source=tokenized --config.data.path={args.out} '
        f'--config.data.tokenizer={args.config.data.tokenizer}', flush=True)
