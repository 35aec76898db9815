"""load_hf: a Hugging Face model directory -> (run config, parameters); save_hf: the reverse.

Dtypes: HF weights of any float dtype (bf16, as released, or fp16/fp32) load exactly into the
project's float32 parameters; the compute dtype is `config.model.dtype` (float32 by default,
`compute_dtype='bfloat16'` for speed). Export writes float32 by default, which round-trips
bit for bit; `dtype='bfloat16'` halves the files and rounds to nearest even (as torch's
`.to(torch.bfloat16)`), exact for weights that came from bf16.
"""

import json
import os
import shutil
import tempfile

import numpy as np

from gated_attention import storage
from gated_attention.runs.hf import (hf_config, hybrid_config, hybrid_layout, layout,
                                     safetensors_io)
from gated_attention.runs.hf.errors import HFExportError, HFFormatError

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9        # transformers' save_pretrained default ("5GB")
EXPORT_DTYPES = ('float32', 'bfloat16')
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                   'vocab.json', 'merges.txt', 'added_tokens.json', 'chat_template.jinja')
REMOTE_CODE_FILES = ('modeling_qwen3.py', 'configuration_qwen3.py')


def _read_json(path: str, required: bool) -> dict:
  if not os.path.isfile(path):
    if required:
      raise HFFormatError(f'{path} does not exist: pass a Hugging Face model directory (one '
                          'with config.json and *.safetensors).')
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise HFFormatError(f'{path} is not valid JSON ({e}).') from e


def _read_configs(model_dir: str) -> tuple[dict, dict]:
  """(config.json, generation_config.json or {}) of a HF directory, each checked to be an
  object."""
  hf = _read_json(os.path.join(model_dir, 'config.json'), required=True)
  gen = _read_json(os.path.join(model_dir, 'generation_config.json'), required=False)
  for name, value in (('config.json', hf), ('generation_config.json', gen)):
    if not isinstance(value, dict):
      raise HFFormatError(f'{os.path.join(model_dir, name)} holds a JSON '
                          f'{type(value).__name__}, not an object of settings; is it the right '
                          'file?')
  return hf, gen


def read_hf_config(model_dir: str, *, compute_dtype: str = 'float32'):
  """The run config of a HF directory (validates config.json; reads no weights): Qwen3 and the
  authors' gated Qwen3 (hf_config.py), or a Qwen3-Next / Qwen3.5 hybrid (hybrid_config.py)."""
  hf, gen = _read_configs(model_dir)
  if hybrid_config.is_hybrid(hf):
    return hybrid_config.run_config(hf, model_dir, hybrid_config.dims_from_hf(hf),
                                    compute_dtype=compute_dtype, generation_config=gen)
  return hf_config.run_config(hf, model_dir, compute_dtype=compute_dtype, generation_config=gen)


def _check_tensors(expected: dict, files: dict, ignored):
  """Every expected tensor ({name: shape}) present with its shape, and nothing else but what
  `ignored(name)` accepts, before reading any data."""
  missing = sorted(set(expected) - set(files))
  if missing:
    raise HFFormatError(f'the checkpoint lacks {len(missing)} tensor(s) that config.json implies, '
                        f'e.g. {missing[:3]}; are config.json and the weights from one model?')
  extra = sorted(n for n in set(files) - set(expected) if not ignored(n))
  if extra:
    why = ('biases are not supported' if any(n.endswith('.bias') for n in extra)
           else 'the project has no such parameters')
    raise HFFormatError(f'the checkpoint has {len(extra)} tensor(s) the project cannot '
                        f'represent, e.g. {extra[:3]}: {why}.')
  for name, shape in expected.items():
    if files[name].shape(name) != shape:
      raise HFFormatError(f'tensor {name!r} has shape {list(files[name].shape(name))}; '
                          f'config.json implies {list(shape)}.')


