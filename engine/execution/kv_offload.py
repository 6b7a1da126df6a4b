"""The host tier's tensors and the block copies between them and the device's KV pool.

The core decides which blocks move (core/kv_cache/host_tier.py); every step's StepInputs lists
them as (device block, host block) pairs, and each rank copies its own shard before the step's
forward pass. Host blocks are stored block-major ([blocks, layers, 2, block_size, kv_heads,
head_dim], each block one contiguous run of the pool's dtype; scales likewise) so that one
block is one memcpy. A quantized pool moves as stored: its bytes and its scales.

On CUDA the host tensors are pinned and the copies run on their own stream, enqueued without
any host synchronization: the compute stream waits for them on the device, not the host.
torch's pinned allocator rounds every allocation up to a power of two (one 20 GiB tensor would
pin 32 GiB, past a pod's memory limit), so there the tier is several tensors, each holding the
most blocks that fit a power of two (`pinned_chunks`).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import torch

from tokenmill.engine.execution.zeroed import zeroed

# Device memory a step's tier copies stage blocks through, at most, per pool tensor.
STAGING_BYTES = 256 << 20


class KVOffload:
    def __init__(self, device_tensors: list[torch.Tensor], num_blocks: int,
                 device: torch.device):
        """device_tensors: the pool's tensors ([layers, 2, blocks, ...] each), values (as bytes
        when quantized) and scales; a host twin of num_blocks blocks is made for each, in
        chunks of `chunk_blocks` blocks (one chunk unless pinned)."""
        self.device = device
        self.num_blocks = num_blocks
        cuda = device.type == "cuda"
        block_bytes = sum(pool[:, :, 0].nbytes for pool in device_tensors)
        self.chunk_blocks = pinned_chunks(num_blocks, block_bytes) if cuda else [num_blocks]
        self._starts = list(accumulate(self.chunk_blocks[:-1], initial=0))
        self.pairs = [(pool, [_host_chunk((n, *pool.shape[:2], *pool.shape[3:]), pool.dtype,
                                          pinned=cuda)
                              for n in self.chunk_blocks])
                      for pool in device_tensors]
        self.stream = torch.cuda.Stream(device) if cuda else None

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for _, chunks in self.pairs for chunk in chunks)

    def run(self, to_host: list[tuple[int, int]], to_device: list[tuple[int, int]]) -> None:
        """Copy blocks to the host tier, then back to the device (a block offloaded in this
        step may be brought back in the same step, so the order matters)."""
        if not to_host and not to_device:
            return
        if self.stream is None:
            self._copy_on_cpu(to_host, to_device)
            return
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # the pool as the previous steps left it
        with torch.cuda.stream(self.stream):
            for pool, chunks in self.pairs:
                copy_block_by_block(pool, chunks, self._starts, to_host, to_device)
        compute.wait_stream(self.stream)  # this step's forward reads and writes those blocks

    def _copy_on_cpu(self, to_host: list[tuple[int, int]],
                     to_device: list[tuple[int, int]]) -> None:
        for pool, (host,) in self.pairs:
            if to_host:
                device_ids, host_ids = _indices(to_host, self.device)
                host[host_ids] = pool[:, :, device_ids].movedim(2, 0)
            if to_device:
                device_ids, host_ids = _indices(to_device, self.device)
                pool[:, :, device_ids] = host[host_ids].movedim(0, 2)


def _host_chunk(shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """Pinned for a CUDA pool's asynchronous copies; otherwise committed as blocks arrive."""
    if pinned:
        return torch.zeros(shape, dtype=dtype, pin_memory=True)
    return zeroed(shape, dtype, torch.device("cpu"))


def pinned_chunks(num_blocks: int, block_bytes: int) -> list[int]:
    """How many blocks each pinned tensor of the tier holds: the most that fit the largest
    power of two within the bytes still to place, so that no tensor is rounded up past it.
    The tier then pins at most one block more per chunk than it holds, in a few chunks (one
    where its size is a power of two)."""
    chunks: list[int] = []
    left = num_blocks
    while left:
        fits = (1 << ((left * block_bytes).bit_length() - 1)) // block_bytes
        chunks.append(max(1, fits))
        left -= chunks[-1]
    return chunks


def copy_block_by_block(pool: torch.Tensor, chunks: list[torch.Tensor], starts: list[int],
                        to_host: list[tuple[int, int]], to_device: list[tuple[int, int]],
                        staging_bytes: int = STAGING_BYTES) -> None:
    """The copies one block at a time, each host block one contiguous run (non-blocking from
    and to pinned memory on CUDA); starts: each chunk's first host block. Blocks pass through
    a device buffer of at most staging_bytes at a time: a long prefix brought back at once
    must not need its size again in free device memory."""
    def host_block(block: int) -> torch.Tensor:
        chunk = bisect_right(starts, block) - 1
        return chunks[chunk][block - starts[chunk]]

    group = max(1, staging_bytes // pool[:, :, 0].nbytes)
    for first in range(0, len(to_host), group):
        moved = to_host[first:first + group]
        device_ids, _ = _indices(moved, pool.device)
        staged = pool[:, :, device_ids].movedim(2, 0).contiguous()
        for row, (_, block) in enumerate(moved):
            host_block(block).copy_(staged[row], non_blocking=True)
    for first in range(0, len(to_device), group):
        moved = to_device[first:first + group]
        device_ids, _ = _indices(moved, pool.device)
        staged = torch.empty((len(moved), *chunks[0].shape[1:]), dtype=pool.dtype,
                             device=pool.device)
        for row, (_, block) in enumerate(moved):
            staged[row].copy_(host_block(block), non_blocking=True)
        pool[:, :, device_ids] = staged.movedim(0, 2)


def _indices(pairs: list[tuple[int, int]],
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Device-block ids on the device (sent without a host wait on CUDA), host-block ids on
    the host."""
    device_ids = torch.tensor([d for d, _ in pairs])
    host_ids = torch.tensor([h for _, h in pairs])
    if device.type == "cuda":
        device_ids = device_ids.pin_memory().to(device, non_blocking=True)
    return device_ids, host_ids
