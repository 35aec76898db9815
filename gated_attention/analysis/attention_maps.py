"""Attention maps of one text, and printable token labels, for the notebook and the analysis.

  am = attention_map(run.model, run.tokenizer, 'The cat sat on the mat.')
  am['maps'][layer]        # [n, n] head-averaged attention (row = query, column = key)
"""

import functools

import jax
import numpy as np
from flax import nnx

from gated_attention.model import transformer


@functools.partial(jax.jit, static_argnames='graphdef')
def _inspect(params, tokens_BxT, *, graphdef):
  """model.inspect's statistics, compiled once per model structure (graphdefs hash by value)."""
  return transformer.inspect(nnx.merge(graphdef, params), tokens_BxT)[1]


def token_labels(tokenizer, ids) -> list[str]:
  """A short printable label per token id (BOS shown as <bos>)."""
  labels = []
  for i in ids:
    i = int(i)
    if i == tokenizer.bos_id:
      labels.append('<bos>')
      continue
    text = tokenizer.decode([i]).replace(' ', '\u2423')          # a visible space
    labels.append(repr(text)[1:-1] or '?')
  return labels


def attention_map(model, tokenizer, text: str, *, max_tokens: int = 128,
                  add_bos: bool = True) -> dict:
  """Head-averaged attention maps of every layer for `text` ([BOS] + its tokens).

  Returns {'ids': [n], 'tokens': [n] labels, 'maps': [L, n, n] float (row = query, column = key),
  'f_attn': [L] (this text's F-Attn per layer), 'f_attn_per_head': [L, H]}. The model records
  maps of the first ATTN_MAP_LEN (128) positions, so the text is cut to `max_tokens` <= 128.
  """
  ids = list(tokenizer.encode(text))
  if add_bos:
    ids = [tokenizer.bos_id] + ids
  ids = ids[:min(max_tokens, 128)]
  if len(ids) < 2:
    raise ValueError('attention_map needs at least 2 tokens (BOS and one more); type some text.')
  graphdef, state = nnx.split(model)
  params = nnx.to_pure_dict(state)
  tokens = np.asarray([ids], np.int32)
  aux = jax.device_get(_inspect(params, tokens, graphdef=graphdef))
  f_attn_LxH = np.asarray(aux['f_attn_H'], np.float64)
  return {'ids': ids, 'tokens': token_labels(tokenizer, ids),
          'maps': np.asarray(aux['attn_map'], np.float64),
          'f_attn': f_attn_LxH.mean(axis=-1), 'f_attn_per_head': f_attn_LxH}
