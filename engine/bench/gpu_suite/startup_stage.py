"""Stage `startup`: what starting the engine on the 8B checkpoint takes, phase by phase (the
engine's start-up report: tokenizer, weights, KV-pool profiling, pool allocation, CUDA-graph
capture, total), and how much of the device is in use once it has started, against the
--gpu-memory-utilization it was given, with the pool's and the weights' bytes.

Part `cold` starts once, at the first utilization, with the model's files dropped from the page
cache first (a node that has just pulled the model); part `warm` starts at every utilization
with the files cached (a restart). A dry run on the CPU, where nothing is profiled, sizes the
pool by kv_cache_memory instead and has no device memory to read.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status
from tokenmill.engine.bench.gpu_suite.engines import start_llm
from tokenmill.engine.bench.gpu_suite.suite import selected
from tokenmill.engine.bench.load import drop_page_cache

PARTS = ["cold", "warm"]
UTILIZATIONS = (0.9, 0.5)
DRY_RUN_KV_MEMORY = (16 << 20, 8 << 20)


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    result: dict[str, Any] = {"device": ctx.device, "dtype": ctx.dtype, "runs": []}
    sizings = _sizings(ctx.dry_run)
    for part in selected(PARTS, args.only):
        for sizing in sizings[:1] if part == "cold" else sizings:
            result["runs"].append(_start(ctx, part, sizing))
            ctx.write("startup", result)
    return 0


def _sizings(dry_run: bool) -> list[dict[str, Any]]:
    """How each start sizes its pool: both options recorded, the one not used as None."""
    if dry_run:
        return [{"gpu_memory_utilization": None, "kv_cache_memory": b} for b in DRY_RUN_KV_MEMORY]
    return [{"gpu_memory_utilization": u, "kv_cache_memory": None} for u in UTILIZATIONS]


def _start(ctx: SuiteContext, part: str, sizing: dict[str, Any]) -> dict[str, Any]:
    model = ctx.model()
    if part == "cold":
        drop_page_cache([str(p) for p in Path(model).iterdir() if p.is_file()])
    options = {k: v for k, v in sizing.items() if v is not None}
    with start_llm(ctx, **options) as llm:
        engine = llm.engine
        utilization = sizing["gpu_memory_utilization"]
        result = {"part": part, "page_cache": "dropped" if part == "cold" else "warm", **sizing,
                  "cuda_graphs": engine.runner.graphs is not None,
                  "phases": engine.startup_report(), "load": engine.load_report(),
                  "memory": engine.memory_report(),
                  "device_memory": device_memory(utilization) if ctx.device == "cuda" else None}
    _say(result)
    return result


def device_memory(utilization: float | None) -> dict[str, Any]:
    """The device's memory now, as the driver and torch's allocator see it."""
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return device_memory_figures(free=free, total=total,
                                 allocated=torch.cuda.memory_allocated(),
                                 reserved=torch.cuda.memory_reserved(), utilization=utilization)


def device_memory_figures(*, free: int, total: int, allocated: int, reserved: int,
                          utilization: float | None) -> dict[str, Any]:
    """In use (by any process: the CUDA context too) against the utilization asked; what is
    unused of the asked share is the engine's head-room (negative: it took more)."""
    used = total - free
    return {"total_bytes": total, "free_bytes": free, "used_bytes": used,
            "used_fraction": used / total, "asked_utilization": utilization,
            "unused_of_asked_fraction": None if utilization is None else utilization - used / total,
            "torch_allocated_bytes": allocated, "torch_reserved_bytes": reserved}


def _say(result: dict[str, Any]) -> None:
    phases = result["phases"]
    sizing = (f"utilization {result['gpu_memory_utilization']}"
              if result["gpu_memory_utilization"] is not None
              else f"kv_cache_memory {result['kv_cache_memory']}")
    used = result["device_memory"]
    status(f"startup {result['part']} ({sizing}): {phases['total_seconds']:.1f} s in all, "
           f"weights {phases['weights_seconds']:.1f} s, KV profile "
           f"{phases['kv_profile_seconds']:.1f} s, pool {phases['kv_allocate_seconds']:.1f} s, "
           f"graphs {phases['graph_capture_seconds']:.1f} s; KV pool "
           f"{result['memory']['kv_pool_bytes'] / 2**30:.2f} GiB"
           + ("" if used is None else f", device {used['used_fraction']:.1%} in use"))
