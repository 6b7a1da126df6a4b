"""When requests go out: Poisson arrivals at a given rate, a cap on requests in flight, or both.

Arrival times are fixed up front from the seed, so a rate-limited run offers the same load
whatever the server does; with a concurrency cap, a request that has arrived waits client-side
for a free slot, and its timings start when it is actually sent.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def arrival_times(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Seconds after the start: the first at 0, then exponential gaps; all 0 at an inf rate."""
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if request_rate <= 0:
        raise ValueError(f"request rate must be positive, got {request_rate}")
    rng = random.Random(f"arrivals:{seed}")
    times, t = [], 0.0
    for i in range(num_requests):
        if i:
            t += rng.expovariate(request_rate)
        times.append(t)
    return times


async def run_load(items: Sequence[T], send: Callable[[T], Awaitable[R]],
                   arrivals: Sequence[float], max_concurrency: int | None = None,
                   on_done: Callable[[R], None] | None = None) -> list[R]:
    """Send each item at its arrival time, at most `max_concurrency` in flight; results in order."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(item: T) -> R:
        if slots is None:
            result = await send(item)
        else:
            async with slots:
                result = await send(item)
        if on_done is not None:
            on_done(result)
        return result

    start = loop.time()
    tasks = []
    for item, at in zip(items, arrivals, strict=True):
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(item)))
    return list(await asyncio.gather(*tasks))
