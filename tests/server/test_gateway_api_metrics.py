"""The engine as a model server of the Gateway API inference extension: its /metrics read the
way the extension's endpoint picker (EPP) reads a vLLM pod it was given no metric flags for.

`EndpointPicker` below is written from the EPP's model-server-protocol extractor
(kubernetes-sigs/gateway-api-inference-extension, pkg/epp/datalayer/metrics: spec.go,
extractor.go, loraspec.go, factories.go; docs/gateway-api.md cites them): the metric
specifications are its flag defaults, PromQL selectors whose labels (none by default) a series
must carry; a family must be present and typed gauge; of the matching series it takes the one
with the newest exposition timestamp (the first, without timestamps), except for the LoRA info,
where it takes the series with the largest value (the Unix time it was written); adapters are
the comma-separated label values, trimmed, empty ones dropped; `max_lora`, `block_size` and
`num_gpu_blocks` are integers in labels. Like Go's text parser, a second TYPE line for one name
fails the whole scrape.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from server_support import in_process_server, openai_client

from tokenmill.engine.bench.random_adapters import write_random_adapter
from tokenmill.engine.cli import build_parser
from tokenmill.engine.server.metrics import EngineMetrics

# The EPP's defaults: the values of its flags --total-queued-requests-metric,
# --total-running-requests-metric, --kv-cache-usage-percentage-metric, --lora-info-metric and
# --cache-info-metric (the same strings are the engineConfigs of its configuration file).
EPP_VLLM_SPECS = {
    "queued": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "lora": "vllm:lora_requests_info",
    "cache_info": "vllm:cache_config_info",
}
PROMPT = [101, 202, 303, 404, 505, 606, 707]
LONG = 300  # tokens the request on `sql` generates while the others wait


class ScrapeError(Exception):
    """What makes the EPP drop a scrape or one of its metrics."""


@dataclass
class Series:
    labels: dict[str, str]
    value: float
    timestamp_ms: int


@dataclass
class EndpointMetrics:
    """The fields of the EPP's per-endpoint metrics that the protocol's metrics fill."""

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0
    active_models: set[str] = field(default_factory=set)
    waiting_models: set[str] = field(default_factory=set)
    max_active_models: int = 0
    cache_block_size: int = 0
    cache_num_gpu_blocks: int = 0


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """A PromQL instant-vector selector, `name` or `name{label=value,...}`, quotes optional."""
    found = re.fullmatch(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*", spec)
    if not found:
        raise ValueError(f"not a metric specification: {spec!r}")
    labels = dict(re.findall(r'(\w+)\s*=\s*"?([^",}]*)"?', found[2] or ""))
    return found[1], {name: value.strip() for name, value in labels.items()}


def parse_exposition(text: str) -> dict[str, tuple[str, list[Series]]]:
    """{family name: (type, series)} of a text exposition (format 0.0.4)."""
    typed = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    repeated = {name for name in typed if typed.count(name) > 1}
    if repeated:
        raise ScrapeError(f"second TYPE line for {sorted(repeated)}")
    families = {}
    for family in text_string_to_metric_families(text):
        series = [Series(dict(s.labels), s.value,
                         int(s.timestamp * 1000) if s.timestamp is not None else 0)
                  for s in family.samples if s.name == family.name]
        families[family.name] = (family.type, series)
    return families


class EndpointPicker:
    def __init__(self, specs: dict[str, str]):
        self.specs = {role: parse_spec(spec) for role, spec in specs.items()}

    def extract(self, text: str) -> EndpointMetrics:
        families = parse_exposition(text)
        m = EndpointMetrics()
        m.waiting_queue_size = int(self._latest(families, "queued").value)
        m.running_requests_size = int(self._latest(families, "running").value)
        m.kv_cache_usage_percent = self._latest(families, "kv_usage").value
        lora = self._newest_by_value(families, "lora")
        m.active_models = _adapters(lora.labels.get("running_lora_adapters", ""))
        m.waiting_models = _adapters(lora.labels.get("waiting_lora_adapters", ""))
        m.max_active_models = int(lora.labels["max_lora"])
        info = self._latest(families, "cache_info")
        m.cache_block_size = int(info.labels["block_size"])
        m.cache_num_gpu_blocks = int(info.labels["num_gpu_blocks"])
        return m

    def _matching(self, families, role: str) -> list[Series]:
        name, labels = self.specs[role]
        if name not in families or not families[name][1]:
            raise ScrapeError(f"metric family {name!r} not found")
        kind, series = families[name]
        if kind != "gauge":
            raise ScrapeError(f"{name!r} is a {kind}, not a gauge")
        matching = [s for s in series if labels.items() <= s.labels.items()]
        if not matching:
            raise ScrapeError(f"no matching metric found for {name!r} with labels {labels}")
        return matching

    def _latest(self, families, role: str) -> Series:
        return self._first_largest(families, role, lambda s: s.timestamp_ms)

    def _newest_by_value(self, families, role: str) -> Series:
        return self._first_largest(families, role, lambda s: s.value)

    def _first_largest(self, families, role: str, key) -> Series:
        """The first matching series with the largest `key` (the EPP starts from -1)."""
        best, recent = None, -1
        for s in self._matching(families, role):
            if key(s) > recent:
                best, recent = s, key(s)
        return best


def _adapters(csv: str) -> set[str]:
    return {name.strip() for name in csv.split(",") if name.strip()}


def samples(text: str) -> dict[str, float]:
    """The value of each single-series family, by name."""
    return {name: series[0].value for name, (_, series) in parse_exposition(text).items()
            if len(series) == 1}


# The parser first, on vLLM's own exposition (as vLLM 0.10 writes it: a lora_requests_info
# series stays for every label set it ever had).

VLLM_EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.42
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="b, c",waiting_lora_adapters="d"} 1.71e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.705e9
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0
"""


