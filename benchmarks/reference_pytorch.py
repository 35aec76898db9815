"""The PyTorch reference for benchmarks/throughput.py: stock `transformers` Qwen3, same shapes.

Qwen3Config / Qwen3ForCausalLM (QK-norm, RoPE, GQA, SwiGLU, tied embeddings) at a shape of
benchmarks/shapes.py, float32, SDPA attention, `torch.set_num_threads` = the cores this process
may use. One training step: forward, cross-entropy against the next tokens, backward, global-norm
clipping at 1.0 and torch.optim.AdamW (betas 0.9 / 0.95, weight decay 0.1), as train.py. Timed
like throughput.py: every variant built first, then round-robin rounds of `--steps` steps, the
median round reported as tokens/s.

The gated variants add the gate as the authors do (Qiu et al. 2025, Sec. 2.2; their Qwen3 code,
and Qwen3-Next): q_proj is widened to also produce the gate logits, per head [q_h | g_h] (d
columns elementwise, 1 headwise), and the SDPA output is multiplied by their sigmoid before
o_proj. Stock Qwen3Attention is kept; two hooks do it (`add_gate`): a forward hook on q_proj
hands Qwen3 the queries and keeps the logits, a forward pre-hook on o_proj applies the gate.

  python -m benchmarks.reference_pytorch [--shape=a|b] [--steps=10] [--rounds=5] [--json]
  python -m benchmarks.throughput --pytorch     # both, and the JAX / PyTorch ratio
"""

import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from benchmarks import shapes


def qwen3_config(shape: str) -> Qwen3Config:
  s = shapes.model_fields(shape)
  return Qwen3Config(
      vocab_size=s['vocab_size'], hidden_size=s['hidden_size'], intermediate_size=s['ffn_size'],
      num_hidden_layers=s['num_layers'], num_attention_heads=s['num_heads'],
      num_key_value_heads=s['num_kv_heads'], head_dim=s['head_dim'], rms_norm_eps=1e-6,
      rope_theta=10_000.0, tie_word_embeddings=True, attention_bias=False,
      max_position_embeddings=shapes.SHAPES[shape]['seq_len'], attn_implementation='sdpa',
      torch_dtype=torch.float32)


def add_gate(attn: torch.nn.Module, granularity: str, init_std: float = 0.02):
  """Widens `attn.q_proj` (a Qwen3Attention's) by the gate's columns and gates the SDPA output
  with sigmoid(logits) before `attn.o_proj`."""
  q_proj, d = attn.q_proj, attn.head_dim
  H = q_proj.out_features // d
  n = d if granularity == 'elementwise' else 1
  widened = torch.nn.Linear(q_proj.in_features, H * (d + n), bias=False)
  with torch.no_grad():                                     # [q_h | g_h] per head
    w = widened.weight.view(H, d + n, q_proj.in_features)
    w[:, :d] = q_proj.weight.view(H, d, -1)
    w[:, d:].normal_(0.0, init_std)
  attn.q_proj = widened

  def split(module, inputs, out_BxTxE):
    q_BxTxHxd, g_BxTxHxn = out_BxTxE.unflatten(-1, (H, d + n)).split([d, n], dim=-1)
    module.gate_logits = g_BxTxHxn
    return q_BxTxHxd.flatten(-2)

  def apply_gate(module, inputs):
    y_BxTxHxd = inputs[0].unflatten(-1, (H, d))
    gate = torch.sigmoid(attn.q_proj.gate_logits)
    attn.q_proj.gate_logits = None
    return ((y_BxTxHxd * gate).flatten(-2),)

  widened.register_forward_hook(split)
  attn.o_proj.register_forward_pre_hook(apply_gate)


def build(variant: str, shape: str, seed: int = 0) -> Qwen3ForCausalLM:
  torch.manual_seed(seed)
  model = Qwen3ForCausalLM(qwen3_config(shape))
  if shapes.GATES[variant]:
    for layer in model.model.layers:
      add_gate(layer.self_attn, shapes.GATES[variant])
  return model.train()


class StepTimer:
  """One variant's training step on a fixed random batch."""

  def __init__(self, variant: str, shape: str, seed: int = 0):
    s = shapes.SHAPES[shape]
    self.model = build(variant, shape, seed)
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                 eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, shapes.VOCAB, (s['batch'], s['seq_len'] + 1), generator=g)
    self.inputs, self.targets = toks[:, :-1], toks[:, 1:]
    self.tokens_per_step = s['batch'] * s['seq_len']
    self.seconds = []
    self.step()                                             # warm-up

  def step(self) -> torch.Tensor:
    logits = self.model(input_ids=self.inputs).logits
    loss = F.cross_entropy(logits.flatten(0, 1), self.targets.flatten())
    self.opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.opt.step()
    return loss.detach()

  def run(self, steps: int):
    start = time.perf_counter()
    for _ in range(steps):
      self.step()
    self.seconds.append((time.perf_counter() - start) / steps)

  def summary(self) -> dict:
    step_s = float(np.median(self.seconds))
    return dict(step_s=step_s, tokens_per_s=self.tokens_per_step / step_s)


def main():
  parser = shapes.parser(__doc__.split('\n')[0])
  parser.add_argument('--json', action='store_true', help='print one JSON line (throughput.py)')
  args = parser.parse_args()
  variants = shapes.variants(parser, args)
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  timers = {v: StepTimer(v, args.shape) for v in variants}
  for _ in range(args.rounds):
    for t in timers.values():
      t.run(args.steps)
  table = [dict(variant=v, **t.summary()) for v, t in timers.items()]
  if args.json:
    print(json.dumps(table))
    return
  print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, shape {args.shape} '
        f'{shapes.SHAPES[args.shape]}')
  for r in table:
    print(f'{r["variant"]:16s} {r["tokens_per_s"]:10,.0f} tokens/s  '
          f'({r["step_s"] * 1e3:.1f} ms/step)')


if __name__ == '__main__':
  main()
