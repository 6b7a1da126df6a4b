"""Every output kind tells the same story: a request's deltas join to its final output, and
its cumulative outputs only ever grow, also while a stop string holds back the text's tail
(the tail held back may be longer than the text so far)."""

from __future__ import annotations

import pytest

from tokenmill.engine import SamplingParams
from tokenmill.engine.core import RequestOutputKind

PROMPTS = [list(range(300 + 7 * i, 316 + 7 * i)) for i in range(4)]
# Never produced by the tiny model's vocabulary of numbered tokens, and longer than the first
# tokens' text: what the server holds back is then more than there is.
LONG_STOP = "a stop string nobody writes"


def _run(engine, kind: RequestOutputKind, stop: list[str] | None) -> dict[str, list]:
    """Each request's outputs, in order, under `kind`."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=stop,
                            output_kind=kind)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"{kind.name}-{stop is not None}-{i}", prompt, params)
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id.rsplit("-", 1)[1], []).append(out)
    return outputs


@pytest.mark.parametrize("stop", [None, [LONG_STOP]], ids=["no-stop", "long-stop"])
def test_deltas_join_to_the_final_output_and_cumulative_outputs_grow(tiny_llama, stop):
    engine = tiny_llama.engine
    final = _run(engine, RequestOutputKind.FINAL_ONLY, stop)
    deltas = _run(engine, RequestOutputKind.DELTA, stop)
    cumulative = _run(engine, RequestOutputKind.CUMULATIVE, stop)
    assert sorted(final) == sorted(deltas) == sorted(cumulative) == ["0", "1", "2", "3"]
    for key, (done,) in final.items():
        expected = done.outputs[0]
        assert len(expected.token_ids) == 20
        joined = "".join(out.outputs[0].text for out in deltas[key])
        assert joined == expected.text
        assert [t for out in deltas[key] for t in out.outputs[0].token_ids] == \
            expected.token_ids
        texts = [out.outputs[0].text for out in cumulative[key]]
        assert all(later.startswith(earlier) for earlier, later in
                   zip(texts, texts[1:], strict=False))
        assert texts[-1] == expected.text
