"""The OpenAI-compatible server, driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from model_support import SMOLLM2
from prometheus_client.parser import text_string_to_metric_families
from server_support import async_openai_client, wait_idle

from tokenmill.engine import SamplingParams

MODEL = SMOLLM2  # what the `server` fixture serves
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_completion_greedy_equals_offline_engine(client, smol_llm):
    prompt = "The three primary colors are"
    offline = smol_llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16))[0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert r.choices[0].text == offline.outputs[0].text
    assert r.choices[0].finish_reason == offline.outputs[0].finish_reason
    assert r.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert r.usage.completion_tokens == len(offline.outputs[0].token_ids)
    assert r.object == "text_completion" and r.model == MODEL


def test_chat_and_streaming_chat_answer_paris(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                       temperature=0)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_streaming_completion_joins_to_the_full_text(client):
    full = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20,
                                     temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time",
                                            max_tokens=20, temperature=0, stream=True))
    assert len(chunks) > 5
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_two_and_seed_reproducibility(client):
    def ask(seed):
        r = client.completions.create(model=MODEL, prompt="My favourite animal is", n=2,
                                      max_tokens=12, temperature=1.0, seed=seed,
                                      extra_body={"ignore_eos": True})
        return [c.text for c in sorted(r.choices, key=lambda c: c.index)], r

    first, r = ask(42)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 24
    assert ask(42)[0] == first
    assert ask(43)[0] != first


def test_prompt_list_and_token_ids(client):
    texts = client.completions.create(model=MODEL, prompt=["Hello", "The sky is"], n=2,
                                      max_tokens=3, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert sorted(c.index for c in texts.choices) == [0, 1, 2, 3]
    assert texts.usage.completion_tokens == 12
    ids = [[19556], [504, 6376, 314]]  # the same prompts as token ids
    by_ids = client.completions.create(model=MODEL, prompt=ids, n=2, max_tokens=3,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert by_ids.usage.prompt_tokens == 4
    single = client.completions.create(model=MODEL, prompt=ids[1], max_tokens=3, temperature=0)
    assert single.usage.prompt_tokens == 3


def test_stop_string_cuts_the_text(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                       temperature=0, stop=["Paris"])
    assert r.choices[0].message.content == "The capital of France is "
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                                 temperature=0, stop=[" of F"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The capital"


def test_stop_reason_names_what_stopped_the_choice(client):
    """vLLM's stop_reason: the stop string or stop token id that ended a choice, whole and on
    a stream's finishing chunk; None where the model's end token or the length ended it."""
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                       temperature=0, stop=["Paris", "Rome"])
    assert r.choices[0].model_extra["stop_reason"] == "Paris"
    natural = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                             temperature=0)
    assert natural.choices[0].finish_reason == "stop"
    assert natural.choices[0].model_extra["stop_reason"] is None
    [paris] = client.completions.create(model=MODEL, prompt="The capital of France is",
                                        max_tokens=1, temperature=0).choices[0].text.split()
    paris_id = client.completions.create(model=MODEL, prompt="The capital of France is",
                                         max_tokens=1, temperature=0,
                                         extra_body={"return_token_ids": True}
                                         ).choices[0].model_extra["token_ids"][0]
    by_id = client.completions.create(model=MODEL, prompt="The capital of France is",
                                      max_tokens=5, temperature=0,
                                      extra_body={"stop_token_ids": [paris_id]})
    assert (by_id.choices[0].finish_reason,
            by_id.choices[0].model_extra["stop_reason"]) == ("stop", paris_id)
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is",
                                            max_tokens=5, temperature=0, stream=True,
                                            stop=[paris]))
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_extra["stop_reason"] == paris
    cut = client.completions.create(model=MODEL, prompt="The capital of France is",
                                    max_tokens=1, temperature=0)
    assert (cut.choices[0].finish_reason, cut.choices[0].model_extra["stop_reason"]) == (
        "length", None)


def test_min_tokens_and_include_stop_str_in_output(client):
    """vLLM's sampling extensions, through the openai client's extra_body: the answer that
    ends by itself after 8 tokens runs to min_tokens, and a kept stop string ends the text."""
    natural = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                             temperature=0)
    assert natural.usage.completion_tokens < 12
    longer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                            temperature=0, extra_body={"min_tokens": 12})
    assert longer.usage.completion_tokens >= 12
    assert longer.choices[0].message.content.startswith(natural.choices[0].message.content)
    kept = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                          temperature=0, stop=["Paris"],
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content == "The capital of France is Paris"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4,
                                  extra_body={"min_tokens": 5})
    assert caught.value.body["param"] == "min_tokens"


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client):
    """vLLM's stream_options.continuous_usage_stats: each chunk's usage counts the tokens sent
    so far; the closing usage chunk is the whole request's, as without it."""
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None for c in chunks)
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    plain = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert [c.usage is not None for c in plain] == [False] * (len(plain) - 1) + [True]


