"""AsyncEngine's outputs: a reader behind the engine gets the steps it missed in one output
(the newest cumulative one, or the deltas joined), never a backlog; what it reads adds up to
what the engine generated."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from tokenmill.engine import SamplingParams
from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.core import LLMEngine, RequestOutputKind
from tokenmill.engine.core.outputs import CompletionOutput, RequestOutput
from tokenmill.engine.frontend.async_engine import AsyncEngine
from tokenmill.engine.frontend.output_slot import OutputSlot

PROMPT = list(range(300, 340))
MAX_NEW = 24


def _output(text: str, tokens: list[int], finish: str | None = None,
            prompt_logprobs: list | None = None) -> RequestOutput:
    completion = CompletionOutput(index=0, text=text, token_ids=tokens, finish_reason=finish,
                                  logprobs=[{t: -0.5} for t in tokens])
    return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1, 2],
                         outputs=[completion], finished=finish is not None,
                         prompt_logprobs=prompt_logprobs)


def _slot_reads(merge_deltas: bool, puts: list, reads: int) -> list:
    async def scenario() -> list:
        slot = OutputSlot(asyncio.get_running_loop(), merge_deltas=merge_deltas)
        for item in puts:
            slot.put(item)
        got = []
        for _ in range(reads):
            try:
                got.append(await slot.get())
            except ValueError as exc:
                got.append(exc)
        return got

    return asyncio.run(scenario())


def test_a_reader_behind_gets_the_newest_cumulative_output():
    first, second = _output("a", [5]), _output("ab", [5, 6])
    assert _slot_reads(False, [first, second], 1) == [second]


def test_deltas_a_reader_missed_are_joined_in_order():
    first = _output("a", [5], prompt_logprobs=[None, {2: -1.0}])
    then = _output("bc", [6, 7], finish="length")
    (joined,) = _slot_reads(True, [first, then], 1)
    c = joined.outputs[0]
    assert (c.text, c.token_ids, c.finish_reason) == ("abc", [5, 6, 7], "length")
    assert c.logprobs == [{5: -0.5}, {6: -0.5}, {7: -0.5}]
    assert joined.finished
    assert joined.prompt_logprobs == [None, {2: -1.0}]  # only the first delta carried them


def test_extend_joins_in_place_and_takes_the_rest_from_the_newer_output():
    first = _output("a", [5], prompt_logprobs=[None, {2: -1.0}])
    tokens = first.outputs[0].token_ids
    first.num_cached_tokens = 16
    then = _output("b", [6])
    then.num_preemptions = 1
    first.extend(then)
    c = first.outputs[0]
    assert c.token_ids is tokens and tokens == [5, 6]  # joined in place, not copied
    assert (c.text, c.finish_reason) == ("ab", None)
    assert (first.num_preemptions, first.num_cached_tokens, first.finished) == (1, 0, False)
    assert first.prompt_logprobs == [None, {2: -1.0}]


def test_extend_takes_every_field_but_the_joined_ones_from_the_newer_output():
    first, newer = _output("a", [5]), _output("b", [6], finish="stop")
    same_request = {"request_id", "prompt", "prompt_token_ids"}
    joined = {"outputs", "prompt_logprobs", "prompt_logprob_ranks"}
    for f in dataclasses.fields(RequestOutput):
        if f.name not in same_request | joined:
            setattr(newer, f.name, object() if f.name != "finished" else True)
    first.extend(newer)
    for f in dataclasses.fields(RequestOutput):
        if f.name not in same_request | joined:
            assert getattr(first, f.name) is getattr(newer, f.name), f.name


def test_extend_adds_generations_the_first_delta_lacked_in_index_order():
    second = CompletionOutput(index=1, text="x", token_ids=[9])
    first = RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                          outputs=[second], finished=False)
    zeroth = CompletionOutput(index=0, text="y", token_ids=[8], logprobs=[{8: -0.1}],
                              finish_reason="stop", stop_reason="y")
    more = CompletionOutput(index=1, text="z", token_ids=[7], logprobs=[{7: -0.2}])
    first.extend(RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                               outputs=[zeroth, more], finished=True))
    assert [c.index for c in first.outputs] == [0, 1] and first.finished
    assert (first.outputs[0].text, first.outputs[0].stop_reason) == ("y", "y")
    assert first.outputs[1].token_ids == [9, 7] and first.outputs[1].text == "xz"
    assert first.outputs[1].logprobs == [{7: -0.2}]  # the first delta asked for none yet


def test_an_error_comes_after_the_output_still_unread():
    output, error = _output("a", [5]), ValueError("engine died")
    assert _slot_reads(False, [output, error], 2) == [output, error]


def test_a_waiting_reader_wakes_on_put():
    async def scenario() -> RequestOutput:
        loop = asyncio.get_running_loop()
        slot = OutputSlot(loop)
        output = _output("a", [5])
        loop.call_later(0.05, slot.put, output)
        return await asyncio.wait_for(slot.get(), timeout=5)

    assert asyncio.run(scenario()).outputs[0].token_ids == [5]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    async_engine = AsyncEngine(LLMEngine(EngineConfig(model=tiny_llama_dir), show_progress=False))
    yield async_engine
    async_engine.shutdown()
    assert async_engine.error is None


@pytest.fixture(scope="module")
def expected(tiny_llama) -> CompletionOutput:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return tiny_llama.generate([PROMPT], params)[0].outputs[0]


def _read_slowly(engine: AsyncEngine, request_id: str, kind: RequestOutputKind) -> list:
    """Every output a reader gets when it blocks its event loop after the first one (the
    engine meanwhile finishes the request)."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True,
                            output_kind=kind)

    async def scenario() -> list:
        outputs = []
        async for out in engine.generate(request_id, PROMPT, params):
            outputs.append(out)
            if len(outputs) == 1:
                time.sleep(1.0)  # the loop stalls: the engine steps on without a reader
        return outputs

    return asyncio.run(scenario())


def test_a_stalled_reader_gets_the_rest_at_once_cumulative(engine, expected):
    outputs = _read_slowly(engine, "slow-cumulative", RequestOutputKind.CUMULATIVE)
    assert len(outputs) < MAX_NEW
    assert outputs[-1].finished
    assert outputs[-1].outputs[0].token_ids == expected.token_ids
    assert outputs[-1].outputs[0].text == expected.text


def test_a_stalled_reader_gets_the_rest_at_once_deltas(engine, expected):
    outputs = _read_slowly(engine, "slow-deltas", RequestOutputKind.DELTA)
    assert len(outputs) < MAX_NEW
    assert outputs[-1].finished
    assert [t for out in outputs for t in out.outputs[0].token_ids] == expected.token_ids
    assert "".join(out.outputs[0].text for out in outputs) == expected.text


def test_an_engine_with_a_stream_interval_hands_deltas_over_n_tokens_at_a_time(tiny_llama_dir,
                                                                               expected):
    engine = AsyncEngine(LLMEngine(EngineConfig(model=tiny_llama_dir, stream_interval=5),
                                   show_progress=False))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)

    async def scenario() -> list[list[int]]:
        return [out.outputs[0].token_ids async for out in engine.generate("n", PROMPT, params)]

    try:
        chunks = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert [t for chunk in chunks for t in chunk] == expected.token_ids
    assert len(chunks[0]) == 1  # the first token at once
    assert all(len(chunk) >= 5 for chunk in chunks[1:-1])
    assert len(chunks) <= 2 + (MAX_NEW - 1) // 5
