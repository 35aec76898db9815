"""Tokenizers: UTF-8 bytes, a Hugging Face tokenizer.json, a sentencepiece .model.

`make_tokenizer(spec)` picks one from `data.tokenizer`:
  'byte'                 UTF-8 bytes 0..255, BOS = 256, vocab_size 257 (no files needed;
                         ByteTokenizer.save_hf writes it as an equivalent tokenizer.json)
  '.../tokenizer.json'   Hugging Face `tokenizers` (e.g. Qwen's); needs `pip install tokenizers`
  '.../name.model'       sentencepiece; needs `pip install sentencepiece`
"""

import json
import os

import numpy as np

from gated_attention import storage
from gated_attention.input_pipeline.errors import DataError

_FIX = ("set --config.data.tokenizer=byte, or to a path to a Hugging Face "
        "tokenizer.json or a sentencepiece .model file")
# Tried in order when a tokenizer.json names no BOS token (`<|endoftext|>` last: Qwen has no BOS).
_HF_BOS_CANDIDATES = ('<|begin_of_text|>', '<bos>', '<s>', '<|startoftext|>', '[BOS]',
                      '<|endoftext|>')


class Tokenizer:
  """Base class. Subclasses set `name`, `vocab_size`, `bos_id` and define encode/decode."""

  name: str
  vocab_size: int
  bos_id: int

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without BOS."""
    raise NotImplementedError

  def decode(self, ids) -> str:
    """Text of `ids`; BOS tokens are dropped."""
    raise NotImplementedError

  def encode_array(self, text: str) -> np.ndarray:
    """`encode` as an int32 array [num_tokens]; subclasses may vectorise it."""
    return np.asarray(self.encode(text), np.int32)

  def encode_doc(self, text: str) -> np.ndarray:
    """One packed document: int32 [1 + num_tokens], BOS first."""
    return np.concatenate([np.array([self.bos_id], np.int32), self.encode_array(text)])

  def __repr__(self):
    return f'{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id})'


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes are ids 0..255; BOS is 256."""

  name, vocab_size, bos_id = 'byte', 257, 256

  def encode_array(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32)

  def encode(self, text: str) -> list[int]:
    return list(text.encode('utf-8'))

  def decode(self, ids) -> str:
    ids_n = np.asarray(ids, np.int64).reshape(-1)
    return ids_n[(ids_n >= 0) & (ids_n < 256)].astype(np.uint8).tobytes().decode('utf-8', 'replace')

  BOS_TOKEN = '<bos>'

  def save_hf(self, directory: str) -> list[str]:
    """Writes this tokenizer as Hugging Face files into `directory` (tokenizer.json,
    tokenizer_config.json, special_tokens_map.json): a byte-level BPE without merges whose
    vocabulary maps each byte's ByteLevel character to the byte's value, and `<bos>` = 256 as
    the BOS special token, so `tokenizers` / `transformers` encode every text to exactly the ids
    of `encode` (and HFTokenizer reads it back with the same BOS). Returns the file names."""
    import tokenizers  # pylint: disable=g-import-not-at-top
    vocab = {char: byte for byte, char in _byte_level_chars().items()}
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                            use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(self.BOS_TOKEN, special=True)])
    assert tok.token_to_id(self.BOS_TOKEN) == self.bos_id, tok.token_to_id(self.BOS_TOKEN)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, 'tokenizer.json'))
    config = {'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': self.BOS_TOKEN,
              'eos_token': self.BOS_TOKEN, 'add_bos_token': False, 'clean_up_tokenization_spaces':
              False, 'model_max_length': 1 << 30}
    for name, obj in (('tokenizer_config.json', config),
                      ('special_tokens_map.json', {'bos_token': self.BOS_TOKEN,
                                                   'eos_token': self.BOS_TOKEN})):
      with open(os.path.join(directory, name), 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')
    return ['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json']


def _byte_level_chars() -> dict[int, str]:
  """The printable character that byte-level BPE (GPT-2's ByteLevel) stands each byte for:
  printable Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards in byte
  order."""
  keep = [*range(ord('!'), ord('~') + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
  moved = [b for b in range(256) if b not in keep]
  return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


class _FileTokenizer(Tokenizer):
  """A tokenizer loaded from `path`; pickles as its path (for grain worker processes)."""

  def __getstate__(self):
    return {'path': self.path}

  def __setstate__(self, state):
    self.__init__(state['path'])


class HFTokenizer(_FileTokenizer):
  """A Hugging Face `tokenizers` tokenizer.json; special tokens are never added by `encode`."""

  def __init__(self, path: str):
    import tokenizers  # pylint: disable=g-import-not-at-top
    self.path, self.name = path, f'hf:{os.path.basename(path)}'
    try:
      self._tok = (tokenizers.Tokenizer.from_str(storage.read_text(path))
                   if storage.is_remote(path) else tokenizers.Tokenizer.from_file(path))
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f'data.tokenizer={path!r} is not a valid tokenizer.json ({e}); {_FIX}.') from e
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.bos_token, self.bos_id = _hf_bos(self._tok, path)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) != self.bos_id]
    return self._tok.decode(ids, skip_special_tokens=False)


