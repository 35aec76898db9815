"""benchmarks/: the pieces that run without an accelerator or a long measurement."""

import importlib
import json
import os

import numpy as np
import pytest

def _load(name):
  """benchmarks/<name>.py (run as `python -m benchmarks.<name>`)."""
  return importlib.import_module(f'benchmarks.{name}')


@pytest.mark.parametrize('granularity', ['elementwise', 'headwise'])
def test_pytorch_reference_gate_is_sigmoid_of_widened_q_proj(granularity):
  """With the gate's columns zero the gate is 0.5: a gated model whose o_proj is doubled gives
  the ungated model's logits, so the hooks hand Qwen3 the right query columns; with them
  random the logits change."""
  torch = pytest.importorskip('torch')
  ref = _load('reference_pytorch')
  torch.manual_seed(0)
  cfg = ref.qwen3_config('a')
  cfg.num_hidden_layers = 2
  base = ref.Qwen3ForCausalLM(cfg).eval()
  gated = ref.Qwen3ForCausalLM(cfg).eval()
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


# --------------------------------------------------------------------------------------------
# benchmarks/gpu.py: what runs without a GPU
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def gpu():
  return _load('gpu')


def test_gpu_benchmark_refuses_without_a_gpu(gpu, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(os, 'environ', dict(os.environ))              # main() sets a variable
  assert jax.default_backend() == 'cpu'
  for call in (lambda: gpu.main(['--models=tiny']),                  # the parent
               lambda: gpu.measure('tiny', 'baseline', 2, 1)):       # a measuring child
    with pytest.raises(SystemExit, match=r"needs an NVIDIA GPU.*default backend is 'cpu'"):
      call()
  with pytest.raises(SystemExit, match='needs an NVIDIA GPU'):       # a GPU that is not NVIDIA's
    gpu.require_gpu('gpu', [type('D', (), {'device_kind': 'AMD Instinct MI300X'})()])


def test_gpu_benchmark_model_sizes(gpu):
  from gated_attention.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from tests.jax_helpers import model_config  # pylint: disable=g-import-not-at-top
  sizes = {}
  for name in gpu.MODELS:
    c = gpu.gpu_config(name, 'g1_elementwise', 4)
    assert c.model.dtype == 'bfloat16' and c.train.batch_size == 4
    sizes[name] = model_lib.param_report(model_config(c.model))['total']
  assert 5e5 < sizes['tiny'] < 2e6
  assert 0.8e8 < sizes['dense_100m'] < 1.2e8
  assert 1.6e9 < sizes['dense_1p7b_28l'] < 1.9e9


def test_gpu_mfu_against_chip_peaks(gpu):
  from gated_attention import chips  # pylint: disable=g-import-not-at-top
  h200 = chips.chip_spec('NVIDIA H200')
  assert h200['chip'] == 'h200' and h200['peak_bf16_flops'] == 989.5e12    # 1,979 sparse / 2
  assert chips.chip_spec('NVIDIA H100 80GB HBM3')['peak_bf16_flops'] == 989.5e12
  a100 = chips.chip_spec('NVIDIA A100-SXM4-40GB')
  assert a100['peak_bf16_flops'] == 312e12 and a100['hbm_bytes'] == 40e9  # memory from the name
  assert chips.chip_spec('NVIDIA H100 PCIe') is None                      # lower clocks: unknown
  assert chips.chip_spec('NVIDIA GeForce RTX 4090') is None
  # 10k tokens/s of a 6 GFLOP/token model on an H200: 60 TFLOP/s, 6.06% of 989.5
  assert gpu.mfu(1e4, 6e9, h200['peak_bf16_flops']) == pytest.approx(0.0606367, rel=1e-5)
  assert gpu.mfu(1e4, 6e9, None) is None


def test_gpu_batch_fallback_and_flags(gpu):
  assert gpu.batch_sizes(16) == [16, 8, 4, 2, 1]
  assert gpu.batch_sizes(3) == [3, 1]
  with pytest.raises(ValueError, match='positive'):
    gpu.batch_sizes(0)
  assert gpu.is_oom('jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory')
  assert not gpu.is_oom('ValueError: bad config')
  flags = gpu.with_xla_flags('--xla_gpu_enable_triton_gemm=true --xla_dump_to=/tmp/x')
  assert '--xla_gpu_enable_triton_gemm=true' in flags and 'triton_gemm=false' not in flags
  assert '--xla_gpu_enable_latency_hiding_scheduler=true' in flags and '--xla_dump_to' in flags
  env = gpu.child_env({'XLA_PYTHON_CLIENT_MEM_FRACTION': '0.5'})
  assert env['XLA_PYTHON_CLIENT_MEM_FRACTION'] == '0.5'                   # the user's, kept
  assert gpu.child_env({})['XLA_PYTHON_CLIENT_MEM_FRACTION'] == gpu.MEM_FRACTION


def test_gate_share_of_step_time_paired_by_round(gpu, monkeypatch):
  """throughput.gate_share: 1 - baseline / gated step time within each round, its median and t
  interval over the rounds (the compiling step left out), and the gate's share of the FLOPs;
  gpu.py's --overhead child refuses without a GPU and its table prints."""
  from scipy import stats as sps  # pylint: disable=g-import-not-at-top
  throughput = _load('throughput')
  base = type('T', (), {'seconds': [9.0, 1.00, 1.10, 0.95, 1.20], 'flops_per_token': 100.0})()
  gated = type('T', (), {'seconds': [9.5, 1.02, 1.13, 0.96, 1.21], 'flops_per_token': 104.0})()
  share = 1 - np.array([1.00, 1.10, 0.95, 1.20]) / np.array([1.02, 1.13, 0.96, 1.21])
  got = throughput.gate_share(gated, base)
  assert got['time_share_median'] == pytest.approx(np.median(share))
  ci = sps.ttest_1samp(share, 0).confidence_interval()
  assert got['time_share_interval'] == pytest.approx([ci.low, ci.high])
  assert got['flops_share'] == pytest.approx(1 - 100 / 104)
  monkeypatch.setattr(os, 'environ', dict(os.environ))
  with pytest.raises(SystemExit, match='needs an NVIDIA GPU'):
    gpu.measure_overhead('tiny', 'g1_elementwise', 2, 1, 2)
  row = dict(model='tiny', batch=2, seq_len=128, baseline_step_s=0.01, step_s=0.0102, **got)
  gpu.print_overhead([row])


# --------------------------------------------------------------------------------------------
# benchmarks/gpu_session.py: the GPU session's sizing and, on CPU, its control flow
# --------------------------------------------------------------------------------------------

def test_gpu_session_sizes_the_sink_runs_from_the_measured_throughput():
  from benchmarks import gpu_session  # pylint: disable=g-import-not-at-top
  # 480 s for 2 runs: (240 - 90) s x 1e6 tokens/s / 65,536 tokens per step
  assert gpu_session.sink_steps(1e6, 480, 2) == int(150 * 1e6 / 65536)
  # the rows as benchmarks/gpu.py writes them (its key is tokens_per_s)
  row = dict(model='dense_100m', tokens_per_s=2.5e5, mfu=0.4)
  assert gpu_session.measured_tokens_per_s([dict(row, model='tiny'), row]) == 2.5e5
  assert gpu_session.measured_tokens_per_s([]) is None
  assert gpu_session.sink_steps(1e9, 480, 2) == gpu_session.MAX_STEPS
  assert gpu_session.sink_steps(1e3, 480, 2) == 100
  assert gpu_session.sink_steps(None, 480, 2) == gpu_session.FALLBACK_STEPS


@pytest.mark.slow
def test_gpu_session_control_flow_on_cpu(tmp_path):
  """The benchmark refuses without a GPU (recorded), the sink stage still runs and writes its
  table; ~50 s."""
  from benchmarks import gpu_session  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'session'
  assert gpu_session.main([f'--out={out}', '--scale=tiny', '--steps=4', '--budget_s=300']) == 1
  session = json.loads((out / 'session.json').read_text())
  assert session['stages']['benchmark']['status'] == 'failed (exit 1)'
  assert 'needs an NVIDIA GPU' in (out / 'gpu.log').read_text()
  assert json.loads((out / 'gpu.json').read_text()) == []
  assert session['stages']['overhead']['status'] == 'failed (exit 1)'
  assert json.loads((out / 'overhead.json').read_text()) == []
  assert session['stages']['sink']['status'] == 'done' and session['sink_steps'] == 4
  table = (out / 'sink' / 'results.md').read_text()
  assert '| baseline | 1/1 |' in table and '| g1_elementwise | 1/1 |' in table


def test_attention_benchmark_pytorch_sdpa_gradients_equal_the_chunked_core():
  """benchmarks/attention.py --pytorch: PyTorch's SDPA (causal, GQA) and the chunked core give
  the same gradients of sum(out^2) on random inputs (the float64 reference of the core is
  tests/test_attention.py's), so the two columns time the same computation."""
  pytest.importorskip('torch')
  bench = _load('attention')
  qkv = bench.inputs(T=64, B=2, heads=(4, 2, 16))
  _, jax_grads = bench.jax_grads('chunked', 32, *qkv)
  _, torch_grads = bench.pytorch_grads(*qkv)
  assert [g.shape for g in torch_grads] == [x.shape for x in qkv]
  assert bench.max_difference(jax_grads, torch_grads) < 1e-4
  assert max(float(np.max(np.abs(g))) for g in torch_grads) > 1e-2   # not trivially equal


def test_hybrid_benchmark_compares_the_same_shape_with_and_without_deltanet():
  """benchmarks/hybrid.py: the hybrid and the all-attention model differ only in the layer
  pattern (same width, depth, gate, FFNs, batch and length)."""
  from gated_attention.config import schema  # pylint: disable=g-import-not-at-top
  hybrid = _load('hybrid')
  c = hybrid.configs('g1_elementwise', 4096, 1, 64)
  h, a = (c[k].to_dict() for k in ('hybrid', 'attention'))
  assert list(h['model'].pop('layer_types')) == ['linear_attention'] * 3 + ['full_attention']
  assert tuple(a['model'].pop('layer_types')) == ()
  assert h == a and h['data']['seq_len'] == 4096 and h['model']['gate']['position'] == 'g1'
  for config in c.values():
    schema.check(config)


# --------------------------------------------------------------------------------------------
# benchmarks/int8_matmul.py: an int8 x int8 -> int32 dot_general against float32
# --------------------------------------------------------------------------------------------

def test_int8_matmul_is_exact_and_gives_ratios():
  row = _load('int8_matmul').measure(8, 32, 16, rounds=1)
  assert row['float32']['exact'] and row['shape'] == '8x32x16'
  if 'error' not in row['int8_int32']:         # the backend has an int8 dot (CPU does)
    assert row['int8_int32']['exact'] and row['int8_int32']['speedup_over_float32'] > 0
