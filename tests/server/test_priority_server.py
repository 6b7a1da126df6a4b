"""vLLM's `priority` request field over HTTP: refused with a 400 naming it under fcfs (the
default), honoured under --scheduling-policy priority, where an urgent request overtakes a
streaming one that still ends with its own exact text."""

from __future__ import annotations

import asyncio

import openai
import pytest
from server_support import async_openai_client, in_process_server


@pytest.mark.parametrize("route", ["completions", "chat/completions", "responses"])
def test_under_fcfs_a_priority_is_a_400_naming_the_field(tiny_server, route):
    import httpx

    body = {"model": "tiny", "max_tokens": 2, "priority": 1}
    body |= ({"prompt": "hi"} if route == "completions" else
             {"input": "hi"} if route == "responses" else
             {"messages": [{"role": "user", "content": "hi"}]})
    if route == "responses":
        body["max_output_tokens"] = body.pop("max_tokens")
    reply = httpx.post(f"{tiny_server.url}/v1/{route}", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "priority"
    assert "--scheduling-policy priority" in error["message"]
    assert tiny_server.state.engine.num_requests == 0


def test_a_priority_that_is_no_integer_is_a_400(tiny_server):
    with pytest.raises(openai.BadRequestError, match="priority"):
        tiny_server.client.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                              extra_body={"priority": "high"})


def test_an_urgent_request_overtakes_a_streaming_one(tiny_llama_dir):
    """One seat: the urgent request can only run by preempting the stream, which then resumes
    and ends with the text it has alone."""
    with in_process_server(tiny_llama_dir, "tiny", max_model_len=128, max_num_seqs=1,
                           scheduling_policy="priority") as server:
        client = async_openai_client(f"{server.url}/v1")
        greedy = dict(model="tiny", temperature=0.0, extra_body={"ignore_eos": True})
        alone = server.client.completions.create(prompt="one two", max_tokens=100, **greedy)

        async def run() -> tuple[str, bool]:
            stream = await client.completions.create(
                prompt="one two", max_tokens=100, stream=True,
                **(greedy | {"extra_body": {"ignore_eos": True, "priority": 5}}))
            chunks = aiter(stream)
            text = (await anext(chunks)).choices[0].text

            async def rest() -> str:
                return "".join([c.choices[0].text async for c in chunks if c.choices])

            streaming = asyncio.create_task(rest())
            urgent = await client.completions.create(
                prompt="three four", max_tokens=4,
                **(greedy | {"extra_body": {"ignore_eos": True, "priority": -1}}))
            assert urgent.usage.completion_tokens == 4
            overtaken = not streaming.done()
            return text + await streaming, overtaken

        text, overtaken = asyncio.run(run())
        assert overtaken
        assert text == alone.choices[0].text
        assert server.state.engine.engine.scheduler.num_preemptions == 1