def _hf_bos(tok, path: str) -> tuple[str, int]:
  """The BOS token: tokenizer_config.json's `bos_token` if given, else a known one."""
  names = list(_HF_BOS_CANDIDATES)
  config_path = storage.join(storage.dirname(path), 'tokenizer_config.json')
  if storage.isfile(config_path):
    try:
      bos = json.loads(storage.read_bytes(config_path))
    except ValueError as e:
      raise DataError(f'{config_path} (beside data.tokenizer={path!r}) is not valid JSON ({e}); '
                      'fix or remove it (it only names the BOS token).') from e
    bos = bos.get('bos_token') if isinstance(bos, dict) else None
    bos = bos.get('content') if isinstance(bos, dict) else bos
    if bos:
      names.insert(0, bos)
  for name in names:
    token_id = tok.token_to_id(name)
    if token_id is not None:
      return name, token_id
  raise DataError(
      f'data.tokenizer={path!r} has no BOS token: none of {", ".join(names)} is in its vocabulary '
      '(documents are packed with a BOS token in front). Add one as a special token, or name it '
      'as "bos_token" in a tokenizer_config.json next to the tokenizer.json.')


class SentencePieceTokenizer(_FileTokenizer):
  """A sentencepiece model; BOS is its bos_id(), else its eos_id()."""

  def __init__(self, path: str):
    import sentencepiece  # pylint: disable=g-import-not-at-top
    self.path, self.name = path, f'sentencepiece:{os.path.basename(path)}'
    try:
      self._sp = (sentencepiece.SentencePieceProcessor(model_proto=storage.read_bytes(path))
                  if storage.is_remote(path) else
                  sentencepiece.SentencePieceProcessor(model_file=path))
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f'data.tokenizer={path!r} is not a valid sentencepiece model ({e}); {_FIX}.') from e
    self.vocab_size = self._sp.get_piece_size()
    self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else self._sp.eos_id()
    if self.bos_id < 0:
      raise DataError(f'data.tokenizer={path!r} has neither a BOS nor an EOS id (both -1); retrain '
                      'it with --bos_id or --eos_id set (documents are packed with a BOS in front).')

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in np.asarray(ids).reshape(-1) if int(i) != self.bos_id])


def make_tokenizer(spec: str) -> Tokenizer:
  """The tokenizer named by `data.tokenizer` ('byte', a *.json or a *.model path)."""
  if spec == 'byte':
    return ByteTokenizer()
  if not spec:
    raise DataError(f'data.tokenizer is empty; {_FIX} (Qwen\'s tokenizer.json for the paper scales).')
  if not spec.endswith(('.json', '.model')):
    raise DataError(f'Unknown data.tokenizer={spec!r}; {_FIX}.')
  path = spec if storage.is_remote(spec) else os.path.expanduser(spec)
  if not storage.isfile(path):
    raise DataError(f'data.tokenizer={spec!r}: the file does not exist; {_FIX}.')
  return HFTokenizer(path) if path.endswith('.json') else SentencePieceTokenizer(path)
