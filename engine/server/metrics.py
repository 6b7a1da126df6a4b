"""Prometheus metrics of a serving engine, named like vLLM's so dashboards carry over.

The load gauges (waiting, running, KV-cache usage) are read from the engine at scrape time, so
the waiting-queue gauge the operator autoscales on is exact at every scrape. With `vllm_names`
they, the LoRA batch info and the cache configuration are also exported under the vLLM names
that the Gateway API inference extension's endpoint picker reads (load_gauges.py), and the
counters and histograms under vLLM's names too (vllm_aliases.py). Counters and histograms are
fed after each engine step from the outputs of that step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tokenmill.engine.core import RequestOutput
from tokenmill.engine.server.load_gauges import LoadGauges
from tokenmill.engine.server.lora_metrics import LoRAMetrics
from tokenmill.engine.server.vllm_aliases import VLLMAliases

if TYPE_CHECKING:
    from tokenmill.engine.core import LLMEngine
    from tokenmill.engine.frontend.async_engine import AsyncEngine

RESUME_SOURCES = ("device", "host", "recomputed")  # fields of scheduler.ResumedTokens
# Tokens per request: 1, 2, 5, 10, 20, 50, ... as vLLM's request_prompt_tokens buckets.
TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(7) for m in (1, 2, 5))
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)


class EngineMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry | None = None,
                 vllm_names: bool = True):
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        # The gauges routers and the autoscaler read, with vLLM's names beside (load_gauges.py).
        self.load = LoadGauges(model_name, r, vllm_names)
        self.waiting, self.running, self.kv_usage = (self.load.waiting, self.load.running,
                                                     self.load.kv_usage)
        # What quantization buys: set once the model is loaded.
        self.weights_bytes = Gauge("tokenmill_model_weights_bytes",
                                   "Bytes of the model's weights in device memory.", labels,
                                   registry=r)
        # What start-up took (rank 0's shard under tensor parallelism): set once.
        self.download_seconds = Gauge("tokenmill_model_download_seconds",
                                      "Seconds fetching the model from its store (hf://, "
                                      "s3://); 0 for a local model.", labels, registry=r)
        self.load_seconds = Gauge("tokenmill_model_load_seconds",
                                  "Seconds loading the weights into memory.", labels,
                                  registry=r)
        self.load_bytes = Gauge("tokenmill_model_load_bytes",
                                "Checkpoint bytes read while loading the weights.", labels,
                                registry=r)
        self.load_rate = Gauge("tokenmill_model_load_bytes_per_second",
                               "Checkpoint bytes read per second while loading the weights.",
                               labels, registry=r)
        self.kv_capacity = Gauge("tokenmill_kv_cache_capacity_tokens",
                                 "Tokens the KV-cache pool holds.", labels, registry=r)
        self.kv_tokens_per_gib = Gauge("tokenmill_kv_cache_tokens_per_gib",
                                       "Tokens one GiB of KV-cache memory holds (with the "
                                       "KV-cache dtype's scales).", labels, registry=r)
        self.prompt_tokens = Counter("tokenmill_prompt_tokens",
                                     "Prompt tokens of admitted requests.", labels, registry=r)
        self.generation_tokens = Counter("tokenmill_generation_tokens",
                                         "Generated tokens.", labels, registry=r)
        self.preemptions = Counter("tokenmill_num_preemptions",
                                   "Sequences preempted (KV freed, requeued).", labels,
                                   registry=r)
        self.preempted_tokens = Counter("tokenmill_preempted_tokens",
                                        "Tokens preempted sequences had computed, by where "
                                        "they came from at readmission: the device's prefix "
                                        "cache, the host tier, or computed again.",
                                        labels + ["source"], registry=r)
        self.prefix_queries = Counter("tokenmill_prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.", labels,
                                      registry=r)
        self.prefix_hits = Counter("tokenmill_prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache.", labels, registry=r)
        # The host tier (--kv-offloading-size): where prefix hits came from, what moved.
        self.offload_hits = Counter("tokenmill_kv_offload_prefix_hits",
                                    "Prompt tokens found in the prefix cache, by tier (device, "
                                    "host).", labels + ["tier"], registry=r)
        self.offload_bytes = Counter("tokenmill_kv_offload_bytes",
                                     "Bytes of KV blocks copied between the tiers, summed over "
                                     "tensor-parallel ranks, by direction (to_host, to_device).",
                                     labels + ["direction"], registry=r)
        self.offload_usage = Gauge("tokenmill_kv_offload_host_usage_ratio",
                                   "Fraction of the host tier's blocks holding evicted prefix "
                                   "blocks (0 without a host tier).", labels, registry=r)
        self.offload_capacity = Gauge("tokenmill_kv_offload_host_capacity_tokens",
                                      "Tokens the host tier holds (0: no host tier).", labels,
                                      registry=r)
        # Speculative decoding (--speculative-config), with vLLM's meanings: a draft is one
        # sequence's proposals in one step; acceptance rate = accepted / draft tokens, mean
        # accepted length = 1 + accepted / drafts.
        self.spec_drafts = Counter("tokenmill_spec_decode_num_drafts",
                                   "Drafts verified: one sequence's proposals in one step.",
                                   labels, registry=r)
        self.spec_draft_tokens = Counter("tokenmill_spec_decode_num_draft_tokens",
                                         "Proposed tokens verified.", labels, registry=r)
        self.spec_accepted = Counter("tokenmill_spec_decode_num_accepted_tokens",
                                     "Proposed tokens accepted.", labels, registry=r)
        self.spec_accepted_per_pos = Counter(
            "tokenmill_spec_decode_num_accepted_tokens_per_pos",
            "Proposed tokens accepted, by their position in the draft (0: first).",
            labels + ["position"], registry=r)
        self.success = Counter("tokenmill_request_success", "Finished requests.",
                               labels + ["finished_reason"], registry=r)
        self.ttft = self._histogram("tokenmill_time_to_first_token_seconds",
                                    "Time to first token.")
        self.itl = self._histogram("tokenmill_inter_token_latency_seconds",
                                   "Time between consecutive tokens of a sequence.")
        self.e2e = self._histogram("tokenmill_e2e_request_latency_seconds",
                                   "Arrival to last token.")
        self.queue_time = self._histogram("tokenmill_request_queue_time_seconds",
                                          "Arrival to first scheduling.")
        # A request's time once scheduled: to its first token, after it, and in all.
        self.prefill_time = self._histogram("tokenmill_request_prefill_time_seconds",
                                            "First scheduling to first token.")
        self.decode_time = self._histogram("tokenmill_request_decode_time_seconds",
                                           "First token to last token.")
        self.inference_time = self._histogram("tokenmill_request_inference_time_seconds",
                                              "First scheduling to last token.")
        self.request_prompt_tokens = self._histogram(
            "tokenmill_request_prompt_tokens", "Prompt tokens of each finished request.",
            TOKEN_BUCKETS)
        self.request_generation_tokens = self._histogram(
            "tokenmill_request_generation_tokens",
            "Generated tokens of each finished request, all its sequences.", TOKEN_BUCKETS)
        # Every series exists from the first scrape, at zero.
        for metric in (self.spec_drafts, self.spec_draft_tokens, self.spec_accepted):
            metric.labels(model_name)
        for metric in (self.prompt_tokens, self.generation_tokens, self.preemptions,
                       self.prefix_queries, self.prefix_hits, self.ttft, self.itl, self.e2e,
                       self.queue_time, self.prefill_time, self.decode_time,
                       self.inference_time, self.request_prompt_tokens,
                       self.request_generation_tokens):
            metric.labels(model_name)
        for tier in ("device", "host"):
            self.offload_hits.labels(model_name, tier)
        for direction in ("to_host", "to_device"):
            self.offload_bytes.labels(model_name, direction)
        for source in RESUME_SOURCES:
            self.preempted_tokens.labels(model_name, source)
        self.lora = LoRAMetrics(model_name, r, vllm_names)
        if vllm_names:
            VLLMAliases([self.prompt_tokens, self.generation_tokens, self.preemptions,
                         self.prefix_queries, self.prefix_hits, self.success, self.ttft,
                         self.itl, self.e2e, self.queue_time, self.prefill_time,
                         self.decode_time, self.inference_time, self.request_prompt_tokens,
                         self.request_generation_tokens, self.spec_drafts,
                         self.spec_draft_tokens, self.spec_accepted,
                         self.spec_accepted_per_pos], r)
        # The series every step updates, looked up once (labels() takes a lock and a lookup).
        self._step_generation_tokens = self.generation_tokens.labels(model_name)
        self._step_itl = self.itl.labels(model_name)
        self._seen: dict[str, int] = {}
        self._last_token: dict[tuple[str, int], tuple[float, int]] = {}
        self._started: set[str] = set()

    def _histogram(self, name: str, documentation: str,
                   buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
        return Histogram(name, documentation, ["model_name"], buckets=buckets,
                         registry=self.registry)

    def bind(self, engine: AsyncEngine) -> None:
        """Read the gauges from this engine at every scrape."""
        name = self.model_name
        self.load.bind(engine)
        memory = engine.engine.memory_report()
        self.weights_bytes.labels(name).set(memory["weights_bytes"])
        self.kv_capacity.labels(name).set(memory["kv_capacity_tokens"])
        if memory["kv_tokens_per_gib"] is not None:  # None: no KV cache (an encoder)
            self.kv_tokens_per_gib.labels(name).set(memory["kv_tokens_per_gib"])
        load = engine.engine.load_report()
        self.download_seconds.labels(name).set(load["download_seconds"])
        self.load_seconds.labels(name).set(load["load_seconds"])
        self.load_bytes.labels(name).set(load["load_bytes"])
        self.load_rate.labels(name).set(load["load_gb_per_s"] * 1e9)
        self.lora.bind(engine)

    def observe_step(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """Account a step (called on the engine thread after every step, and after an abort):
        the tokens of the requests that advanced, whatever output they asked for
        (LLMEngine.last_advanced), and the requests that finished."""
        name = self.model_name
        now = time.monotonic()
        self._advance(self.preemptions, "preemptions", engine.scheduler.num_preemptions)
        self._advance(self.prefix_queries, "prefix_queries", engine.kv.prefix_queries)
        self._advance(self.prefix_hits, "prefix_hits", engine.kv.prefix_hits)
        self._observe_offload(engine)
        self._observe_speculation(engine)
        self.lora.observe_step(engine)
        resumed = engine.scheduler.resumed_tokens
        for source in RESUME_SOURCES:
            self._advance(self.preempted_tokens, f"preempted_{source}",
                          getattr(resumed, source), source)
        generated = 0
        for req in engine.last_advanced:
            if req.request_id not in self._started:
                self._started.add(req.request_id)
                self.prompt_tokens.labels(name).inc(len(req.prompt_token_ids))
                if req.timings.queue_time is not None:
                    self.queue_time.labels(name).observe(req.timings.queue_time)
                if req.timings.time_to_first_token is not None:
                    self.ttft.labels(name).observe(req.timings.time_to_first_token)
            for seq in req.seqs:  # less a token still on the device (async scheduling)
                held = len(seq.output_token_ids) - seq.awaits_token
                generated += self._count_tokens(req.request_id, seq.index, held, now)
        for out in outputs:
            if out.finished:
                self._finish(out)
        if generated:
            self._step_generation_tokens.inc(generated)

    def _observe_speculation(self, engine: LLMEngine) -> None:
        stats = engine.speculation_stats
        self._advance(self.spec_drafts, "spec_drafts", stats.num_drafts)
        self._advance(self.spec_draft_tokens, "spec_draft_tokens", stats.num_draft_tokens)
        self._advance(self.spec_accepted, "spec_accepted", stats.num_accepted_tokens)
        for position, count in enumerate(stats.accepted_per_position):
            self.spec_accepted_per_pos.labels(self.model_name, str(position))  # from 0
            self._advance(self.spec_accepted_per_pos, f"spec_accepted_{position}", count,
                          str(position))

    def _observe_offload(self, engine: LLMEngine) -> None:
        kv = engine.kv
        self._advance(self.offload_hits, "hits_device", kv.prefix_hits - kv.host_prefix_hits,
                      "device")
        self._advance(self.offload_hits, "hits_host", kv.host_prefix_hits, "host")
        host = kv.host
        if host is None:
            return
        block_bytes = engine.offload_block_bytes
        self._advance(self.offload_bytes, "to_host", host.blocks_offloaded * block_bytes,
                      "to_host")
        self._advance(self.offload_bytes, "to_device", host.blocks_loaded * block_bytes,
                      "to_device")
        self.offload_usage.labels(self.model_name).set(host.num_used / host.num_blocks)
        self.offload_capacity.labels(self.model_name).set(host.num_blocks * kv.block_size)

    def _advance(self, counter: Counter, key: str, total: int, *labels: str) -> None:
        """Move a counter up to an engine-side running total."""
        seen = self._seen.get(key, 0)
        if total > seen:
            counter.labels(self.model_name, *labels).inc(total - seen)
            self._seen[key] = total

    def _count_tokens(self, request_id: str, index: int, count: int, now: float) -> int:
        """Observe a sequence's inter-token latency; return how many tokens it added."""
        key = (request_id, index)
        last_time, last_count = self._last_token.get(key, (None, 0))
        if count <= last_count:
            return 0
        if last_time is not None:
            self._step_itl.observe((now - last_time) / (count - last_count))
        self._last_token[key] = (now, count)
        return count - last_count

    def _observe_phases(self, out: RequestOutput) -> None:
        """Prefill, decode and inference time of a request that was scheduled and answered."""
        timings = out.timings
        phases = timings.prefill_time, timings.decode_time, timings.inference_time
        if None in phases:
            return
        name = self.model_name
        for histogram, seconds in zip((self.prefill_time, self.decode_time,
                                       self.inference_time), phases, strict=True):
            histogram.labels(name).observe(seconds)

    def _finish(self, out: RequestOutput) -> None:
        name = self.model_name
        generated = sum(self._last_token.pop((out.request_id, completion.index), (0, 0))[1]
                        for completion in out.outputs)
        if out.request_id in self._started:  # admitted: it has a prompt it was counted for
            self.request_prompt_tokens.labels(name).observe(out.num_prompt_tokens)
            self.request_generation_tokens.labels(name).observe(generated)
        self._started.discard(out.request_id)
        reason = out.outputs[0].finish_reason if out.outputs else "abort"
        self.success.labels(name, reason or "abort").inc()
        if out.timings.e2e_latency is not None:
            self.e2e.labels(name).observe(out.timings.e2e_latency)
        self._observe_phases(out)
