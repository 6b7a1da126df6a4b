"""Which LoRA adapters a server holds and runs, for routers and the operator.

`tokenmill_lora_requests_info` has the shape of vLLM's `lora_requests_info`, which the Gateway
API inference extension's endpoint picker reads to route a request to a server that already
holds its adapter: one series whose labels list the adapters of running and of waiting
requests (comma-separated) and `max_lora`, valued the Unix time it was taken (a reader keeps
the newest). `tokenmill_lora_adapter_info{adapter}` is 1 for every adapter the server has
loaded (the operator reports them in the InferenceService's status). With `vllm_names` the
same series is exported as `vllm:lora_requests_info` too, the name the endpoint picker reads
unconfigured (its --lora-info-metric); docs/gateway-api.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from tokenmill.engine.core import LLMEngine
    from tokenmill.engine.frontend.async_engine import AsyncEngine

REQUESTS_INFO = "tokenmill_lora_requests_info"
ADAPTER_INFO = "tokenmill_lora_adapter_info"
VLLM_REQUESTS_INFO = "vllm:lora_requests_info"


class LoRAMetrics:
    """A collector read at scrape time: the adapters from the engine, the batch's adapters from
    the latest step's snapshot (taken on the engine thread, which owns the scheduler)."""

    def __init__(self, model_name: str, registry: CollectorRegistry, vllm_names: bool = True):
        self.model_name = model_name
        self.vllm_names = vllm_names
        self._engine: AsyncEngine | None = None
        self._max_lora = 0
        self._batch: tuple[list[str], list[str], float] = ([], [], time.time())
        registry.register(self)

    def bind(self, engine: AsyncEngine) -> None:
        if engine.engine.config.enable_lora:
            self._engine = engine
            self._max_lora = engine.engine.config.max_loras

    def observe_step(self, engine: LLMEngine) -> None:
        if self._engine is not None:
            running, waiting = engine.lora_batch_info()
            self._batch = (running, waiting, time.time())

    def collect(self) -> Iterator[Metric]:
        if self._engine is None:
            return
        running, waiting, taken = self._batch
        values = [",".join(sorted(set(running))), ",".join(sorted(set(waiting))),
                  str(self._max_lora)]
        for name in (REQUESTS_INFO, VLLM_REQUESTS_INFO) if self.vllm_names else (REQUESTS_INFO,):
            info = GaugeMetricFamily(
                name, "LoRA adapters of the running and waiting requests (comma-separated "
                "labels); the value is the Unix time they were read.",
                labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
            info.add_metric(values, taken)
            yield info
        loaded = GaugeMetricFamily(ADAPTER_INFO, "1 for every LoRA adapter this server has "
                                                 "loaded.", labels=["model_name", "adapter"])
        for name in sorted(self._engine.lora_adapters()):
            loaded.add_metric([self.model_name, name], 1)
        yield loaded
