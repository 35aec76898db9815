"""The model: its typed config, the gate, attention and its kernels, layers, RoPE, MoE, the Transformer."""
