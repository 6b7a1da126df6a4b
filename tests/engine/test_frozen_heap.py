"""A generation run keeps what existed before it out of the collector's full passes
(gc.freeze), and gives it back after, so that what is dropped later can be collected."""

from __future__ import annotations

import gc

import pytest

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.frontend.heap import frozen_heap

PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _watch_steps(engine) -> list[bool]:
    """For each step the engine takes: whether the engine itself was out of the objects the
    collector tracks (frozen) while it ran."""
    seen: list[bool] = []
    step = engine.step

    def watched():
        seen.append(not any(o is engine for o in gc.get_objects()))
        return step()

    engine.step = watched
    return seen


@pytest.fixture
def unfrozen():
    """Each test starts from a heap nothing froze, and leaves none frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_generate_runs_with_the_heap_it_found_frozen_then_unfreezes_it(tiny_llama_dir,
                                                                       unfrozen):
    llm = LLM(tiny_llama_dir, show_progress=False)
    frozen_during = _watch_steps(llm.engine)
    outputs = llm.generate([[5, 6, 7], [8, 9]], PARAMS)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    assert frozen_during and all(frozen_during)
    assert gc.get_freeze_count() == 0
    assert any(o is llm.engine for o in gc.get_objects())


def test_a_heap_the_caller_froze_stays_frozen(tiny_llama_dir, unfrozen):
    llm = LLM(tiny_llama_dir, show_progress=False)
    gc.freeze()
    llm.generate([[5, 6, 7]], PARAMS)
    assert gc.get_freeze_count() > 0
    assert not any(o is llm.engine for o in gc.get_objects())


def _tracked(obj) -> bool:
    """Whether the collector's passes would walk obj (a frozen object is in none of them)."""
    return any(o is obj for o in gc.get_objects())


def test_frozen_heap_nests_and_leaves_a_disabled_collector_alone(unfrozen):
    before = [object()]  # a container the collector tracks, made before any freeze
    with frozen_heap():
        assert not _tracked(before)
        with frozen_heap():
            assert not _tracked(before)
        assert not _tracked(before)  # the inner block unfroze nothing
    assert _tracked(before)
    gc.disable()
    try:
        with frozen_heap():
            assert _tracked(before)
    finally:
        gc.enable()


def test_the_engine_run_of_the_benchmarks_steps_with_the_heap_frozen(tiny_llama_dir,
                                                                     unfrozen):
    from tokenmill.engine.bench import engine_run
    from tokenmill.engine.bench.workload import BenchRequest

    llm = LLM(tiny_llama_dir, show_progress=False)
    frozen_during = _watch_steps(llm.engine)
    workload = [BenchRequest(prompt_token_ids=[5 + i, 6, 7], output_len=4) for i in range(2)]
    run = engine_run.run_engine(llm, workload, show_progress=False)
    assert len(run.requests) == 2
    assert frozen_during and all(frozen_during)
    assert gc.get_freeze_count() == 0
