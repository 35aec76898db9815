"""Accelerator figures: peak dense bf16 FLOP/s, HBM bytes and HBM bandwidth per chip.

Used by the training loop (MFU on known chips) and the TPU AOT report (aot.py). v5e/v5p/v6e
expose one JAX device per chip; v4's compile-only topology has one device per TensorCore (two
per chip).
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
}
# Names libtpu's topology parser does not take -> the one it does.
ALIASES = {'v5litepod': 'v5e', 'v5lite': 'v5e', 'trillium': 'v6e', 'v6': 'v6e'}
# JAX device_kind -> chip (for training-time MFU on real devices).
DEVICE_KINDS = {'TPU v4': 'v4', 'TPU v5 lite': 'v5e', 'TPU v5e': 'v5e', 'TPU v5': 'v5p',
                'TPU v5p': 'v5p', 'TPU v6 lite': 'v6e', 'TPU v6e': 'v6e'}


def chip_spec(device_kind: str) -> dict | None:
  """CHIPS entry for a JAX device_kind ('TPU v5 lite' -> v5e), or None (CPU, GPU, unknown)."""
  name = DEVICE_KINDS.get(device_kind)
  return dict(CHIPS[name], chip=name) if name else None
