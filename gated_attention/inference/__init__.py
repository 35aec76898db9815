"""Using a trained model: sampling with a KV cache, long-context evaluation."""