def test_the_parser_reads_vllms_exposition_as_the_epp_does():
    m = EndpointPicker(EPP_VLLM_SPECS).extract(VLLM_EXPOSITION)
    assert (m.waiting_queue_size, m.running_requests_size) == (5, 3)
    assert m.kv_cache_usage_percent == 0.42
    # The newest lora_requests_info series by value, wherever it is in the family.
    assert m.active_models == {"b", "c"} and m.waiting_models == {"d"}
    assert m.max_active_models == 4
    assert (m.cache_block_size, m.cache_num_gpu_blocks) == (16, 2048)


def test_the_parser_fails_where_the_epp_does():
    picker = EndpointPicker(EPP_VLLM_SPECS)
    with pytest.raises(ScrapeError, match="not found"):
        picker.extract(VLLM_EXPOSITION.replace("vllm:num_requests_waiting", "tm_waiting"))
    with pytest.raises(ScrapeError, match="not a gauge"):
        picker.extract(VLLM_EXPOSITION.replace("num_requests_running gauge",
                                               "num_requests_running untyped"))
    with pytest.raises(ScrapeError, match="second TYPE"):
        picker.extract(VLLM_EXPOSITION + "# TYPE vllm:kv_cache_usage_perc gauge\n")
    labelled = EndpointPicker({**EPP_VLLM_SPECS, "queued": "vllm:num_requests_waiting{engine=1}"})
    with pytest.raises(ScrapeError, match="no matching"):
        labelled.extract(VLLM_EXPOSITION)


# Then the engine, serving two adapters with one adapter slot: a long request on `sql` runs
# while two on `chat` wait for the slot.

@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    root = tmp_path_factory.mktemp("adapters")
    modules = [f"{name}={write_random_adapter(str(root / name), config, 4, seed, std=0.5)}"
               for seed, name in enumerate(("sql", "chat"))]
    with in_process_server(tiny_llama_dir, "tiny", kv_cache_memory=16 << 20, max_model_len=512,
                           enable_lora=True, lora_modules=modules, max_loras=1) as server:
        yield server


def _scrape(server) -> str:
    return httpx.get(f"{server.url}/metrics", timeout=10).text


def test_an_unconfigured_epp_reads_waiting_running_kv_and_adapters(server):
    client = openai_client(f"{server.url}/v1")
    picker = EndpointPicker(EPP_VLLM_SPECS)
    idle = picker.extract(_scrape(server))
    allocator = server.state.engine.engine.kv.allocator
    assert (idle.waiting_queue_size, idle.running_requests_size) == (0, 0)
    assert idle.kv_cache_usage_percent == 0
    assert idle.max_active_models == 1
    assert (idle.cache_block_size, idle.cache_num_gpu_blocks) == (16, allocator.num_blocks)

    first_chunk = threading.Event()
    failures: list[BaseException] = []

    def run(model: str, max_tokens: int, stream: bool) -> None:
        try:
            out = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                            temperature=0, stream=stream,
                                            extra_body={"ignore_eos": True})
            for _ in out if stream else ():
                first_chunk.set()
        except BaseException as exc:  # reported in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=("sql", LONG, True))]
    threads[0].start()
    assert first_chunk.wait(60), failures
    threads += [threading.Thread(target=run, args=("chat", 4, False)) for _ in range(2)]
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 60
    while True:  # until both chat requests are queued behind the slot `sql` holds
        text = _scrape(server)
        busy = picker.extract(text)
        if busy.waiting_queue_size == 2:
            break
        assert time.monotonic() < deadline and threads[0].is_alive(), busy
        time.sleep(0.02)
    assert busy.running_requests_size == 1
    assert 0 < busy.kv_cache_usage_percent < 1
    assert busy.active_models == {"sql"} and busy.waiting_models == {"chat"}
    # The aliases are tokenmill's own values, from the same scrape.
    own = samples(text)
    assert own["tokenmill_num_requests_waiting"] == busy.waiting_queue_size
    assert own["tokenmill_num_requests_running"] == busy.running_requests_size
    assert own["tokenmill_kv_cache_usage_ratio"] == busy.kv_cache_usage_percent
    assert own["vllm:gpu_cache_usage_perc"] == busy.kv_cache_usage_percent
    [info] = [s for s in parse_exposition(text)["tokenmill_lora_requests_info"][1]]
    assert info.labels == {"running_lora_adapters": "sql", "waiting_lora_adapters": "chat",
                           "max_lora": "1"}

    for thread in threads:
        thread.join(timeout=120)
    assert not failures
    after = picker.extract(_scrape(server))
    assert (after.waiting_queue_size, after.running_requests_size) == (0, 0)
    assert after.kv_cache_usage_percent == 0


