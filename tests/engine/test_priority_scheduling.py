"""--scheduling-policy priority: waiting requests run by priority (lower first) then arrival, a
waiting request preempts running ones of strictly lower priority when it finds no room, and
blocks go to the higher priority; every output still equals its run alone. Under fcfs (the
default) a priority other than 0 is refused and nothing is queued."""

from __future__ import annotations

import random

import pytest
from engine_support import tiny_llama_block_bytes

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.core.errors import RequestError


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _prompt(seed: int | str, length: int = 12) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(length)]


def _alone(llm: LLM, prompt: list[int], max_tokens: int) -> list[int]:
    return llm.generate([prompt], _greedy(max_tokens))[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def one_seat(tiny_llama_dir):
    """One sequence at a time, so the order of requests is the order they run in."""
    with LLM(tiny_llama_dir, show_progress=False, scheduling_policy="priority",
             max_num_seqs=1, max_num_batched_tokens=64) as llm:
        yield llm


def _finish_order(llm: LLM, requests: dict[str, tuple[int, int]],
                  late: dict[str, tuple[int, int, int]] | None = None) -> tuple[list, dict]:
    """Add `requests` ({id: (priority, max_tokens)}), then each of `late` ({id: (priority,
    max_tokens, step)}) just before that step; step until all finish. The ids in finishing
    order, and each output."""
    engine, late = llm.engine, dict(late or {})
    for request_id, (priority, max_tokens) in requests.items():
        engine.add_request(request_id, _prompt(request_id), _greedy(max_tokens),
                           priority=priority)
    order, outputs, step = [], {}, 0
    while engine.has_unfinished_requests() or late:
        for request_id, (priority, max_tokens, at) in list(late.items()):
            if at == step:
                engine.add_request(request_id, _prompt(request_id),
                                   _greedy(max_tokens), priority=priority)
                del late[request_id]
        for out in engine.step():
            if out.finished:
                order.append(out.request_id)
                outputs[out.request_id] = out
        step += 1
    engine.kv.allocator.check_all_free()
    return order, outputs


def test_waiting_requests_run_by_priority_then_arrival(one_seat):
    order, _ = _finish_order(one_seat, {"a5": (5, 3), "b0": (0, 3), "c5": (5, 3),
                                        "d-1": (-1, 3), "e0": (0, 3)})
    assert order == ["d-1", "b0", "e0", "a5", "c5"]


def test_a_higher_priority_arrival_preempts_and_both_outputs_stay_exact(one_seat):
    """The low-priority request is decoding when the high one arrives: it is preempted at
    once, resumes after, and its tokens equal its run alone."""
    order, outputs = _finish_order(one_seat, {"low": (1, 30)}, late={"high": (0, 4, 5)})
    assert order == ["high", "low"]
    assert outputs["low"].num_preemptions == 1 and outputs["high"].num_preemptions == 0
    assert outputs["low"].outputs[0].token_ids == _alone(one_seat, _prompt("low"), 30)
    assert outputs["high"].outputs[0].token_ids == _alone(one_seat, _prompt("high"), 4)


def test_equal_or_lower_priorities_never_preempt(one_seat):
    preemptions = one_seat.engine.scheduler.num_preemptions
    order, _ = _finish_order(one_seat, {"first": (0, 12)},
                             late={"same": (0, 2, 3), "lower": (3, 2, 4)})
    assert order == ["first", "same", "lower"]
    assert one_seat.engine.scheduler.num_preemptions == preemptions


def test_short_of_blocks_the_lowest_priority_is_preempted(tiny_llama_dir, tiny_llama):
    """12 blocks of 8 tokens: two requests of 52 tokens do not fit together, three less so.
    The urgent one arrives last, so it is the newest running (fcfs's victim); here the
    lower priorities give their blocks up instead, and every output equals its run alone."""
    llm = LLM(tiny_llama_dir, show_progress=False, block_size=8, scheduling_policy="priority",
              kv_cache_memory=12 * tiny_llama_block_bytes(tiny_llama, 8))
    try:
        order, outputs = _finish_order(llm, {"a": (1, 40), "b": (2, 40)},
                                       late={"urgent": (0, 40, 2)})
        assert llm.engine.scheduler.num_preemptions > 0
        assert outputs["urgent"].num_preemptions == 0
        assert order.index("urgent") < order.index("b")
        for request_id, out in outputs.items():
            assert out.outputs[0].token_ids == _alone(tiny_llama, _prompt(request_id), 40)
    finally:
        llm.shutdown()


def test_under_fcfs_a_priority_is_refused_and_nothing_is_queued(tiny_llama):
    engine = tiny_llama.engine
    with pytest.raises(RequestError, match="priority 2 needs --scheduling-policy priority") as e:
        engine.add_request("r", [100, 200], _greedy(2), priority=2)
    assert e.value.param == "priority"
    with pytest.raises(RequestError, match="priority -1"):
        tiny_llama.generate([[100], [200]], _greedy(2), priority=[0, -1])
    assert not engine.has_unfinished_requests()
    assert tiny_llama.generate([[100]], _greedy(2), priority=[0])[0].finished


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ConfigError, match="scheduling_policy: 'lifo' is not one of"):
        EngineConfig(scheduling_policy="lifo")
