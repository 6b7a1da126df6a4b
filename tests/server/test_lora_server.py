"""LoRA adapters over HTTP, driven by the official openai client: `model` selects the base or an
adapter (its output is the engine's for that adapter), /v1/models lists them with their parent,
unknown names are 404s in OpenAI's shape, and with --allow-runtime-lora-updating adapters are
loaded and unloaded while other requests keep streaming."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_support import in_process_server, openai_client

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.random_adapters import write_random_adapter

PROMPT = [101, 202, 303, 404, 505, 606, 707]
MAX_NEW = 8
KEY = "tm-lora-key-0123456789"
LONG = 400  # tokens of the request that streams while adapters come and go


def _adapter(tiny_llama_dir: str, directory, seed: int, rank: int = 4) -> str:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    # Large enough values that each adapter changes the tiny model's greedy tokens.
    return write_random_adapter(str(directory / f"adapter-{seed}"), config, rank, seed, std=0.5)


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: _adapter(tiny_llama_dir, root, seed) for seed, name in
            enumerate(("sql", "chat", "late"))}


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, adapters) -> dict[str | None, str]:
    """The offline engine's greedy text for the prompt on the base and on each adapter."""
    modules = [f"{name}={path}" for name, path in adapters.items()]
    with LLM(tiny_llama_dir, show_progress=False, kv_cache_memory=16 << 20, enable_lora=True,
             lora_modules=modules, max_loras=2) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        return {name: llm.generate([PROMPT], params, lora=name)[0].outputs[0].text
                for name in (None, *adapters)}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, adapters):
    modules = [f"{name}={adapters[name]}" for name in ("sql", "chat")]
    with in_process_server(tiny_llama_dir, "tiny", options={"api_key": KEY},
                           kv_cache_memory=16 << 20, max_model_len=512, enable_lora=True,
                           lora_modules=modules, max_loras=2,
                           allow_runtime_lora_updating=True) as server:
        yield server


def _client(server) -> openai.OpenAI:
    return openai_client(f"{server.url}/v1", KEY)


def _tokens(client: openai.OpenAI, model: str) -> str:
    """The server's greedy text for the prompt on `model` (the name the reply carries too)."""
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_NEW,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.model == model
    return out.choices[0].text


def test_model_selects_the_adapter(server, expected):
    assert len(set(expected.values())) == len(expected)  # each adapter changes the output
    client = _client(server)
    assert _tokens(client, "tiny") == expected[None]
    assert _tokens(client, "sql") == expected["sql"]
    assert _tokens(client, "chat") == expected["chat"]


def test_models_lists_the_adapters_with_their_parent(server, adapters):
    cards = {m.id: m for m in _client(server).models.list()}
    assert set(cards) >= {"tiny", "sql", "chat"}
    assert cards["sql"].parent == "tiny" and cards["sql"].root == adapters["sql"]
    assert cards["tiny"].parent is None
    retrieved = _client(server).models.retrieve("sql")
    assert retrieved.model_dump() == cards["sql"].model_dump()


def test_an_unknown_model_is_a_404_in_openai_shape(server):
    with pytest.raises(openai.NotFoundError) as info:
        _client(server).chat.completions.create(
            model="nope", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert info.value.body["code"] == "model_not_found"
    assert info.value.body["param"] == "model" and "'nope'" in info.value.body["message"]


def _post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def test_runtime_load_and_unload_while_other_requests_stream(server, adapters, expected):
    client = _client(server)
    streamed: list[str] = []
    usage: list[int] = []
    failures: list[BaseException] = []
    first_chunk = threading.Event()

    def stream_on_sql() -> None:
        try:
            for chunk in client.completions.create(model="sql", prompt=PROMPT, max_tokens=LONG,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}):
                streamed.extend(c.text for c in chunk.choices)
                first_chunk.set()
                if chunk.usage is not None:
                    usage.append(chunk.usage.completion_tokens)
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    streaming = threading.Thread(target=stream_on_sql)
    streaming.start()
    assert first_chunk.wait(60)
    load = _post(server, "/v1/load_lora_adapter", {"lora_name": "late",
                                                   "lora_path": adapters["late"]})
    assert load.status_code == 200, load.text
    assert not usage  # loaded while the stream was still going
    assert "late" in {m.id for m in client.models.list()}
    assert _tokens(client, "late") == expected["late"]
    unload = _post(server, "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert unload.status_code == 200, unload.text
    streaming.join(timeout=120)
    assert not failures and usage == [LONG] and len(streamed) > 10
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="late", prompt=PROMPT, max_tokens=2)
    assert _tokens(client, "sql") == expected["sql"]  # the server kept serving


