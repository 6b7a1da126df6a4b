"""The bench stage's KV-offload part: multi-turn chat beyond the device pool, without and with
the host tier, and the tier's block copies against plain copies between pinned host memory and
the device (what PCIe delivers here).

The conversations (32 of a 1,000-token system prompt and growing histories, a pool for about
8 of them) are issue-sized for Llama-3.1-8B; a dry run cuts them down to a few tokens.
"""

from __future__ import annotations

import time
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status

GB = 1e9
# Llama-3.1-8B bf16: 128 KiB of KV per token, so a pool of 1.6 GB holds ~12k tokens: 8 of the
# conversations at their longest (system 1,000 + 6 turns of 128 + 64).
FULL_MULTITURN = ["--conversations", "32", "--turns", "6", "--system-len", "1000",
                  "--user-len", "128", "--answer-len", "64", "--think-time", "0.5",
                  "--kv-cache-memory", "1600000000", "--kv-offloading-size", "16"]
DRY_MULTITURN = ["--conversations", "6", "--turns", "3", "--system-len", "32",
                 "--user-len", "16", "--answer-len", "8", "--kv-cache-memory", "70000",
                 "--kv-offloading-size", "0.01", "--max-num-seqs", "4",
                 "--max-num-batched-tokens", "64"]
# The copy test: blocks of the 8B pool ([layers, 2, blocks, block_size, kv_heads, head_dim]).
FULL_POOL = dict(layers=32, block_size=16, kv_heads=8, head_dim=128, blocks=1024, moved=512)
DRY_POOL = dict(layers=2, block_size=16, kv_heads=2, head_dim=16, blocks=64, moved=32)


def run(ctx: SuiteContext, model: str) -> dict[str, Any]:
    return {"multiturn": multiturn(ctx, model), "copies": copy_bandwidth(ctx)}


def multiturn(ctx: SuiteContext, model: str) -> dict[str, Any]:
    import argparse

    from tokenmill.engine.bench import multiturn as bench_multiturn
    from tokenmill.engine.contract.config import add_engine_arguments

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    bench_multiturn.add_arguments(parser)
    args = parser.parse_args(["--model", model, "--device", ctx.device, "--dtype", ctx.dtype,
                              *(DRY_MULTITURN if ctx.dry_run else FULL_MULTITURN)])
    summary, payload = bench_multiturn.benchmark(args)
    return {"summary": summary, "workload": payload["workload"],
            "engine_config": payload["engine_config"]}


def copy_bandwidth(ctx: SuiteContext) -> dict[str, Any]:
    """GB/s of the host tier's block copies each way, and of one contiguous copy of the same
    bytes between pinned host memory and the device; the ratio is the tier's efficiency."""
    import torch

    from tokenmill.engine.execution.kv_offload import KVOffload

    shape = DRY_POOL if ctx.dry_run else FULL_POOL
    device = torch.device(ctx.device)
    dtype = getattr(torch, ctx.dtype)
    pool = torch.ones((shape["layers"], 2, shape["blocks"], shape["block_size"],
                       shape["kv_heads"], shape["head_dim"]), dtype=dtype, device=device)
    moved = shape["moved"]
    offload = KVOffload([pool], moved, device)
    pairs = [(2 * i, i) for i in range(moved)]  # every other device block: a scattered gather
    nbytes = offload.nbytes
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def timed(action: Any) -> float:
        action()  # warm-up
        sync()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            action()
            sync()
            best = min(best, time.perf_counter() - start)
        return nbytes / best / GB

    tier_to_host = timed(lambda: offload.run(pairs, []))
    tier_to_device = timed(lambda: offload.run([], pairs))
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    plain_to_host = timed(lambda: host.copy_(flat, non_blocking=True))
    plain_to_device = timed(lambda: flat.copy_(host, non_blocking=True))
    status(f"KV tier copies: to host {tier_to_host:.1f} GB/s (plain {plain_to_host:.1f}), to "
           f"device {tier_to_device:.1f} GB/s (plain {plain_to_device:.1f})")
    return {
        "bytes": nbytes, "blocks": moved,
        "block_bytes": nbytes // moved,
        "tier_to_host_gb_per_s": tier_to_host, "tier_to_device_gb_per_s": tier_to_device,
        "plain_to_host_gb_per_s": plain_to_host, "plain_to_device_gb_per_s": plain_to_device,
        "to_host_ratio": tier_to_host / plain_to_host,
        "to_device_ratio": tier_to_device / plain_to_device,
    }
