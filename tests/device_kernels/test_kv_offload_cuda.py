"""The KV host tier on CUDA: pinned chunks, copies on their own stream enqueued without a host
wait, equal to the CPU path's copies (tests/engine/test_kv_offload.py covers the CPU path and
the chunked copies' logic on CPU tensors)."""

from __future__ import annotations

import random

import pytest
import torch
from kv_offload_support import random_transfers

from tokenmill.engine.execution.kv_offload import KVOffload

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="the pinned tier and its copy stream need a CUDA GPU")


def _pools(kind: str, num_blocks: int) -> list[torch.Tensor]:
    """[layers, 2, blocks, block_size, kv_heads, head_dim]: bf16, or fp8 stored as bytes with
    float32 scales per token and head."""
    shape = (3, 2, num_blocks, 16, 4, 32)
    if kind == "bf16":
        return [torch.randn(shape, dtype=torch.bfloat16)]
    values = torch.randn(shape).to(torch.float8_e4m3fn).view(torch.uint8)
    return [values, torch.randn(shape[:-1])]


@cuda_only
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_cuda_copies_through_pinned_chunks_equal_the_cpu_copies(kind):
    rng = random.Random(0)
    torch.manual_seed(0)
    device = torch.device("cuda")
    num_blocks, host_blocks = 64, 24
    pools = _pools(kind, num_blocks)
    reference = KVOffload([p.clone() for p in pools], host_blocks, torch.device("cpu"))
    offload = KVOffload([p.to(device) for p in pools], host_blocks, device)
    assert len(offload.chunk_blocks) > 1  # 24 blocks of 24 KiB are no power of two
    assert all(chunk.is_pinned() for _, chunks in offload.pairs for chunk in chunks)
    for _ in range(200):
        to_host, to_device = random_transfers(rng, num_blocks, host_blocks, 12)
        reference.run(to_host, to_device)
        offload.run(to_host, to_device)
        written = rng.sample(range(num_blocks), 4)  # the step's forward, on the compute stream
        for (ref_pool, _), (pool, _) in zip(reference.pairs, offload.pairs, strict=True):
            noise = torch.randint(0, 120, (3, 2, 4, *ref_pool.shape[3:])).to(ref_pool.dtype)
            ref_pool[:, :, written] = noise
            pool[:, :, torch.tensor(written, device=device)] = noise.to(device)
    torch.cuda.synchronize()
    for (ref_pool, (ref_host,)), (pool, chunks) in zip(reference.pairs, offload.pairs,
                                                        strict=True):
        assert torch.equal(pool.cpu(), ref_pool)
        assert torch.equal(torch.cat(chunks), ref_host)
