"""The collectives a tensor-parallel model needs, and nothing when it runs on one device.

A model holds a TPGroup and calls it unconditionally; the single-rank group makes every call
a no-op, so TP=1 runs exactly the code (and the floating-point sums) it always ran.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

# A step's collectives finish in milliseconds; a peer silent this long is gone. Idle ranks do
# not wait in collectives (the next step reaches them over a pipe), so this bounds only hangs.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


class TPGroup:
    """Rank `rank` of `size`; `size == 1` is the plain single-device engine."""

    def __init__(self, rank: int = 0, size: int = 1):
        self.rank = rank
        self.size = size
        # Benchmarks turn this on to total the time spent in the model's collectives (on CUDA
        # each call is then synchronized, which costs some overlap: measure, don't serve).
        self.timing = False
        self.collective_s = 0.0
        self.collective_calls = 0

    @classmethod
    def join(cls, rank: int, size: int, host: str, port: int, device: torch.device) -> TPGroup:
        """Join the process group whose store rank 0 serves at host:port (gloo on CPU, nccl
        on CUDA). Blocks until every rank has joined."""
        store = dist.TCPStore(host, port, size, is_master=False, timeout=COLLECTIVE_TIMEOUT)
        store.set(f"joined/{rank}", "1")
        return cls._init(rank, size, store, device)

    @classmethod
    def host(cls, size: int, host: str = "127.0.0.1") -> tuple[dist.TCPStore, int]:
        """Rank 0: serve the rendezvous store on a free port; return it and the port."""
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=COLLECTIVE_TIMEOUT,
                              wait_for_workers=False)
        return store, store.port

    @classmethod
    def _init(cls, rank: int, size: int, store: dist.Store, device: torch.device) -> TPGroup:
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a tensor-parallel group: one "
                               "tensor-parallel engine per process")
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=COLLECTIVE_TIMEOUT, **kwargs)
        return cls(rank, size)

    @classmethod
    def start(cls, store: dist.Store, size: int, device: torch.device) -> TPGroup:
        """Rank 0's side of `join`."""
        return cls._init(0, size, store, device)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (row-parallel outputs, the vocab-parallel embedding)."""
        if self.size > 1:
            with self._timed(x):
                dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dimension (vocab-parallel logits)."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        with self._timed(x):
            dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

    @contextlib.contextmanager
    def _timed(self, x: torch.Tensor) -> Iterator[None]:
        if not self.timing:
            yield
            return
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        start = time.perf_counter()
        yield
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        self.collective_s += time.perf_counter() - start
        self.collective_calls += 1

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x, in place (async scheduling's sampled tokens)."""
        if self.size > 1:
            with self._timed(x):
                dist.broadcast(x, src=0)
        return x

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's value (KV blocks every rank can hold)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.long, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def leave(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()
