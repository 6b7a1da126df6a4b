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
