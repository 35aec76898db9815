"""Input pipeline: text documents -> tokenized, packed, shuffled numpy batches (grain).

  data = build_data(cfg.data, global_batch_size=cfg.train.batch_size, seed=cfg.seed,
                    process_index=jax.process_index(), process_count=jax.process_count())
  batch = next(data.train_iter)   # inputs/targets int32, loss_mask float32: [B/P, seq_len]
  state = data.train_iter.get_state()  # JSON-serialisable; .set_state(state) resumes exactly
  data.val_batches()              # data.val_batches held-out batches, the same on every call
  data.describe()                 # sizes, token counts, unigram entropy (nats/token)
  data_tokenizer(cfg.data)        # the tokenizer alone (a synthetic task's, or data.tokenizer's)
"""

from gated_attention.input_pipeline.errors import DataError
from gated_attention.input_pipeline.pipeline import Data, build_data, data_tokenizer
from gated_attention.input_pipeline.tokenizer import Tokenizer, make_tokenizer

__all__ = ['Data', 'DataError', 'Tokenizer', 'build_data', 'data_tokenizer', 'make_tokenizer']
