"""Benchmarks: offline throughput against HF transformers."""
