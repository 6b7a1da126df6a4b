"""What the engine tests share: counting a test's reads of tensor values into Python (on a GPU
each is a device-to-host wait)."""

from __future__ import annotations

import torch

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