def load_hf(model_dir: str, *, compute_dtype: str = 'float32') -> tuple:
  """(run config, parameters) of a local HF directory: Qwen3 / the authors' gated Qwen3, or a
  Qwen3-Next / Qwen3.5 hybrid (text or multimodal release: the language model alone; what was
  left is named in config.hf.skipped). The parameters are a nested dict of float32 numpy arrays
  laid out as `nnx.to_pure_dict(nnx.state(Transformer))`. Everything is validated before the
  first weight is read."""
  config = read_hf_config(model_dir, compute_dtype=compute_dtype)
  hf = json.loads(config.hf.config_json)
  files = safetensors_io.open_checkpoint(model_dir)
  read = lambda name: files[name].get(name)  # noqa: E731
  if hybrid_config.is_hybrid(hf):
    fused = any(n.endswith('.mlp.experts.gate_up_proj') for n in files)
    dims = hybrid_config.dims_from_hf(hf, fused_experts=fused)
    table = hybrid_layout.entries(dims)
    skipped = hybrid_layout.skipped(files, dims)
    _check_tensors({e.name: e.shape for e in table}, files,
                   lambda n: hybrid_layout.is_skipped(n, dims)
                   or (dims.tied and n == 'lm_head.weight'))
    if skipped:
      config.hf.skipped = ('Not imported (the project models the language model): ' + ', '.join(
          f'{count} tensor(s) of {what}' for what, count in sorted(skipped.items())) + '.')
    return config, hybrid_layout.to_params(table, read)
  dims = hf_config.dims_from_hf(hf)
  table = layout.entries(dims)
  _check_tensors({e.name: e.shape for e in table}, files,
                 lambda n: n.endswith(layout.IGNORED_SUFFIXES)
                 or (dims.tied and n == 'lm_head.weight'))
  return config, layout.to_params(dims, read)


def _check_params(want: dict, params: dict):
  """`params` has exactly the parameters of `want` ({path tuple: shape}), with their shapes."""
  want = {'.'.join(p): tuple(s) for p, s in want.items()}
  have = {}

  def walk(tree, prefix):
    for k, v in tree.items():
      if isinstance(v, dict):
        walk(v, prefix + (str(k),))
      else:
        have['.'.join(prefix + (str(k),))] = tuple(np.shape(v))

  walk(params, ())
  if have != want:
    diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    raise HFExportError(f'the parameters do not match the config at {diff[:4]}: '
                        f'have {[have.get(k) for k in diff[:4]]}, expected '
                        f'{[want.get(k) for k in diff[:4]]}.')


def check_exportable(config):
  """Refuses (HFExportError, naming the config field) what no HF model class computes: a
  hybrid's (hybrid_config.py) or a Qwen3 run's (hf_config.py) rules."""
  if hybrid_config.is_hybrid_run(config):
    hybrid_config.check_exportable(config)
  else:
    hf_config.check_exportable(config)


def _tokenizer_files(config, tokenizer_dir: str | None) -> list[tuple[str, str]]:
  """(source, name) of the tokenizer files to copy: the run's tokenizer.json (a HF tokenizer)
  and the HF tokenizer files beside it, or those in `tokenizer_dir`."""
  if tokenizer_dir is None:
    path = str(config.data.tokenizer)
    if not path.endswith('.json'):
      return []                    # byte (written by save_hf) / sentencepiece / synthetic
    if not storage.isfile(path):   # a run may read its tokenizer from object storage
      raise HFExportError(f'config.data.tokenizer={path!r} does not exist; pass tokenizer_dir= '
                          'the directory of the run\'s tokenizer.json.')
    tokenizer_dir = storage.dirname(storage.abspath(path))
  else:
    path = storage.join(tokenizer_dir, 'tokenizer.json')
    if not storage.isfile(path):
      raise HFExportError(f'tokenizer_dir={tokenizer_dir!r} has no tokenizer.json.')
  others = [(storage.join(tokenizer_dir, f), f) for f in TOKENIZER_FILES[1:]]
  return [(path, 'tokenizer.json')] + [(p, f) for p, f in others if storage.isfile(p)]


def _check_out_dir(out_dir: str):
  if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    raise HFExportError(f'out_dir={out_dir!r} exists and is not an empty directory; export '
                        'into a new directory.')


def check_out_dir(out_dir: str):
  """Refuses an export directory that is not new or empty, or whose folder cannot be written
  (read-only, full, no permission), before any work. A symlink counts as the folder it names."""
  out_dir = os.path.realpath(out_dir)
  _check_out_dir(out_dir)
  try:
    storage.check_writable(os.path.dirname(out_dir), 'the export',
                           'Pass an --out on a writable disk with room for the weights.')
  except storage.StorageError as e:
    raise HFExportError(str(e)) from e


