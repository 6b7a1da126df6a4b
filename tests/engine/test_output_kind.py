"""SamplingParams.output_kind (vLLM's RequestOutputKind): cumulative outputs, deltas that add
up to them, or only the final one."""

from __future__ import annotations

import dataclasses

import pytest

from tokenmill.engine import SamplingParams
from tokenmill.engine.core import RequestOutputKind
from tokenmill.engine.core.sampling_params import SamplingParamsError


def _stream(engine, prompts, params) -> dict[str, list]:
    """Every output the engine reports, per request, stepping until all finish."""
    outputs: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


PARAMS = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, prompt_logprobs=1, n=2,
                        stop=[" the"], seed=5)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_deltas_add_up_to_the_cumulative_output(smollm2_dir, smol_tokenizer, async_scheduling):
    from model_support import REFERENCE

    from tokenmill.engine import LLM

    llm = LLM(str(smollm2_dir), show_progress=False, async_scheduling=async_scheduling,
              **REFERENCE)
    prompts = [smol_tokenizer.encode(t) for t in ("The capital of France is",
                                                  "Once upon a time")]
    cumulative = _stream(llm.engine, prompts, PARAMS)
    deltas = _stream(llm.engine, prompts,
                     dataclasses.replace(PARAMS, output_kind=RequestOutputKind.DELTA))
    for request_id, whole in cumulative.items():
        parts = deltas[request_id]
        assert len(parts) == len(whole) > 1
        final = whole[-1]
        assert parts[0].prompt_logprobs == final.prompt_logprobs is not None
        assert all(p.prompt_logprobs is None for p in parts[1:])
        assert parts[-1].finished and not any(p.finished for p in parts[:-1])
        for index, want in enumerate(final.outputs):
            pieces = [p.outputs[index] for p in parts]
            assert "".join(o.text for o in pieces) == want.text
            assert sum((o.token_ids for o in pieces), []) == want.token_ids
            assert sum((o.logprobs for o in pieces), []) == want.logprobs
            assert pieces[-1].finish_reason == want.finish_reason
            assert all(o.finish_reason is None for o in pieces[:-1])
    assert any(o.finish_reason == "stop" for whole in cumulative.values()
               for o in whole[-1].outputs)


def test_final_only_reports_each_request_once_finished(tiny_llama):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    cumulative = _stream(tiny_llama.engine, prompts, params)
    final = _stream(tiny_llama.engine, prompts,
                    dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY))
    for request_id, outs in final.items():
        assert len(outs) == 1 and outs[0].finished
        assert outs[0].outputs == cumulative[request_id][-1].outputs


def test_llm_generate_builds_no_output_before_a_request_finishes(tiny_llama, monkeypatch):
    engine = tiny_llama.engine
    reported = []
    step = engine.step

    def counted_step():
        outputs = step()
        reported.extend(outputs)
        return outputs

    monkeypatch.setattr(engine, "step", counted_step)
    results = tiny_llama.generate([[5, 6, 7], [9, 10]],
                                  SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert [len(r.outputs[0].token_ids) for r in results] == [5, 5]
    assert len(reported) == 2 and all(out.finished for out in reported)


def test_an_unknown_output_kind_is_refused_naming_it():
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA
    with pytest.raises(SamplingParamsError, match="output_kind"):
        SamplingParams(output_kind=7)
