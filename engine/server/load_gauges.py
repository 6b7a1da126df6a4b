"""The load gauges a router reads: tokenmill's, and the same values under vLLM's names.

The Gateway API inference extension's endpoint picker (EPP) routes an InferencePool's requests
by scraping each model server's /metrics. Unconfigured, it reads vLLM's families (its flags
--total-queued-requests-metric, --total-running-requests-metric,
--kv-cache-usage-percentage-metric and --cache-info-metric default to the names below), so the
engine also exports them: gauges with vLLM's labels `model_name` and `engine` (vLLM's engine
index, always "0" here), and `vllm:cache_config_info`, a gauge at 1 whose labels carry the
block size and the number of device blocks (the EPP's prefix-cache scorer sizes its index from
them). docs/gateway-api.md says what the EPP reads and why these names.

One reading of the engine per scrape feeds both names, so a scrape never shows the two
disagreeing. Before an engine is bound, the tokenmill gauges are plain gauges a caller may set
(a stand-in engine in tests) and the vLLM names are absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from tokenmill.engine.frontend.async_engine import AsyncEngine

WAITING = "tokenmill_num_requests_waiting"
RUNNING = "tokenmill_num_requests_running"
KV_USAGE = "tokenmill_kv_cache_usage_ratio"
SLEEPING = "tokenmill_engine_sleeping"  # with --enable-sleep-mode only
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction, 0 to 1, despite the name
VLLM_GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"  # its name before vLLM 0.9, read by older EPPs
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
VLLM_ENGINE = "0"  # vLLM's `engine` label: the index of its engine core; tokenmill has one
HELP = {WAITING: "Requests waiting to be scheduled.",
        RUNNING: "Sequences in the running batch.",
        KV_USAGE: "Fraction of KV-cache blocks in use."}


class LoadGauges:
    """A collector: waiting and running requests and KV-cache usage, read at scrape time (and
    with sleep mode whether the engine sleeps)."""

    def __init__(self, model_name: str, registry: CollectorRegistry, vllm_names: bool = True):
        self.model_name = model_name
        self.vllm_names = vllm_names
        labels = ["model_name"]
        # Not registered: collect() yields them, or the engine's reading in their place.
        self.waiting, self.running, self.kv_usage = (
            Gauge(name, HELP[name], labels, registry=None) for name in (WAITING, RUNNING, KV_USAGE))
        self._engine: AsyncEngine | None = None
        self._cache_config: dict[str, str] = {}
        registry.register(self)

    def bind(self, engine: AsyncEngine) -> None:
        config = engine.engine.config
        self._cache_config = {
            "block_size": str(config.block_size),
            "num_gpu_blocks": str(engine.engine.kv.allocator.num_blocks),
            "enable_prefix_caching": str(config.enable_prefix_caching),  # "True" as vLLM
            "engine": VLLM_ENGINE,
        }
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        if engine is None:
            for gauge in (self.waiting, self.running, self.kv_usage):
                yield from gauge.collect()
            return
        waiting = engine.num_waiting
        running = engine.engine.num_running
        usage = engine.engine.kv_cache_usage
        yield self._family(WAITING, HELP[WAITING], waiting)
        yield self._family(RUNNING, HELP[RUNNING], running)
        yield self._family(KV_USAGE, HELP[KV_USAGE], usage)
        if engine.engine.config.enable_sleep_mode:
            yield self._family(SLEEPING, "1 while sleep mode holds the engine (POST /sleep), "
                                         "0 awake.", float(engine.is_sleeping))
        if not self.vllm_names:
            return
        yield self._family(VLLM_WAITING, f"Alias of {WAITING} under vLLM's name.", waiting,
                           engine_label=True)
        yield self._family(VLLM_RUNNING, f"Alias of {RUNNING} under vLLM's name.", running,
                           engine_label=True)
        yield self._family(VLLM_KV_USAGE, f"Alias of {KV_USAGE} under vLLM's name (1 means "
                                          "100 percent usage).", usage, engine_label=True)
        yield self._family(VLLM_GPU_CACHE_USAGE, f"Alias of {KV_USAGE} under vLLM's name "
                                                 "before 0.9.", usage, engine_label=True)
        info = GaugeMetricFamily(VLLM_CACHE_CONFIG, "KV-cache configuration in the labels "
                                 "(vLLM's CacheConfig info); always 1.",
                                 labels=list(self._cache_config))
        info.add_metric(list(self._cache_config.values()), 1)
        yield info

    def _family(self, name: str, documentation: str, value: float,
                engine_label: bool = False) -> GaugeMetricFamily:
        labels = ["model_name", "engine"] if engine_label else ["model_name"]
        family = GaugeMetricFamily(name, documentation, labels=labels)
        family.add_metric([self.model_name, VLLM_ENGINE][:len(labels)], value)
        return family
