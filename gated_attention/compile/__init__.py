"""Compilation without running: per-device memory, TPU ahead-of-time compilation and cost models, chip tables."""
