"""A call of many inputs (several prompts, a batch to embed) reaches the engine in one
command, so its requests start in the same step, not one step per input; a refusal among
them leaves none running."""

from __future__ import annotations

import time

import openai
import pytest


@pytest.fixture
def scheduled_per_step(tiny_server, monkeypatch):
    """How many sequences each engine step scheduled, while the test runs."""
    engine = tiny_server.state.engine
    counts: list[int] = []
    observe = engine._observer

    def counting(core, outputs):
        counts.append(len(core.last_plan.scheduled))
        observe(core, outputs)

    monkeypatch.setattr(engine, "_observer", counting)
    return counts


def test_the_prompts_of_one_call_start_in_one_step(tiny_server, scheduled_per_step):
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(8)]
    reply = tiny_server.client.completions.create(model="tiny", prompt=prompts, max_tokens=1)
    assert len(reply.choices) == 8
    assert max(scheduled_per_step) == 8, scheduled_per_step


def test_a_refused_prompt_leaves_none_of_its_call_running(tiny_server):
    """The others were admitted with it: they are aborted, not left to run to their end."""
    registry = tiny_server.state.metrics.registry

    def aborted() -> float:
        return registry.get_sample_value("tokenmill_request_success_total",
                                         {"model_name": "tiny",
                                          "finished_reason": "abort"}) or 0.0

    before = aborted()
    prompts = [[5, 6, 7]] * 3 + [[5] * 200]  # the last is past the 128-token context
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        tiny_server.client.completions.create(model="tiny", prompt=prompts, max_tokens=100,
                                              extra_body={"ignore_eos": True})
    engine = tiny_server.state.engine
    assert engine.num_requests == 0
    deadline = time.monotonic() + 10
    while engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)  # the aborts are the loop's next commands
    assert not engine.engine.has_unfinished_requests()
    assert aborted() == before + 3
