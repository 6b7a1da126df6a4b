"""Mamba-1's selective-scan kernel equals its torch reference (layers/mamba1.py) over padded
prompt chunks of different lengths, each from its own state slot: the outputs within each
chunk and the states it leaves; slots it does not name are untouched."""

from __future__ import annotations

import pytest
import torch
from triton_support import DEVICE

from tokenmill.engine.kernels.selective_scan import selective_scan
from tokenmill.engine.layers.mamba1 import selective_prompts


@pytest.mark.parametrize("channels,states", [(20, 16), (70, 8)])
def test_selective_scan_kernel_equals_torch(channels, states):
    torch.manual_seed(0)
    lengths = torch.tensor([5, 2, 4], device=DEVICE)
    runs, longest = len(lengths), int(lengths.max())
    mask = torch.arange(longest, device=DEVICE)[None, :] < lengths[:, None]
    x = torch.randn(runs, longest, channels, device=DEVICE)
    dt = torch.rand(runs, longest, channels, device=DEVICE) * mask[..., None]
    a = -torch.rand(channels, states, device=DEVICE) * 4
    b, c = (torch.randn(runs, longest, states, device=DEVICE) for _ in range(2))
    d = torch.randn(channels, device=DEVICE)
    pool = torch.randn(6, channels, states, device=DEVICE)
    slots = torch.tensor([4, 0, 2], device=DEVICE)
    expected_pool = pool.clone()
    expected = selective_prompts(x, dt, a, b, c, d, expected_pool, slots, lengths)
    got = selective_scan(x, dt, a, b, c, d, pool, slots, lengths)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool, expected_pool, atol=1e-5, rtol=1e-5)
    assert torch.equal(pool[[1, 3, 5]], expected_pool[[1, 3, 5]])
