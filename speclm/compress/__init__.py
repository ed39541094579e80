"""Offline compression: perplexity evaluation, quantization, pruning and merging of checkpoints."""