def test_bad_words_and_allowed_token_ids(client):
    no_paris = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                              temperature=0, extra_body={"bad_words": ["Paris"]})
    text = no_paris.choices[0].message.content
    assert text.startswith("The capital of France is") and "Paris" not in text
    only = client.completions.create(model=MODEL, prompt="Count: 1, 2,", max_tokens=6,
                                     temperature=1.0, seed=0, logprobs=1,
                                     extra_body={"allowed_token_ids": [28, 30]})
    assert set(only.choices[0].text) <= {",", "."}
    for ids in ([], [10**9]):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                      extra_body={"allowed_token_ids": ids})
        assert caught.value.body["param"] == "allowed_token_ids"


def test_logprobs_for_completions_and_chat(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and top[token] == pytest.approx(value) and value <= 0
    c = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert "".join(t.token for t in content) == c.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob
               for t in content)


def test_echo_returns_prompt_and_completion(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is",
                                  max_tokens=3, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL, prompt="The capital of France is",
                                      max_tokens=3, temperature=0)
    assert r.choices[0].text == "The capital of France is" + plain.choices[0].text


def test_32_concurrent_streams_equal_their_solo_runs(base_url, client, server_state):
    prompts = [f"Fact number {i}: the" for i in range(32)]
    max_tokens = 5  # several chunks per stream, decoded while all 32 share the batch

    async def stream_all():
        aclient = async_openai_client(f"{base_url}/v1")

        async def one(prompt):
            parts = []
            stream = await aclient.completions.create(model=MODEL, prompt=prompt,
                                                      max_tokens=max_tokens, temperature=0,
                                                      stream=True)
            async for chunk in stream:
                parts.append(chunk.choices[0].text)
            return "".join(parts)

        return await asyncio.gather(*(one(p) for p in prompts))

    together = asyncio.run(stream_all())
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=max_tokens,
                                       temperature=0).choices[0].text for p in prompts]
    assert together == alone
    wait_idle(server_state)
    server_state.engine.engine.kv.allocator.check_all_free()


def test_disconnect_aborts_and_frees_blocks(base_url, client, server_state):
    body = {"model": MODEL, "prompt": "Write a very long story about", "max_tokens": 500,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{base_url}/v1/completions",
                                                       json=body) as response:
        lines = response.iter_lines()
        received = [line for _, line in zip(range(6), lines, strict=False) if line]
        assert received and received[0].startswith("data: ")
        assert server_state.engine.engine.num_running == 1
    wait_idle(server_state)
    server_state.engine.engine.kv.allocator.check_all_free()
    metrics = _metrics(base_url)
    assert metrics[("tokenmill_num_requests_running", ())] == 0
    assert metrics[("tokenmill_kv_cache_usage_ratio", ())] == 0
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices


BAD_REQUESTS = [
    ("/v1/completions", "{not json", 400),
    ("/v1/completions", {"model": MODEL}, 400),                                   # no prompt
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 3}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 50}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": [99999999]}, 400),              # bad token id
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 100000}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400),
    ("/v1/completions", {"model": "gpt-5", "prompt": "x"}, 404),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "prompt_embeds": "AAAA"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt_embeds": "AAAA"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logits_processors": ["m.P"]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                              "structural_tag": "{}"}, 400),  # neither form of a tag
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                              "guided_whitespace_pattern": " "}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                              "modalities": ["text", "audio"]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                              "audio": {"voice": "alloy", "format": "wav"}}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                              "web_search_options": {}}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                              "functions": [{"name": "f", "parameters": {}}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
     400),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "top_logprobs": 2}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "top_k": -5}, 400),
    ("/v1/chat/completions", {"model": "nope", "messages": QUESTION}, 404),
]


