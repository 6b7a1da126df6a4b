"""n > 1 streamed: each choice's finish_reason comes once, in the chunk that ends it, though
the other choices run on (the engine's deltas are joined in place, so a finished choice stays
in every later output)."""

from __future__ import annotations

import collections

import pytest


def _streams(tiny_server, kind: str, seed: int):
    # Random text stops at its first "e": the choices end at different steps.
    options = {"n": 3, "max_tokens": 12, "temperature": 1.0, "seed": seed, "stream": True,
               "stop": ["e"]}
    client = tiny_server.client
    if kind == "chat":
        return client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], **options)
    return client.completions.create(model="tiny", prompt="Hi", **options)


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_each_choice_finishes_once_in_its_own_chunk(tiny_server, kind):
    staggered = 0
    for seed in range(6):
        finishes: collections.Counter = collections.Counter()
        after_finish = collections.Counter()
        finished_at = {}
        for step, event in enumerate(_streams(tiny_server, kind, seed)):
            for choice in event.choices:
                if choice.index in finished_at:
                    after_finish[choice.index] += 1
                if choice.finish_reason is not None:
                    finishes[choice.index] += 1
                    finished_at[choice.index] = step
        assert finishes == {0: 1, 1: 1, 2: 1}, (seed, finishes)
        assert not after_finish, (seed, after_finish)
        staggered += len(set(finished_at.values())) > 1
    assert staggered  # some run had choices finish in different chunks


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_each_chunk_carries_one_choice_and_rebuilds_the_reply(tiny_server, kind):
    """OpenAI and vLLM send one choice a chunk; clients read `chunk.choices[0]`. Read that way,
    a seeded n = 3 stream gives the texts and finish reasons of the same call unstreamed."""
    texts: collections.defaultdict = collections.defaultdict(str)
    finish = {}
    for event in _streams(tiny_server, kind, seed=3):
        assert len(event.choices) == 1, event
        choice = event.choices[0]
        piece = choice.delta.content if kind == "chat" else choice.text
        texts[choice.index] += piece or ""
        if choice.finish_reason is not None:
            finish[choice.index] = choice.finish_reason
    options = {"n": 3, "max_tokens": 12, "temperature": 1.0, "seed": 3, "stop": ["e"]}
    client = tiny_server.client
    if kind == "chat":
        whole = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], **options)
        expected = {c.index: c.message.content or "" for c in whole.choices}
    else:
        whole = client.completions.create(model="tiny", prompt="Hi", **options)
        expected = {c.index: c.text for c in whole.choices}
    assert dict(texts) == expected
    assert finish == {c.index: c.finish_reason for c in whole.choices}


def test_usage_chunk_carries_no_choice(tiny_server):
    stream = tiny_server.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4,
        stream=True, stream_options={"include_usage": True})
    events = list(stream)
    assert [len(e.choices) for e in events[:-1]] == [1] * (len(events) - 1)
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == 8
