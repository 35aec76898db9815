"""benchmarks/: the pieces that run without an accelerator or a long measurement."""

import importlib.util
import os

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks')


def _load(name):
  """benchmarks/<name>.py as a module (benchmarks/ is a folder of scripts, not a package)."""
  spec = importlib.util.spec_from_file_location(f'bench_{name}', os.path.join(BENCH, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('granularity', ['elementwise', 'headwise'])
def test_pytorch_reference_gate_is_sigmoid_of_widened_q_proj(granularity):
  """With the gate's columns zero the gate is 0.5: a gated model whose o_proj is doubled gives
  the ungated model's logits, so the hooks hand Qwen3 the right query columns; with them
  random the logits change."""
  torch = pytest.importorskip('torch')
  ref = _load('reference_pytorch')
  torch.manual_seed(0)
  base = ref.Qwen3ForCausalLM(ref.qwen3_config('a')).eval()
  gated = ref.Qwen3ForCausalLM(ref.qwen3_config('a')).eval()
  gated.load_state_dict(base.state_dict())
  H, d, D = 4, 64, 256
  n = d if granularity == 'elementwise' else 1
  for layer in gated.model.layers:
    attn = layer.self_attn
    ref.add_gate(attn, granularity)
    assert attn.q_proj.weight.shape == (H * (d + n), D)
    with torch.no_grad():
      attn.q_proj.weight.view(H, d + n, D)[:, d:] = 0.0
      attn.o_proj.weight *= 2.0
  tokens = torch.randint(0, 384, (2, 16))
  with torch.no_grad():
    want = base(input_ids=tokens).logits
    np.testing.assert_allclose(gated(input_ids=tokens).logits, want, rtol=1e-4, atol=1e-4)
    for layer in gated.model.layers:
      layer.self_attn.q_proj.weight.view(H, d + n, D)[:, d:].normal_(0.0, 0.5)
    assert not np.allclose(gated(input_ids=tokens).logits, want, atol=1e-3)