def test_vllms_label_sets_and_types(server):
    families = parse_exposition(_scrape(server))
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        kind, [series] = families[name]
        assert kind == "gauge" and series.labels == {"model_name": "tiny", "engine": "0"}
    kind, [info] = families["vllm:cache_config_info"]
    assert kind == "gauge" and info.value == 1
    blocks = server.state.engine.engine.kv.allocator.num_blocks
    assert info.labels == {"block_size": "16", "engine": "0", "enable_prefix_caching": "True",
                           "num_gpu_blocks": str(blocks)}
    kind, [lora] = families["vllm:lora_requests_info"]
    assert kind == "gauge" and lora.value > 1.7e9  # a Unix time
    assert set(lora.labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}


def test_without_vllm_metrics_only_tokenmills_names(server):
    metrics = EngineMetrics("tiny", vllm_names=False)
    metrics.bind(server.state.engine)
    text = generate_latest(metrics.registry).decode()
    assert "vllm:" not in text
    assert {"tokenmill_num_requests_waiting", "tokenmill_lora_requests_info"} <= set(
        parse_exposition(text))
    serve = ["serve", "--model", "m"]
    assert build_parser().parse_args(serve).vllm_metrics is True
    assert build_parser().parse_args([*serve, "--no-vllm-metrics"]).vllm_metrics is False


def _series(family) -> dict[tuple[str, frozenset], float]:
    """(sample suffix, labels but vLLM's engine) -> value, of one family."""
    return {(s.name[len(family.name):], frozenset((k, v) for k, v in s.labels.items()
                                                  if k != "engine")): s.value
            for s in family.samples}


def test_serving_counters_and_histograms_under_vllms_names(server):
    """vLLM's dashboards and autoscaling queries (`vllm:prompt_tokens_total`,
    `vllm:time_to_first_token_seconds_bucket`, ...) read the same series as tokenmill's names,
    from the same reading, with vLLM's `engine` label."""
    from tokenmill.engine.server.vllm_aliases import ALIASES

    def found(text: str) -> dict[str, float]:
        return {s.name: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if not s.labels.get("le")}

    before = found(_scrape(server))
    usage = openai_client(f"{server.url}/v1").completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3).usage
    text = _scrape(server)
    grew = {name: value - before.get(name, 0) for name, value in found(text).items()}
    assert grew["vllm:request_prompt_tokens_sum"] == usage.prompt_tokens == len(PROMPT)
    assert grew["vllm:request_generation_tokens_sum"] == usage.completion_tokens
    phases = ("prefill", "decode", "inference")
    assert all(grew[f"vllm:request_{p}_time_seconds_count"] == 1 for p in phases)
    prefill, decode, inference = (grew[f"vllm:request_{p}_time_seconds_sum"] for p in phases)
    assert prefill > 0 and decode >= 0 and inference == pytest.approx(prefill + decode)
    queue, e2e = (grew[f"vllm:{n}_seconds_sum"] for n in ("request_queue_time",
                                                          "e2e_request_latency"))
    assert e2e == pytest.approx(queue + inference)
    parse_exposition(text)  # one TYPE line per name: a repeated one fails a real scrape
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for ours, theirs in ALIASES.items():
        for alias in theirs:
            assert families[alias].type == families[ours].type, alias
            assert _series(families[alias]) == _series(families[ours]), alias
            assert all(s.labels["engine"] == "0" for s in families[alias].samples), alias
    prompt = {s.name: s.value for s in families["vllm:prompt_tokens"].samples}
    assert prompt["vllm:prompt_tokens_total"] >= len(PROMPT)
    success = [s for s in families["vllm:request_success"].samples
               if s.name == "vllm:request_success_total"]
    assert sum(s.value for s in success) >= 1
    ttft = {s.name: s.value for s in families["vllm:time_to_first_token_seconds"].samples}
    assert ttft["vllm:time_to_first_token_seconds_count"] >= 1
