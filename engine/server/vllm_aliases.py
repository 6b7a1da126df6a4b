"""The serving counters and histograms under vLLM's names too, so vLLM's dashboards and alerts
(its Grafana board, KEDA or HPA queries on `vllm:*`) read a tokenmill server unchanged.

A collector in the place of the tokenmill metrics it aliases: at every scrape it reads each of
them once and yields the family, then the same samples renamed and with vLLM's `engine` label
(its engine core's index, always "0" here). One reading feeds both names, so a scrape never
shows them disagreeing while the engine steps, and nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tokenmill.engine.server.load_gauges import VLLM_ENGINE

# tokenmill family -> vLLM's names for the same series (counters without `_total`, as the
# client names families). vLLM renamed its time per output token to inter-token latency and
# keeps the old name for older dashboards; both are given.
ALIASES = {
    "tokenmill_prompt_tokens": ("vllm:prompt_tokens",),
    "tokenmill_generation_tokens": ("vllm:generation_tokens",),
    "tokenmill_num_preemptions": ("vllm:num_preemptions",),
    "tokenmill_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "tokenmill_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "tokenmill_request_success": ("vllm:request_success",),
    "tokenmill_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "tokenmill_inter_token_latency_seconds": ("vllm:inter_token_latency_seconds",
                                              "vllm:time_per_output_token_seconds"),
    "tokenmill_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "tokenmill_request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "tokenmill_request_prefill_time_seconds": ("vllm:request_prefill_time_seconds",),
    "tokenmill_request_decode_time_seconds": ("vllm:request_decode_time_seconds",),
    "tokenmill_request_inference_time_seconds": ("vllm:request_inference_time_seconds",),
    "tokenmill_request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "tokenmill_request_generation_tokens": ("vllm:request_generation_tokens",),
    "tokenmill_spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "tokenmill_spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "tokenmill_spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
    "tokenmill_spec_decode_num_accepted_tokens_per_pos": (
        "vllm:spec_decode_num_accepted_tokens_per_pos",),
}


class VLLMAliases(Collector):
    """Takes the place of `sources` (metrics of ALIASES) in `registry`: yields each family
    under its own name and under vLLM's."""

    def __init__(self, sources: list[Collector], registry: CollectorRegistry):
        self.sources = sources
        for source in sources:
            registry.unregister(source)
        registry.register(self)

    def describe(self) -> list[Metric]:
        return []  # collected at each scrape: the registry checks no names up front

    def collect(self) -> Iterator[Metric]:
        for family in (f for source in self.sources for f in source.collect()):
            yield family
            for alias in ALIASES.get(family.name, ()):
                renamed = Metric(alias, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    renamed.add_sample(alias + sample.name[len(family.name):],
                                       {**sample.labels, "engine": VLLM_ENGINE}, sample.value,
                                       sample.timestamp, sample.exemplar)
                yield renamed
