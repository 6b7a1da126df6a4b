"""What the engine tests share: counting a test's reads of tensor values into Python (on a GPU
each is a device-to-host wait), and the size of a KV cache block."""

from __future__ import annotations

import torch

from tokenmill.engine import LLM
from tokenmill.engine.execution.kv_layout import KVCacheLayout

HOST_READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy")


def record_host_reads(monkeypatch) -> list[str]:
    """From now until the test ends, every host read's method name is appended to the list."""
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def tiny_llama_block_bytes(llm: LLM, block_size: int) -> int:
    """Bytes of one KV cache block of `block_size` tokens for `llm`'s model."""
    engine = llm.engine
    return KVCacheLayout.for_model(engine.model_config, block_size, engine.dtype).bytes_per_block
