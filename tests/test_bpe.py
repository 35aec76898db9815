"""input_pipeline/bpe.py (a BPE trained offline on a source's training split) and the
builtin_large source it is meant for."""

from gated_attention.config import scales
from gated_attention.input_pipeline import bpe, make_tokenizer
from gated_attention.input_pipeline.sources import load_documents, split_documents


def test_bpe_trains_on_the_training_split_and_round_trips(tmp_path):
  cfg = scales.data_config()
  out = tmp_path / 'tok' / 'tokenizer.json'
  info = bpe.train_bpe(cfg, 400, str(out), max_bytes=300_000)
  assert info['vocab_size'] == 400 and 0 < info['megabytes'] < 1.0
  tok = make_tokenizer(str(out))
  assert tok.vocab_size == 400 and tok.bos_id == 0          # <|endoftext|>, the first special
  text = 'def gated(x):\n    return x * sigmoid(x @ w)  # ünïcode\n'
  ids = tok.encode(text)
  assert len(ids) < len(text.encode()) and tok.decode(ids) == text
  assert tok.bos_id not in ids


def test_builtin_large_is_the_stdlib_and_the_installed_packages():
  cfg = scales.data_config()
  small = load_documents(cfg)
  cfg.source = 'builtin_large'
  large = load_documents(cfg)
  assert len(large) > len(small) and large.sizes.sum() > 2 * small.sizes.sum()
  assert large.paths[:len(small.paths)] == small.paths       # the stdlib first, same order
  train, val = split_documents(len(large), cfg.val_fraction)
  assert len(val) > 0 and len(train) + len(val) == len(large)
