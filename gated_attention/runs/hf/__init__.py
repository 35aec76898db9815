"""Hugging Face interop: open the authors' released checkpoints, export runs to `transformers`.

  config, params = load_hf('/data/1B_gate_headwise')   # config.json + *.safetensors, no torch
  save_hf(config, params, 'out/g1_headwise_hf', dtype='bfloat16')

Import reads stock Qwen3 (`model_type: qwen3`, the baseline) and the authors' gated Qwen3
(their `headwise_attn_output_gate` / `elementwise_attn_output_gate`: a widened q_proj holding
each KV group's queries then its gate logits, see layout.py), as a full run config (configs/
base.py's `tiny` defaults, the architecture from config.json, `data.tokenizer` = the directory's
tokenizer.json, `config.hf` = the source) and float32 parameters shaped like
`nnx.to_pure_dict(nnx.state(Transformer(config.model)))`.
Export writes the baseline as stock `Qwen3ForCausalLM` (loads in `transformers` without remote
code) and G1 headwise / elementwise sigmoid runs in the authors' format (`auto_map` to their
modeling_qwen3.py / configuration_qwen3.py, which the user copies into the directory, or passes
as `remote_code_dir`). Everything else (G2-G5, other activations or modes, head-shared,
input-independent, the G1 RMSNorm/SiLU ablations, sandwich norm, MoE, no QK-norm) is refused.
Refusals are HFFormatError / HFExportError (UserError): they name the field, and come before
anything is read or written.
"""

from gated_attention.runs.hf.convert import (DEFAULT_MAX_SHARD_BYTES, EXPORT_DTYPES,
                                             check_exportable, load_hf, read_hf_config, save_hf)
from gated_attention.runs.hf.errors import HFExportError, HFFormatError

__all__ = ['DEFAULT_MAX_SHARD_BYTES', 'EXPORT_DTYPES', 'HFExportError', 'HFFormatError',
           'check_exportable', 'load_hf', 'read_hf_config', 'save_hf']
