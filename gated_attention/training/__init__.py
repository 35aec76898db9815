"""Training: the loss and the jit-compiled steps, the loop, the stability guard, prefetching, evaluation, metrics output."""