def _write_weights(tmp: str, table: list, tensor, dtype, max_shard_bytes: int):
  """model.safetensors, or model-0000i-of-0000n.safetensors + the index above the limit;
  `table`: the entries to write, in order; `tensor(entry)`: its array."""
  plan = [(e.name, int(np.prod(e.shape)) * dtype.itemsize) for e in table]
  shards = safetensors_io.plan_shards(plan, max_shard_bytes)
  by_name = {e.name: e for e in table}
  names = ([safetensors_io.SINGLE_FILE] if len(shards) == 1 else
           [f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors' for i in range(len(shards))])
  total, weight_map = 0, {}
  for fname, shard in zip(names, shards):
    tensors = [(n, by_name[n].shape, dtype, lambda e=by_name[n]: tensor(e)) for n in shard]
    total += safetensors_io.write_file(os.path.join(tmp, fname), tensors, {'format': 'pt'})
    weight_map.update({n: fname for n in shard})
  if len(shards) > 1:
    with open(os.path.join(tmp, safetensors_io.INDEX_FILE), 'w') as f:
      json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2)
  return names


def _writes_byte_tokenizer(config, tokenizer_dir: str | None) -> bool:
  """A run trained on the byte tokenizer is exported with its tokenizer.json
  (input_pipeline's ByteTokenizer.save_hf: the same ids in `tokenizers` and `transformers`); a
  model whose vocabulary is smaller than the byte tokenizer's cannot have been trained on it."""
  from gated_attention.input_pipeline.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
  return (tokenizer_dir is None and str(config.data.tokenizer) == 'byte'
          and config.model.vocab_size >= ByteTokenizer.vocab_size)


def _bos(config, tokenizer_files: list, byte_tokenizer: bool) -> tuple[str, int] | None:
  """(token, id) of the BOS the run's documents start with, when the export holds the run's
  tokenizer (a HF tokenizer.json or the byte tokenizer's): exported as bos and eos (packed
  documents are separated by BOS alone). An imported run keeps its source's ids where its
  config.json names them (hf_config.PASSTHROUGH); this fills the ones it does not."""
  if not (tokenizer_files or byte_tokenizer):
    return None
  from gated_attention.input_pipeline import make_tokenizer  # pylint: disable=g-import-not-at-top
  tok = make_tokenizer(str(config.data.tokenizer) if not tokenizer_files
                       else tokenizer_files[0][0])
  return getattr(tok, 'bos_token', None) or getattr(tok, 'BOS_TOKEN', None), int(tok.bos_id)


def _tokenizer_config(out_dir: str, bos_token: str) -> dict | None:
  """tokenizer_config.json naming the run's BOS (also as EOS: documents are separated by BOS
  alone), on top of the exported one if there is one; None when the exported one names a BOS
  already. Without it transformers loads a bare tokenizer.json with bos_token None, while the
  project's sampling starts from this BOS."""
  cfg = {}
  path = os.path.join(out_dir, 'tokenizer_config.json')
  if os.path.isfile(path):
    try:
      with open(path) as f:
        cfg = json.load(f)
    except ValueError:
      cfg = {}
  cfg = cfg if isinstance(cfg, dict) else {}
  if cfg.get('bos_token'):
    return None
  cfg.setdefault('tokenizer_class', 'PreTrainedTokenizerFast')
  cfg.update(bos_token=bos_token, eos_token=cfg.get('eos_token') or bos_token)
  cfg.setdefault('add_bos_token', False)
  return cfg


def _put_bos_first(out_dir: str, bos_token: str, bos_id: int):
  """Makes the tokenizer in `out_dir` put BOS before every text by itself, as every document
  this project trains on starts with it (the model's attention sink position): tokenizer.json
  gains a post-processor (after its own, if any) that `tokenizers` and `transformers` apply by
  default (add_special_tokens=True), so `AutoTokenizer(text)`, `pipeline('text-generation')`
  and lm-evaluation-harness (its `add_bos_token` unset) feed the model what it saw in training;
  tokenizer_config.json says add_bos_token. A tokenizer that puts BOS first already is kept.
  Encoding without special tokens (the project's HFTokenizer) gives the same ids as before."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  path = os.path.join(out_dir, 'tokenizer.json')
  tok = tokenizers.Tokenizer.from_file(path)
  puts_bos_first = lambda: tok.encode('a').ids == [bos_id] + tok.encode(
      'a', add_special_tokens=False).ids          # ('a' may be unknown: its id may be BOS's)
  if not puts_bos_first():
    first = tokenizers.processors.TemplateProcessing(
        single=[bos_token, '$A'], pair=[bos_token, '$A', bos_token, '$B'],
        special_tokens=[(bos_token, bos_id)])
    own = tok.post_processor
    tok.post_processor = first if own is None else tokenizers.processors.Sequence([own, first])
    if not puts_bos_first():
      raise HFExportError(f'the exported tokenizer.json does not put BOS ({bos_token!r}, id '
                          f'{bos_id}) first even with a post-processor that adds it.')
    tok.save(path)
  config_path = os.path.join(out_dir, 'tokenizer_config.json')
  if os.path.isfile(config_path):
    with open(config_path) as f:
      cfg = json.load(f)
    if isinstance(cfg, dict):
      _write_json(config_path, dict(cfg, add_bos_token=True))


def _write_json(path: str, obj: dict):
  with open(path, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write('\n')


def save_hf(config, params: dict, out_dir: str, *, dtype: str = 'float32',
            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, tokenizer_dir: str | None = None,
            remote_code_dir: str | None = None, bos_first: bool | None = None) -> dict:
  """Writes `out_dir` as a HF model directory: safetensors, config.json,
  generation_config.json, the tokenizer files (a HF tokenizer.json run, or `tokenizer_dir`)
  and, for G1, the authors' modeling_qwen3.py / configuration_qwen3.py from `remote_code_dir`
  if given. `bos_first`: the exported tokenizer puts the run's BOS before every text by itself
  (_put_bos_first), for parameters trained here, on documents that start with BOS; default: a
  run trained here (no `config.hf`), not an import, whose tokenizer behaves as its source's. Everything is validated before anything is written; the directory appears whole
  (written beside it, then renamed). Returns {'format', 'files'}."""
  check_exportable(config)
  if dtype not in EXPORT_DTYPES:
    raise HFExportError(f'dtype={dtype!r} is not one of {", ".join(EXPORT_DTYPES)}.')
  hybrid = hybrid_config.is_hybrid_run(config)
  if hybrid:
    dims = hybrid_config.dims_from_run(config, params)
    table = hybrid_layout.entries(dims)
    _check_params(hybrid_layout.param_shapes(table), params)
    tensor = lambda e: hybrid_layout.from_params(params, e)  # noqa: E731
  else:
    dims = hf_config.dims_from_run(config, params)
    table = layout.entries(dims)
    _check_params(layout.param_shapes(dims), params)
    tensor = lambda e: layout.from_params(dims, params, e)  # noqa: E731
  tokenizer = _tokenizer_files(config, tokenizer_dir)
  code = []
  if remote_code_dir is not None and not hybrid and dims.gate != 'none':
    code = [(os.path.join(remote_code_dir, f), f) for f in REMOTE_CODE_FILES]
    missing = [p for p, _ in code if not os.path.isfile(p)]
    if missing:
      raise HFExportError(f'remote_code_dir={remote_code_dir!r} lacks {missing}.')
  out_dir = os.path.realpath(out_dir)   # a symlink to a folder: the export goes where it points
  _check_out_dir(out_dir)
  byte_tokenizer = _writes_byte_tokenizer(config, tokenizer_dir)
  bos = _bos(config, tokenizer, byte_tokenizer)
  bos_id = None if bos is None else bos[1]
  cfg = (hybrid_config.hf_config_json(config, dims, dtype, bos_id=bos_id) if hybrid
         else hf_config.hf_config(config, dims, dtype, bos_id=bos_id))
  parent = os.path.dirname(out_dir)
  tmp = None
  try:
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + '.partial-', dir=parent)
    os.chmod(tmp, 0o755)
    _write_weights(tmp, table, tensor, safetensors_io.DTYPES['BF16' if dtype == 'bfloat16'
                                                             else 'F32'], max_shard_bytes)
    _write_json(os.path.join(tmp, 'config.json'), cfg)
    _write_json(os.path.join(tmp, 'generation_config.json'),
                hf_config.generation_config(config, cfg))
    for src, name in tokenizer + code:   # small files, local or on object storage
      with open(os.path.join(tmp, name), 'wb') as f:
        f.write(storage.read_bytes(src))
    tok_cfg = None if bos is None or byte_tokenizer else _tokenizer_config(tmp, bos[0])
    if tok_cfg is not None:
      _write_json(os.path.join(tmp, 'tokenizer_config.json'), tok_cfg)
    if byte_tokenizer:
      from gated_attention.input_pipeline.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
      ByteTokenizer().save_hf(tmp)
    if bos is not None and (config.get('hf') is None if bos_first is None else bos_first):
      _put_bos_first(tmp, *bos)
    if os.path.isdir(out_dir):
      os.rmdir(out_dir)
    os.rename(tmp, out_dir)
  except OSError as e:   # a read-only or full disk: nothing is left half-written
    if tmp:
      shutil.rmtree(tmp, ignore_errors=True)
    raise HFExportError(
        f'Cannot write the export to {out_dir}: {e.strerror or type(e).__name__}'
        f'{f" ({e.filename})" if e.filename else ""}. Nothing was written there; pass an --out '
        'on a writable disk with room for the weights.') from e
  except BaseException:
    if tmp:
      shutil.rmtree(tmp, ignore_errors=True)
    raise
  fmt = (dims.family if hybrid else 'qwen3' if dims.gate == 'none'
         else f'authors_gated_qwen3_{dims.gate}')
  return {'format': fmt,
          'files': sorted(os.listdir(out_dir))}
