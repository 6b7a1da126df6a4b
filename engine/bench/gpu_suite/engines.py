"""The engines a stage starts on the suite's model, one at a time. The memory of the engines
before is given back first: on CUDA an engine sizes its KV pool by what the device has free
(--gpu-memory-utilization), so one still held would shrink the next one's pool.

A stage builds each engine inside a function that returns before the next one starts, so
that nothing refers to the old engine when the memory is given back."""

from __future__ import annotations

from typing import Any

from tokenmill.engine.bench.ab import release_device_memory
from tokenmill.engine.bench.gpu_suite.context import SuiteContext


def start_llm(ctx: SuiteContext, **options: Any) -> Any:
    """An LLM on the suite's model, device and dtype (engine options as EngineConfig's); use
    it as a context manager so that it shuts down."""
    from tokenmill.engine import LLM

    release_device_memory()
    return LLM(ctx.model(), show_progress=ctx.show_progress, device=ctx.device,
               dtype=ctx.dtype, **options)

