"""Host lists onto the device without waiting for the device: the values arrive as
torch.tensor would build them, and on CUDA the copy is queued behind a busy stream instead of
waiting for it (what async scheduling's overlap needs)."""

from __future__ import annotations

import warnings

import pytest
import torch
from triton_support import DEVICE, cuda_only

from tokenmill.engine.layers.to_device import list_to_device, to_device


@pytest.mark.parametrize(("values", "dtype"), [
    ([3, 1, 4, 1, 5], torch.long),
    ([[0.5, 20.0, 0.9, 0.0], [1.0, 7.0, 1.0, 0.05]], torch.float32),
    ([], torch.long),
])
def test_lists_arrive_as_torch_tensor_builds_them(values, dtype):
    got = list_to_device(values, dtype, DEVICE)
    want = torch.tensor(values, dtype=dtype)
    assert got.device.type == DEVICE.type and got.dtype == dtype
    assert torch.equal(got.cpu(), want)
    host = torch.arange(6).view(2, 3)
    assert torch.equal(to_device(host, DEVICE).cpu(), host)


@cuda_only
def test_a_copy_behind_queued_work_does_not_wait_for_it():
    busy = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(8):  # long enough that the copies are queued behind it
                busy = busy @ busy / 4096
            rows = list_to_device(list(range(100)), torch.long, DEVICE)
            settings = list_to_device([[0.8, 20.0, 0.9, 0.0]] * 4, torch.float32, DEVICE)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [str(w.message) for w in caught if "synchroniz" in str(w.message)] == []
    assert rows.tolist() == list(range(100)) and settings[3, 1].item() == 20.0
