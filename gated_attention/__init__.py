"""gated-attention: gated softmax attention (Qiu et al., 2025) in JAX / Flax NNX."""
