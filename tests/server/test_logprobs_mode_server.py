"""A token --logprobs-mode processed_logprobs rules out (-inf) is shown as vLLM shows it,
-9999.0, which JSON can carry."""

from __future__ import annotations

import httpx
from server_support import running_server, server_state


def test_the_server_shows_a_ruled_out_token_as_vllm_does(tiny_llama_dir):
    state = server_state(tiny_llama_dir, "tiny", logprobs_mode="processed_logprobs")
    try:
        with running_server(state) as server:
            reply = httpx.post(f"{server.url}/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "temperature": 0.5, "top_k": 2, "logprobs": True,
                "top_logprobs": 3}, timeout=60)
    finally:
        state.engine.shutdown()
    assert reply.status_code == 200, reply.text
    for token in reply.json()["choices"][0]["logprobs"]["content"]:
        values = [top["logprob"] for top in token["top_logprobs"]]
        assert values[-1] == -9999.0 and all(v > -9999.0 for v in values[:2])
