"""Every output kind tells the same story: a request's deltas join to its final output, and
its cumulative outputs only ever grow, also while a stop string holds back the text's tail
(the tail held back may be longer than the text so far), with several generations a request
and under async scheduling."""

from __future__ import annotations

import pytest

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.core import RequestOutputKind

PROMPTS = [list(range(300 + 7 * i, 316 + 7 * i)) for i in range(4)]
# Never produced by the tiny model's vocabulary of numbered tokens, and longer than the first
# tokens' text: what the server holds back is then more than there is.
LONG_STOP = "a stop string nobody writes"
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def async_llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, show_progress=False, async_scheduling=True)


def _run(engine, kind: RequestOutputKind, stop: list[str] | None, n: int) -> dict[str, list]:
    """Each request's outputs, in order, under `kind`."""
    params = SamplingParams(temperature=0.0 if n == 1 else 0.8, seed=5, n=n,
                            max_tokens=MAX_TOKENS, ignore_eos=True, stop=stop,
                            output_kind=kind)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"{kind.name}-{stop is not None}-{n}-{i}", prompt, params)
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id.rsplit("-", 1)[1], []).append(out)
    return outputs


def _by_index(outputs: list) -> dict[int, list]:
    found: dict[int, list] = {}
    for out in outputs:
        for c in out.outputs:
            found.setdefault(c.index, []).append(c)
    return found


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("stop", [None, [LONG_STOP]], ids=["no-stop", "long-stop"])
@pytest.mark.parametrize("n", [1, 2])
def test_deltas_join_to_the_final_output_and_cumulative_outputs_grow(
        tiny_llama, async_llm, scheduling, stop, n):
    engine = (tiny_llama if scheduling == "sync" else async_llm).engine
    final = _run(engine, RequestOutputKind.FINAL_ONLY, stop, n)
    deltas = _run(engine, RequestOutputKind.DELTA, stop, n)
    cumulative = _run(engine, RequestOutputKind.CUMULATIVE, stop, n)
    assert sorted(final) == sorted(deltas) == sorted(cumulative) == ["0", "1", "2", "3"]
    for key, (done,) in final.items():
        assert [c.index for c in done.outputs] == list(range(n))
        joined, grown = _by_index(deltas[key]), _by_index(cumulative[key])
        for expected in done.outputs:
            assert len(expected.token_ids) == MAX_TOKENS
            parts = joined[expected.index]
            assert "".join(c.text for c in parts) == expected.text
            assert [t for c in parts for t in c.token_ids] == expected.token_ids
            texts = [c.text for c in grown[expected.index]]
            assert all(later.startswith(earlier) for earlier, later in
                       zip(texts, texts[1:], strict=False))
            assert texts[-1] == expected.text


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stop", [None, [LONG_STOP]], ids=["no-stop", "long-stop"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_interval_sends_the_first_token_then_n_at_a_time_then_the_rest(
        tiny_llama, tiny_llama_dir, async_scheduling, stop, n):
    """--stream-interval 4: a delta request's first output at once, then one output per four
    tokens, the remainder with the end; joined, the same as the final output (also while a
    stop string holds back the text's tail). Cumulative requests are not held back."""
    engine = LLM(tiny_llama_dir, show_progress=False, stream_interval=4,
                 async_scheduling=async_scheduling).engine
    final = _run(tiny_llama.engine, RequestOutputKind.FINAL_ONLY, stop, n)
    deltas = _run(engine, RequestOutputKind.DELTA, stop, n)
    cumulative = _run(engine, RequestOutputKind.CUMULATIVE, stop, n)
    for key, (done,) in final.items():
        assert [len(out.outputs[0].token_ids) for out in cumulative[key]] == \
            list(range(1, MAX_TOKENS + 1))
        sizes = [max(len(c.token_ids) for c in out.outputs) for out in deltas[key]]
        assert sizes == [1, 4, 4, 4, 4, 3]  # 20 tokens
        joined = _by_index(deltas[key])
        for expected in done.outputs:
            parts = joined[expected.index]
            assert [t for c in parts for t in c.token_ids] == expected.token_ids
            assert "".join(c.text for c in parts) == expected.text
    engine.shutdown()
