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


def test_concurrent_streams_equal_their_whole_answers(server, client):
    """Eight streams at once, some stopped by a stop string a step after it is sampled: each
    stream's text is the non-streamed answer's."""
    prompts = [f"List {n} colors:" for n in range(2, 10)]
    stops = [None, ["\n"], None, [","], None, ["3"], None, [" and"]]
    whole = [client.completions.create(model=SMOLLM2, prompt=p, temperature=0.0, max_tokens=24,
                                       stop=s).choices[0] for p, s in zip(prompts, stops,
                                                                          strict=True)]

    async def stream(prompt: str, stop: list[str] | None) -> tuple[str, str]:
        api = async_openai_client(f"{server.url}/v1")
        text, reason = "", None
        async for chunk in await api.completions.create(model=SMOLLM2, prompt=prompt,
                                                        temperature=0.0, max_tokens=24,
                                                        stop=stop, stream=True):
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        await api.close()
        return text, reason

    async def all_streams() -> list[tuple[str, str]]:
        return await asyncio.gather(*(stream(p, s) for p, s in zip(prompts, stops,
                                                                   strict=True)))

    streamed = asyncio.run(all_streams())
    assert streamed == [(c.text, c.finish_reason) for c in whole]
    assert any(c.finish_reason == "stop" for c in whole)