def test_a_slow_adapter_download_does_not_stall_the_streams(server, adapters, monkeypatch):
    """The download of an hf:// or s3:// adapter (here a local one that takes 3 s to fetch)
    runs off the engine loop: a stream goes on producing tokens meanwhile."""
    import time

    from tokenmill.engine.core import lora_registry

    def slow_fetch(path: str, download_dir: str | None) -> str:
        time.sleep(3.0)
        return adapters["late"]

    monkeypatch.setattr(lora_registry, "fetch_model", slow_fetch)
    client = _client(server)
    arrivals: list[float] = []
    started = threading.Event()

    def stream() -> None:
        for _ in client.completions.create(model="sql", prompt=PROMPT, max_tokens=LONG,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True}):
            arrivals.append(time.monotonic())
            started.set()

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert started.wait(60)
    began = time.monotonic()
    load = _post(server, "/v1/load_lora_adapter", {"lora_name": "slow",
                                                   "lora_path": "s3://adapters/slow"})
    ended = time.monotonic()
    streaming.join(timeout=120)
    assert load.status_code == 200, load.text
    assert ended - began >= 3.0
    during = [t for t in arrivals if began + 0.2 < t < began + 1.5]
    assert len(during) > 5, (len(arrivals), ended - began)  # tokens came while it fetched
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "slow"}).status_code == 200


def test_bad_runtime_requests_are_clear_errors(server, adapters, tmp_path):
    missing = _post(server, "/v1/load_lora_adapter", {"lora_name": "ghost",
                                                      "lora_path": str(tmp_path / "none")})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "lora_path"
    twice = _post(server, "/v1/load_lora_adapter", {"lora_name": "sql",
                                                    "lora_path": adapters["sql"]})
    assert twice.status_code == 400 and "sql" in twice.json()["error"]["message"]
    base = _post(server, "/v1/load_lora_adapter", {"lora_name": "tiny",
                                                   "lora_path": adapters["sql"]})
    assert base.status_code == 400
    unknown = _post(server, "/v1/unload_lora_adapter", {"lora_name": "ghost"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/x"},
                 key=None).status_code == 401
    assert {m.id for m in _client(server).models.list()} == {"tiny", "sql", "chat"}


def test_metrics_say_which_adapters_are_loaded_and_running(server):
    _tokens(_client(server), "chat")
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    loaded = {s.labels["adapter"] for s in samples if s.name == "tokenmill_lora_adapter_info"}
    assert loaded == {"sql", "chat"}
    [info] = [s for s in samples if s.name == "tokenmill_lora_requests_info"]
    assert info.labels["max_lora"] == "2" and info.value > 1.7e9  # a Unix time
    assert set(info.labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}


def test_without_the_flag_there_are_no_runtime_routes(tiny_llama_dir, adapters):
    modules = [f"sql={adapters['sql']}"]
    with in_process_server(tiny_llama_dir, "tiny", kv_cache_memory=16 << 20,
                           max_model_len=128, enable_lora=True, lora_modules=modules) as server:
        response = _post(server, "/v1/load_lora_adapter",
                         {"lora_name": "late", "lora_path": adapters["late"]}, key=None)
        assert response.status_code == 404
        assert {m.id for m in openai_client(f"{server.url}/v1").models.list()} == {"tiny",
                                                                                   "sql"}


def test_an_adapter_that_cannot_load_ends_start_up_with_the_line_the_operator_reads(
        tiny_llama_dir, adapters, tmp_path):
    from server_support import ServeProcess

    from tokenmill.engine.contract.lora import STARTUP_FAILURE

    code, stderr = ServeProcess(tiny_llama_dir, "--enable-lora", "--lora-modules",
                                f"sql={adapters['sql']}", f"broken={tmp_path}").finish()
    assert code == 1, stderr
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    found = STARTUP_FAILURE.search(last)
    assert found and found["name"] == "broken", last
    assert "adapter_config.json" in found["reason"] and not found["reason"].endswith('"')


def test_an_adapter_from_the_hub_serves_as_the_same_adapter_from_a_directory(
        tiny_llama_dir, adapters, expected, tmp_path):
    """`--lora-modules chat=hf://ORG/NAME` is fetched as models are (here from an offline hub
    cache in --download-dir, with no hub reachable) and answers as the local copy does."""
    from server_support import ServeProcess
    from store_support import write_hub_cache

    cache = str(tmp_path / "hub")
    write_hub_cache(cache, "tokenmill-test/chat-adapter", adapters["chat"])
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing answers there
    proc = ServeProcess(tiny_llama_dir, "--served-model-name", "tiny", "--enable-lora",
                        "--lora-modules", "chat=hf://tokenmill-test/chat-adapter",
                        "--download-dir", cache, "--kv-cache-memory", str(16 << 20), env=env)
    try:
        proc.wait_healthy(180)
        client = openai_client(f"{proc.url}/v1")
        assert {(m.id, getattr(m, "parent", None)) for m in client.models.list()} == {
            ("tiny", None), ("chat", "tiny")}
        assert _tokens(client, "chat") == expected["chat"]
    finally:
        proc.kill()
        proc.wait()