@pytest.mark.parametrize("path,body,status", BAD_REQUESTS)
def test_bad_input_gets_openai_error(base_url, path, body, status):
    with httpx.Client(timeout=30) as http:
        if isinstance(body, str):
            r = http.post(base_url + path, content=body,
                          headers={"content-type": "application/json"})
        else:
            r = http.post(base_url + path, json=body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["message"] and error["type"]
        assert set(error) == {"message", "type", "param", "code"}
        ok = http.post(base_url + "/v1/completions",
                       json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200


def test_context_overflow_message_has_both_numbers(base_url):
    with httpx.Client(timeout=30) as http:
        r = http.post(base_url + "/v1/completions",
                      json={"model": MODEL, "prompt": "hello world", "max_tokens": 9000})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "8192" in message and "9000" in message and "9002" in message


def test_full_waiting_queue_answers_503_with_retry_after(base_url, server_state):
    server_state.options.max_waiting_requests = 0
    try:
        with httpx.Client(timeout=30) as http:
            r = http.post(base_url + "/v1/completions",
                          json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["type"] == "service_unavailable"
    finally:
        server_state.options.max_waiting_requests = 1024


def _metrics(base_url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(base_url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
            if sample.name != "vllm:cache_config_info":  # vLLM's labels: no model_name
                assert sample.labels.get("model_name") == MODEL
            values[(sample.name, labels)] = sample.value
    return values


def test_metrics_count_the_traffic(base_url, client, server_state):
    wait_idle(server_state)
    before = _metrics(base_url)
    r1 = client.completions.create(model=MODEL, prompt="Count: one, two,", max_tokens=7,
                                   temperature=0, extra_body={"ignore_eos": True})
    r2 = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30,
                                        temperature=0)
    wait_idle(server_state)
    after = _metrics(base_url)

    def delta(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    prompt_tokens = r1.usage.prompt_tokens + r2.usage.prompt_tokens
    generated = r1.usage.completion_tokens + r2.usage.completion_tokens
    assert delta("tokenmill_prompt_tokens_total") == prompt_tokens
    assert delta("tokenmill_generation_tokens_total") == generated
    assert delta("tokenmill_request_success_total", (("finished_reason", "length"),)) == 1
    assert delta("tokenmill_request_success_total", (("finished_reason", "stop"),)) == 1
    assert delta("tokenmill_time_to_first_token_seconds_count") == 2
    assert delta("tokenmill_e2e_request_latency_seconds_count") == 2
    assert delta("tokenmill_inter_token_latency_seconds_count") == generated - 2
    assert after[("tokenmill_num_requests_waiting", ())] == 0
    assert after[("tokenmill_num_requests_running", ())] == 0
    for name in ("tokenmill_num_preemptions_total", "tokenmill_prefix_cache_queries_total",
                 "tokenmill_prefix_cache_hits_total", "tokenmill_request_queue_time_seconds_count"):
        assert (name, ()) in after


def test_metrics_report_weights_and_kv_memory(base_url, server_state):
    memory = server_state.engine.engine.memory_report()
    m = _metrics(base_url)
    assert m[("tokenmill_model_weights_bytes", ())] == memory["weights_bytes"] > 100 << 20
    assert m[("tokenmill_kv_cache_capacity_tokens", ())] == memory["kv_capacity_tokens"] > 0
    assert m[("tokenmill_kv_cache_tokens_per_gib", ())] == pytest.approx(
        memory["kv_tokens_per_gib"])


def test_health_models_and_version(base_url):
    with httpx.Client(timeout=10) as http:
        assert http.get(base_url + "/health").status_code == 200
        models = http.get(base_url + "/v1/models").json()
        assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 8192
        assert http.get(base_url + "/version").json()["version"]
        assert http.get(base_url + "/v1/nothing").json()["error"]["type"]
    assert json.loads(json.dumps(models))


def test_a_model_is_retrieved_by_name_and_an_unknown_one_is_a_404(client):
    """The openai client's models.retrieve: the same card /v1/models lists; another name is
    an OpenAI-style 404 naming what is served."""
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.owned_by == "tokenmill"
    assert card.model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("some-org/another-model")
    assert caught.value.body["code"] == "model_not_found" and MODEL in caught.value.message


def test_prefix_cache_hits_are_counted_and_salts_keep_tenants_apart(base_url, client,
                                                                     server_state):
    prompt = "You are a careful assistant. " * 12 + "Say hi."
    wait_idle(server_state)
    before = _metrics(base_url)
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    salted = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                       extra_body={"cache_salt": "tenant-b"})
    wait_idle(server_state)
    after = _metrics(base_url)
    assert first.choices[0].text == second.choices[0].text == salted.choices[0].text
    hits = (after[("tokenmill_prefix_cache_hits_total", ())]
            - before[("tokenmill_prefix_cache_hits_total", ())])
    queries = (after[("tokenmill_prefix_cache_queries_total", ())]
               - before[("tokenmill_prefix_cache_queries_total", ())])
    prompt_len = first.usage.prompt_tokens
    assert queries == 3 * prompt_len
    block = server_state.config.block_size
    assert hits == (prompt_len - 1) // block * block  # the second request only
