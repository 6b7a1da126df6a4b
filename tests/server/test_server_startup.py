"""A server that can never serve exits non-zero with its reason; a loading one answers 503."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import socket
import time

import httpx
import pytest
from server_support import ServeProcess, running_server, server_state


def _broken(kind: str, directory, tiny_llama_dir: str) -> str:
    """A model directory that cannot load, of this kind (or a path, or the tiny model)."""
    if kind == "bad-gguf":
        (directory / "model.gguf").write_bytes(b"not a gguf file at all")
    elif kind in ("bad-json", "no-model-type"):
        (directory / "config.json").write_text('{"model_type": "llama",' if kind == "bad-json"
                                               else "{}")
    elif kind == "bad-weights":  # the tiny model's config and tokenizer, garbage weights
        shutil.copytree(tiny_llama_dir, directory, dirs_exist_ok=True)
        (directory / "model.safetensors").write_bytes(b"\x00" * 64)
    return {"tiny": tiny_llama_dir, "/nonexistent": kind}.get(kind, str(directory))


# One failure before the weights, one in them, one after them: each exits 1 naming it.
@pytest.mark.parametrize("model,flags,reason", [
    ("/nonexistent", [], "model '/nonexistent' not found"),
    ("bad-weights", [], "cannot read the weights in"),
    ("tiny", ["--kv-cache-memory", "200K", "--max-model-len", "1k"],
     "max_model_len: 1000 tokens do not fit the KV-cache pool"),
])
def test_a_model_that_cannot_load_exits_1_with_the_reason(tmp_path, tiny_llama_dir, model,
                                                          flags, reason):
    model = _broken(model, tmp_path, tiny_llama_dir)
    start = time.monotonic()
    code, stderr = ServeProcess(model, *flags).finish()
    # Seconds on a busy two-core machine (a start-up that fails takes its imports' time);
    # one that retried or waited would reach finish()'s 60-second kill.
    assert time.monotonic() - start < 45, "a model that can't load must fail fast"
    assert code == 1, stderr
    line = next(line for line in stderr.splitlines() if "model failed to load" in line)
    assert reason in line and "level=error" in line
    assert "Traceback" not in stderr  # the option or path says it all


@pytest.mark.parametrize("model,options,reason", [
    ("empty-dir", {}, "has no config.json"),
    ("tiny", {"tensor_parallel_size": 3}, "tensor_parallel_size: 3 does not divide"),
    ("bad-gguf", {}, "model.gguf does not start with the GGUF magic bytes"),
    ("bad-json", {}, "config.json' is not a valid JSON file"),
    ("no-model-type", {}, "Should have a `model_type` key"),
])
def test_every_load_failure_is_one_the_server_exits_on_with_one_line(tmp_path, tiny_llama_dir,
                                                                     model, options, reason):
    """What the server's load raises for these: an error it reports in one line (no
    traceback) before it exits 1, as the cases above show end to end."""
    from tokenmill.engine.contract.config import ConfigError
    from tokenmill.engine.models.source import ModelLoadError

    state = server_state(_broken(model, tmp_path, tiny_llama_dir), load=False, **options)
    with pytest.raises((ConfigError, ModelLoadError, OSError), match=reason.replace("`", ".")):
        state.load(show_progress=False)
    assert state.load_error is not None


def test_an_invalid_option_value_exits_2_naming_it():
    code, stderr = ServeProcess("/nonexistent", "--block-size", "7").finish()
    assert code == 2
    assert stderr.startswith("tokenmill serve: error: block_size: 7 ")
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_a_pool_short_of_the_context_serves_requests_that_set_no_max_tokens(tiny_llama_dir):
    """The tiny model's 1,024 tokens do not fit a 64 KiB pool: the server's context is what
    the pool holds, which /v1/models reports and a request without max_tokens fills."""
    with running_server(server_state(tiny_llama_dir, "tiny", kv_cache_memory=64 << 10)) as served:
        length = served.state.max_model_len
        blocks = served.state.engine.engine.kv.allocator.num_blocks
        assert length == blocks * 16 < 1024
        model = served.client.models.list().data[0]
        assert model.max_model_len == length
        reply = served.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}],
            extra_body={"ignore_eos": True})
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.prompt_tokens + reply.usage.completion_tokens == length


def test_a_port_in_use_exits_non_zero(tiny_llama_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, stderr = ServeProcess(tiny_llama_dir, port=taken.getsockname()[1]).finish()
    assert code == 3 and "address already in use" in stderr


def test_health_answers_503_while_loading_then_200(tiny_llama_dir):
    proc = ServeProcess(tiny_llama_dir)
    seen = []
    try:
        deadline = time.monotonic() + 60
        while not seen or seen[-1] != (200, "ok"):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, f"not healthy; /health said {seen[-3:]}"
            try:
                r = httpx.get(f"{proc.url}/health", timeout=2)
                seen.append((r.status_code, r.json()["status"]))
            except httpx.TransportError:
                time.sleep(0.02)
        assert set(seen) == {(503, "loading"), (200, "ok")}, seen
        proc.send_signal(signal.SIGTERM)
        assert proc.finish()[0] == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_a_dead_engine_loop_stops_the_server(tiny_llama_dir):
    state = server_state(tiny_llama_dir, "tiny")

    def broken_step():
        raise RuntimeError("device lost")

    state.engine.engine.step = broken_step  # a fault inside the real engine loop
    with running_server(state, draining=True) as served:
        r = httpx.post(f"{served.url}/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2})
        assert r.status_code >= 500
        served.thread.join(15)
        assert not served.thread.is_alive(), "the server kept running with a dead engine"
        failure = served.server.failure
        assert isinstance(failure, RuntimeError) and "device lost" in str(failure)


@pytest.mark.parametrize("config, reason", [
    ('{"method": "medusa", "num_speculative_tokens": 2}', "method 'medusa' is not one of"),
    ('{"method": "ngram", "num_speculative_tokens": 40}',
     "'num_speculative_tokens' must be in 1..16, got 40"),
    ("{not json", "is not JSON"),
])
def test_a_speculative_config_that_cannot_run_exits_2_naming_it(config, reason):
    code, stderr = ServeProcess("/nonexistent", "--speculative-config", config).finish()
    assert code == 2
    assert stderr.startswith("tokenmill serve: error: speculative_config: ")
    assert reason in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_draft_with_another_vocabulary_exits_1_naming_the_option(tmp_path, tiny_llama_dir):
    from model_support import make_random_model
    from transformers import LlamaConfig

    from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer

    config = LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024)
    draft = make_random_model(str(tmp_path / "other-vocab"), config, word_level_tokenizer(1000))
    spec = f'{{"model": "{draft}", "num_speculative_tokens": 2}}'
    code, stderr = ServeProcess(tiny_llama_dir, "--speculative-config", spec).finish()
    assert code == 1, stderr
    line = next(line for line in stderr.splitlines() if "level=error" in line)
    assert "speculative_config: the draft model's vocabulary (1000 tokens" in line
    assert "Traceback" not in stderr


@pytest.mark.parametrize("template, reason", [
    ("chatml", "'chatml' is neither a file nor a Jinja template"),
    ("{% for m in messages %}{{ m['content'] }}", "the template does not parse: line 1"),
    ("bad-file", "the template does not parse: line 2"),
])
def test_a_chat_template_that_cannot_be_used_exits_2_naming_it(tmp_path, template, reason):
    if template == "bad-file":
        template = str(tmp_path / "chat.jinja")
        (tmp_path / "chat.jinja").write_text("{{ messages[0]['content'] }}\n{% endif %}\n")
    code, stderr = ServeProcess("/nonexistent", "--chat-template", template).finish()
    assert code == 2
    assert stderr.startswith("tokenmill serve: error: --chat-template: ")
    assert reason in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_what_loading_made_is_left_out_of_full_collections(tiny_llama_dir):
    """A full collection walks every object it tracks: what start-up made is frozen
    (gc.freeze) while `tokenmill serve`'s server runs, and collectable again once closed."""
    state = server_state(tiny_llama_dir, options={"freeze_startup_heap": True})
    try:
        assert not any(o is state.engine.engine for o in gc.get_objects())
    finally:
        state.close()
    assert any(o is state.engine.engine for o in gc.get_objects())


def test_tokenmill_serve_freezes_its_start_up_heap():
    from tokenmill.engine.cli import parse_args
    from tokenmill.engine.contract.config import engine_config_from_args
    from tokenmill.engine.server.serve import server_state as serve_state

    args = parse_args(["serve"])
    assert serve_state(engine_config_from_args(args), args).options.freeze_startup_heap
