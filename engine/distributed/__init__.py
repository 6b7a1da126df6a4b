"""Tensor parallelism: one model sharded over several devices, one process per rank."""
