"""The OpenAI API over an engine with async scheduling: answers, streams and stops are the
synchronous engine's, concurrent streams all complete."""

from __future__ import annotations

import asyncio

import pytest
from model_support import REFERENCE, SMOLLM2
from server_support import async_openai_client, in_process_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smollm2_dir):
    with in_process_server(str(smollm2_dir), SMOLLM2, async_scheduling=True,
                           **REFERENCE) as server:
        yield server


def test_chat_answers_as_the_synchronous_engine(client):
    reply = client.chat.completions.create(model=SMOLLM2, messages=QUESTION, temperature=0.0,
                                           max_tokens=30)
    choice = reply.choices[0]
    assert choice.message.content == "The capital of France is Paris."
    assert choice.finish_reason == "stop"


def test_concurrent_streams_equal_their_whole_answers(server):
    """Eight streams at once, some stopped by a stop string a step after it is sampled: each
    stream's text is the non-streamed answer's (the eight asked at once too)."""
    prompts = [f"List {n} colors:" for n in range(2, 10)]
    stops = [None, ["\n"], None, [","], None, ["3"], None, [" and"]]

    async def ask(prompt: str, stop: list[str] | None) -> tuple[str, str]:
        async with async_openai_client(f"{server.url}/v1") as api:
            reply = await api.completions.create(model=SMOLLM2, prompt=prompt, temperature=0.0,
                                                 max_tokens=24, stop=stop)
        return reply.choices[0].text, reply.choices[0].finish_reason

    async def stream(prompt: str, stop: list[str] | None) -> tuple[str, str]:
        text, reason = "", None
        async with async_openai_client(f"{server.url}/v1") as api:
            async for chunk in await api.completions.create(model=SMOLLM2, prompt=prompt,
                                                            temperature=0.0, max_tokens=24,
                                                            stop=stop, stream=True):
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def all_at_once(call) -> list[tuple[str, str]]:
        return await asyncio.gather(*(call(p, s) for p, s in zip(prompts, stops, strict=True)))

    whole = asyncio.run(all_at_once(ask))
    assert asyncio.run(all_at_once(stream)) == whole
    assert any(reason == "stop" for _, reason in whole)
    assert any(reason == "length" for _, reason in whole)
