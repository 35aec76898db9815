"""Accelerator figures: peak dense bf16 FLOP/s, HBM bytes and HBM bandwidth per chip.

Used by the training loop (MFU on known chips), the TPU AOT report (aot.py) and
benchmarks/gpu.py. v5e/v5p/v6e expose one JAX device per chip; v4's compile-only topology has one
device per TensorCore (two per chip). NVIDIA's data sheets quote bf16 Tensor Core FLOP/s "with
sparsity" (2:4 structured); the dense peak, the one MFU is measured against, is half of it.
"""

CHIPS = {
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOPs (bf16), HBM2 32 GiB, 1200 GBps; 2 TensorCores
    'v4': dict(peak_bf16_flops=275e12, hbm_bytes=32 * 2**30, hbm_bandwidth=1200e9),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOPs (bf16), HBM2 16 GB, 819 GBps
    'v5e': dict(peak_bf16_flops=197e12, hbm_bytes=16 * 2**30, hbm_bandwidth=819e9),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOPs (bf16), HBM2e 95 GB, 2765 GBps
    'v5p': dict(peak_bf16_flops=459e12, hbm_bytes=95 * 2**30, hbm_bandwidth=2765e9),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOPs (bf16), HBM 32 GB, 1640 GBps
    'v6e': dict(peak_bf16_flops=918e12, hbm_bytes=32 * 2**30, hbm_bandwidth=1640e9),
    # https://www.nvidia.com/en-us/data-center/a100/: A100 80GB SXM, BF16 Tensor Core 312
    # TFLOPS (624 with sparsity), 80 GB HBM2e, 2,039 GB/s
    'a100': dict(peak_bf16_flops=312e12, hbm_bytes=80 * 10**9, hbm_bandwidth=2039e9),
    # https://www.nvidia.com/en-us/data-center/h100/: H100 SXM, BF16 Tensor Core 1,979 TFLOPS
    # with sparsity (989.5 dense), 80 GB HBM3, 3.35 TB/s
    'h100': dict(peak_bf16_flops=989.5e12, hbm_bytes=80 * 10**9, hbm_bandwidth=3350e9),
    # https://www.nvidia.com/en-us/data-center/h200/: H200 SXM, BF16 Tensor Core 1,979 TFLOPS
    # with sparsity (989.5 dense), 141 GB HBM3e, 4.8 TB/s
    'h200': dict(peak_bf16_flops=989.5e12, hbm_bytes=141 * 10**9, hbm_bandwidth=4800e9),
}
TPU_CHIPS = ('v4', 'v5e', 'v5p', 'v6e')  # the TPU generations above (aot.py compiles for these)
# Names libtpu's topology parser does not take -> the one it does.
ALIASES = {'v5litepod': 'v5e', 'v5lite': 'v5e', 'trillium': 'v6e', 'v6': 'v6e'}
# JAX device_kind -> chip (for training-time MFU on real devices).
DEVICE_KINDS = {'TPU v4': 'v4', 'TPU v5 lite': 'v5e', 'TPU v5e': 'v5e', 'TPU v5': 'v5p',
                'TPU v5p': 'v5p', 'TPU v6 lite': 'v6e', 'TPU v6e': 'v6e'}
# NVIDIA device_kinds carry the memory and form factor ('NVIDIA H100 80GB HBM3',
# 'NVIDIA A100-SXM4-40GB'): the SXM parts above, by model name. PCIe / NVL parts have lower
# clocks and are left unknown rather than given the SXM peak.
GPU_MODELS = ('A100', 'H100', 'H200')


def chip_spec(device_kind: str) -> dict | None:
  """CHIPS entry for a JAX device_kind ('TPU v5 lite' -> v5e, 'NVIDIA H200' -> h200), or None
  (CPU, other GPUs, unknown)."""
  if device_kind in DEVICE_KINDS:
    name = DEVICE_KINDS[device_kind]
    return dict(CHIPS[name], chip=name)
  return _gpu_spec(device_kind)


def _gpu_spec(device_kind: str) -> dict | None:
  """An SXM GPU's entry, its memory from the name when given ('A100-SXM4-40GB': 40 GB)."""
  words = device_kind.upper().replace('-', ' ').split()
  if not words or words[0] != 'NVIDIA' or {'PCIE', 'NVL'} & set(words):
    return None
  model = next((m for m in GPU_MODELS if m in words), None)
  if model is None:
    return None
  spec = dict(CHIPS[model.lower()], chip=model.lower())
  sizes = [int(w[:-2]) for w in words if w.endswith('GB') and w[:-2].isdigit()]
  if sizes:
    spec['hbm_bytes'] = sizes[0] * 10**9
  return spec
