"""Stored responses over real HTTP with the official openai client: a follow-up through
previous_response_id reads the same prompt as the whole conversation sent in input, a stored
response is what GET returns (streamed ones too), its input items page as OpenAI's list does
and item references read them, input tokens are counted as the response counts them,
background responses run after the POST has answered and can be cancelled without leaving a
request behind, and a server that stores nothing says so."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from server_support import in_process_server

from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.responses_protocol import input_messages
from tokenmill.engine.server.responses_store import ResponseStore, StoredResponse

GREEDY = {"temperature": 0, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    with in_process_server(tiny_llama_dir, "tiny", max_model_len=1024) as server:
        yield server


def finished(client: openai.OpenAI, response_id: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        assert time.monotonic() < deadline, response
        time.sleep(0.05)


def idle(server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.state.in_flight or server.state.engine.num_requests:
        assert time.monotonic() < deadline, "a request was left running"
        time.sleep(0.02)


def test_a_follow_up_continues_the_stored_conversation(server):
    """previous_response_id: the earlier input and output, then this input, as if the client
    had sent them all; the earlier instructions are not carried over (OpenAI's rule)."""
    client = server.client
    first = client.responses.create(model="tiny", input="one two three",
                                    instructions="four five", **GREEDY)
    assert first.store is True and first.previous_response_id is None
    follow = client.responses.create(model="tiny", input="six seven",
                                     previous_response_id=first.id, **GREEDY)
    assert follow.previous_response_id == first.id
    whole = client.responses.create(
        model="tiny", store=False, **GREEDY,
        input=[{"role": "user", "content": "one two three"},
               *[item.model_dump() for item in first.output],
               {"role": "user", "content": "six seven"}])
    assert follow.usage.input_tokens == whole.usage.input_tokens
    assert follow.output_text == whole.output_text
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # A chain: the third turn reads all three.
    third = client.responses.create(model="tiny", input="eight", previous_response_id=follow.id,
                                    **GREEDY)
    assert third.usage.input_tokens > follow.usage.input_tokens + follow.usage.output_tokens


def test_item_references_read_the_stored_items(server):
    """An item_reference stands for the stored input or output item it names."""
    client = server.client
    first = client.responses.create(model="tiny", input="one two", **GREEDY)
    [said] = client.responses.input_items.list(first.id).data
    [reply] = first.output
    referenced = client.responses.create(
        model="tiny", store=False, **GREEDY,
        input=[{"type": "item_reference", "id": said.id},
               {"type": "item_reference", "id": reply.id},
               {"role": "user", "content": "three"}])
    whole = client.responses.create(
        model="tiny", store=False, **GREEDY,
        input=[{"role": "user", "content": "one two"}, reply.model_dump(),
               {"role": "user", "content": "three"}])
    assert referenced.usage.input_tokens == whole.usage.input_tokens
    assert referenced.output_text == whole.output_text
    reply = httpx.post(f"{server.url}/v1/responses", json={
        "model": "tiny", "input": [{"role": "user", "content": "x"},
                                   {"type": "item_reference", "id": "msg_nope"}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input[1].id"


def test_input_tokens_counts_the_prompt_a_response_reads(server):
    """OpenAI's /v1/responses/input_tokens: the prompt's tokens, a stored conversation's
    included, as the response itself reports them."""
    client = server.client
    first = client.responses.create(model="tiny", input="one two", instructions="three",
                                    **GREEDY)
    counted = client.responses.input_tokens.count(model="tiny", input="one two",
                                                  instructions="three")
    assert (counted.object, counted.input_tokens) == ("response.input_tokens",
                                                      first.usage.input_tokens)
    follow = client.responses.create(model="tiny", input="four", previous_response_id=first.id,
                                     **GREEDY)
    assert client.responses.input_tokens.count(
        model="tiny", input="four", previous_response_id=first.id
    ).input_tokens == follow.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="tiny", input="x",
                                            previous_response_id="resp_nope")


def test_get_returns_the_stored_response_whole_or_streamed(server):
    client = server.client
    response = client.responses.create(model="tiny", input="one", **GREEDY)
    assert client.responses.retrieve(response.id) == response
    events = list(client.responses.create(model="tiny", input="two", stream=True, **GREEDY))
    assert events[-1].type == "response.completed"
    streamed = events[-1].response
    assert streamed.store is True
    assert client.responses.retrieve(streamed.id) == streamed
    follow = client.responses.create(model="tiny", input="three",
                                     previous_response_id=streamed.id, **GREEDY)
    assert follow.usage.input_tokens > streamed.usage.input_tokens


def test_input_items_page_newest_first_by_default(server):
    client = server.client
    said = [{"role": "user", "content": word} for word in ("one", "two", "three")]
    response = client.responses.create(model="tiny", input=said, **GREEDY)
    newest = client.responses.input_items.list(response.id, limit=2)
    assert [item.content for item in newest.data] == ["three", "two"]
    assert newest.has_more and newest.first_id == newest.data[0].id
    rest = client.responses.input_items.list(response.id, limit=2, after=newest.last_id)
    assert [item.content for item in rest.data] == ["one"] and not rest.has_more
    oldest = client.responses.input_items.list(response.id, order="asc")
    assert [item.content for item in oldest.data] == ["one", "two", "three"]
    assert len({item.id for item in oldest.data}) == 3
    # A string input is listed as the user message it stands for.
    text = client.responses.create(model="tiny", input="four", **GREEDY)
    [item] = client.responses.input_items.list(text.id).data
    assert (item.role, item.content[0].text) == ("user", "four")
    reply = httpx.get(f"{server.url}/v1/responses/{text.id}/input_items",
                      params={"after": "msg_nope"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "after"
    reply = httpx.get(f"{server.url}/v1/responses/{text.id}", params={"stream": "true"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream"


def test_store_false_and_delete_keep_nothing(server):
    client = server.client
    unstored = client.responses.create(model="tiny", input="one", store=False, **GREEDY)
    assert unstored.store is False
    kept = client.responses.create(model="tiny", input="two", **GREEDY)
    client.responses.delete(kept.id)
    for gone in (unstored.id, kept.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
    reply = httpx.post(f"{server.url}/v1/responses",
                       json={"model": "tiny", "input": "x", "previous_response_id": kept.id})
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == ("previous_response_id",
                                               "previous_response_not_found")


def test_a_background_response_runs_after_the_post_answers(server):
    client = server.client
    queued = client.responses.create(model="tiny", input="one two", background=True, **GREEDY)
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    done = finished(client, queued.id)
    foreground = client.responses.create(model="tiny", input="one two", **GREEDY)
    assert done.status == foreground.status
    assert done.output_text == foreground.output_text
    assert done.usage.output_tokens == foreground.usage.output_tokens
    follow = client.responses.create(model="tiny", input="three", previous_response_id=done.id,
                                     **GREEDY)
    assert follow.usage.input_tokens > done.usage.input_tokens
    # Only background responses are cancelled; cancelling a finished one changes nothing.
    with pytest.raises(openai.BadRequestError, match="only background responses"):
        client.responses.cancel(foreground.id)
    assert client.responses.cancel(done.id) == done


def test_cancelling_a_background_response_aborts_its_request(server):
    client = server.client
    running = client.responses.create(model="tiny", input="one", background=True,
                                      temperature=0, max_output_tokens=900,
                                      extra_body={"ignore_eos": True})
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(running.id).status == "cancelled"
    idle(server)
    # A background response deleted while it runs is stopped too.
    running = client.responses.create(model="tiny", input="two", background=True,
                                      temperature=0, max_output_tokens=900,
                                      extra_body={"ignore_eos": True})
    client.responses.delete(running.id)
    idle(server)
    assert client.responses.create(model="tiny", input="three", **GREEDY).status


def test_a_running_response_is_not_continued_yet(server):
    client = server.client
    running = client.responses.create(model="tiny", input="one", background=True,
                                      temperature=0, max_output_tokens=900,
                                      extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError, match="has not finished") as err:
        client.responses.create(model="tiny", input="two", previous_response_id=running.id)
    assert err.value.body["param"] == "previous_response_id"
    client.responses.cancel(running.id)
    idle(server)


@pytest.mark.parametrize(("body", "param"), [
    ({"background": True, "store": False}, "background"),
    ({"background": True, "stream": True}, "stream"),
])
def test_background_needs_a_stored_unstreamed_response(server, body, param):
    reply = httpx.post(f"{server.url}/v1/responses",
                       json={"model": "tiny", "input": "x", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_server_that_stores_nothing_says_so(tiny_llama_dir):
    with in_process_server(tiny_llama_dir, "tiny", max_model_len=128,
                           options={"max_stored_responses": 0}) as server:
        client = server.client
        response = client.responses.create(model="tiny", input="one", **GREEDY)
        assert response.store is False
        with pytest.raises(openai.NotFoundError, match="keeps no responses"):
            client.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError, match="keeps no responses"):
            client.responses.create(model="tiny", input="two", previous_response_id=response.id)
        with pytest.raises(openai.BadRequestError, match="must be stored"):
            client.responses.create(model="tiny", input="two", background=True)


# ---- the store and the translation, without a server ---------------------------------------

def entry(response_id: str) -> StoredResponse:
    return StoredResponse({"id": response_id}, [])


def test_the_least_recently_used_response_is_forgotten_first():
    store = ResponseStore(2)
    store.put(entry("a"))
    store.put(entry("b"))
    store.get("a")  # now the most recently used
    store.put(entry("c"))
    assert len(store) == 2 and store.get("a") and store.get("c")
    with pytest.raises(APIError) as err:
        store.get("b")
    assert err.value.status == 404


def test_history_comes_before_the_instructions_input_and_names_its_calls():
    """A stored function call, then this request's output for it: the tool message names the
    function, as one conversation sent whole would."""
    history = [{"type": "message", "role": "user", "content": "Weather?"},
               {"type": "function_call", "call_id": "c1", "name": "get_weather",
                "arguments": "{}", "id": "fc_1", "status": "completed"}]
    later = [{"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    assert input_messages(later, "Be terse.", history) == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "get_weather"},
    ]
