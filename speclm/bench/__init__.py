"""Benchmarks: speculative methods per prompt category, and peers (transformers, llama.cpp)."""
