"""Async scheduling: a step is scheduled and run before the previous step's tokens are read
back, and every output is what the synchronous engine gives."""

from __future__ import annotations

import pytest
import torch
from engine_support import tiny_llama_block_bytes
from model_support import REFERENCE, hf_greedy

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.execution.step_buffers import StepBuffers

MAX_NEW = 24


@pytest.fixture(scope="module")
def smol_async(smollm2_dir):
    return LLM(str(smollm2_dir), show_progress=False, async_scheduling=True, **REFERENCE)


@pytest.fixture(scope="module")
def tiny_pair(tiny_llama_dir):
    """The tiny model twice, synchronous and async, with room for preemption tests."""
    options = dict(show_progress=False, max_num_seqs=8, max_num_batched_tokens=64)
    return (LLM(tiny_llama_dir, **options),
            LLM(tiny_llama_dir, async_scheduling=True, **options))


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["Hello, my name is", "The capital of France is", "def quicksort(arr):",
             "A list of prime numbers: 2, 3, 5, 7, 11, 13,",
             " ".join(f"Item {i} is a box." for i in range(60)) + " Which box is 17?"]
    return [tokenizer.encode(t) for t in texts]


def _same(a, b) -> None:
    """Two generate() results agree in every field a caller reads. Logprobs to float32's
    rounding: a stopped sequence's extra row changes a step's batch, so its matrix products."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for ox, oy in zip(x.outputs, y.outputs, strict=True):
            assert (ox.token_ids, ox.text, ox.finish_reason, ox.stop_reason) == \
                (oy.token_ids, oy.text, oy.finish_reason, oy.stop_reason)
            assert (ox.logprobs is None) == (oy.logprobs is None)
            for px, py in zip(ox.logprobs or [], oy.logprobs or [], strict=True):
                assert list(px) == list(py)
                assert list(px.values()) == pytest.approx(list(py.values()), abs=1e-4)
        assert x.finished and y.finished


def test_greedy_equals_hf_batched_and_alone(smol_async, smol_hf, smol_tokenizer):
    prompts = _prompts(smol_tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    expected = [hf_greedy(smol_hf, p, MAX_NEW) for p in prompts]
    batched = smol_async.generate(prompts, params)
    for want, got in zip(expected, batched, strict=True):
        assert got.outputs[0].token_ids == want
    assert smol_async.generate([prompts[1]], params)[0].outputs[0].token_ids == expected[1]
    assert not smol_async.engine.has_unfinished_requests()
    assert smol_async.engine.kv_cache_stats().used_blocks == 0


def test_stops_logprobs_penalties_and_seeds_match_the_synchronous_engine(smol_llm, smol_async,
                                                                         smol_tokenizer):
    """Stops found a step late (EOS, stop strings, stop tokens) end the output where the
    synchronous engine ends it; everything read from the host state at sampling time (penalties,
    min_tokens, bad words, logprobs, seeded draws, n > 1) is the same."""
    prompts = _prompts(smol_tokenizer)[:4]  # the long prompt's prefill would be most of it
    comma = smol_tokenizer.encode(",")[-1]
    cases = [
        SamplingParams(temperature=0.0, max_tokens=32),  # some stop at EOS
        SamplingParams(temperature=0.0, max_tokens=32, stop=[" the", "\n"]),
        SamplingParams(temperature=0.0, max_tokens=32, stop_token_ids=[comma], min_tokens=3),
        SamplingParams(temperature=0.0, max_tokens=20, logprobs=3,
                       repetition_penalty=1.3, frequency_penalty=0.5, bad_words=["Paris"]),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=20, n=3),
    ]
    # One batch holding every case: sequences of different settings stop at different steps.
    batch = [p for _ in cases for p in prompts]
    settings = [params for params in cases for _ in prompts]
    overlapped = smol_async.generate(batch, settings)
    _same(smol_llm.generate(batch, settings), overlapped)
    ends = {(o.finish_reason, type(o.stop_reason)) for r in overlapped for o in r.outputs}
    assert ends == {("stop", type(None)), ("stop", str), ("stop", int), ("length", type(None))}


def test_structured_outputs_match(smol_llm, smol_async, smol_tokenizer):
    from tokenmill.engine.core.sampling_params import StructuredOutputsParams

    regex = StructuredOutputsParams(regex=r"[a-z]{2,6}( [0-9]{1,3})?")
    params = SamplingParams(temperature=0.0, max_tokens=30, structured_outputs=regex)
    prompts = _prompts(smol_tokenizer)[:3]
    sync, overlapped = smol_llm.generate(prompts, params), smol_async.generate(prompts, params)
    _same(sync, overlapped)
    assert all(o.outputs[0].finish_reason == "stop" for o in overlapped)


def test_preemption_and_chunked_prefill_match(tiny_llama_dir, vocab_tokenizer):
    """A pool too small for the batch: sequences are preempted while their last token is still
    on the device, and recomputed after it is read back."""
    options = dict(show_progress=False, max_num_seqs=8, max_num_batched_tokens=32)
    sync = LLM(tiny_llama_dir, **options)
    options["kv_cache_memory"] = 20 * tiny_llama_block_bytes(sync, 16)
    sync = LLM(tiny_llama_dir, **options)
    overlapped = LLM(tiny_llama_dir, async_scheduling=True, **options)
    prompts = [[(7 * i + j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    want, got = sync.generate(prompts, params), overlapped.generate(prompts, params)
    assert overlapped.engine.scheduler.num_preemptions > 0
    _same(want, got)
    assert overlapped.engine.kv_cache_stats().used_blocks == 0


def test_the_next_step_runs_before_the_tokens_are_read(tiny_pair, monkeypatch):
    """The point of it: while step k+1 is computed, the host appends step k's tokens."""
    _, llm = tiny_pair
    engine = llm.engine
    events: list[str] = []
    execute, append = engine.runner.execute, engine._append
    monkeypatch.setattr(engine.runner, "execute",
                        lambda inputs: events.append("execute") or execute(inputs))
    monkeypatch.setattr(engine, "_append",
                        lambda seq, *a: events.append("append") or append(seq, *a))
    engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3,
                                                      ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.append([o.outputs[0].token_ids for o in engine.step()])
    # Step 1 computes the prompt and samples token 1; step 2 runs before token 1 is appended.
    # Token 3 is the last whatever it is: no step computes it, the fourth call only reads it.
    assert events == ["execute", "execute", "append", "execute", "append", "append"]
    assert outputs == [[], [[outputs[1][0][0]]], [outputs[2][0]], [outputs[3][0]]]
    assert len(outputs[3][0]) == 3 and all(t >= 0 for t in outputs[3][0])


def test_abort_while_a_token_is_on_the_device(tiny_pair):
    _, llm = tiny_pair
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("gone", [5, 6, 7], params)
    engine.add_request("kept", [8, 9, 10], params)
    engine.step()
    engine.step()
    aborted = engine.abort_request("gone")
    assert aborted.finished and all(t >= 0 for t in aborted.outputs[0].token_ids)
    assert aborted.outputs[0].finish_reason == "abort"
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            last = out
    assert last.request_id == "kept" and len(last.outputs[0].token_ids) == 50
    assert engine.kv_cache_stats().used_blocks == 0


def test_tiny_model_matches_sync_with_n_and_random_prompts(tiny_pair):
    sync, overlapped = tiny_pair
    prompts = [[(11 * i + 3 * j) % 700 + 3 for j in range(5 + 13 * i)] for i in range(6)]
    for params in (SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[17, 40]),
                   SamplingParams(temperature=1.0, seed=3, max_tokens=25, n=2, logprobs=2)):
        _same(sync.generate(prompts, params), overlapped.generate(prompts, params))


def test_input_ids_read_the_previous_steps_tokens_on_the_device():
    buffers = StepBuffers(torch.device("cpu"))
    sampled = torch.tensor([40, 41, 42])
    views = buffers.fill([7, -3, -1, 9], [0, 1, 2, 3], [0, 1, 2, 3], [1, 2, 3, 4],
                         [1, 1, 1, 1], [[0], [0], [0], [0]], sampled=sampled)
    assert views.input_ids.tolist() == [7, 42, 40, 9]


def test_refused_with_speculation():
    with pytest.raises(ConfigError, match="speculative_config") as caught:
        EngineConfig(model="m", async_scheduling=True,
                     speculative_config='{"method": "ngram", "num_speculative_tokens": 3}')
    assert caught.value.option == "async_scheduling"


def test_tensor_parallel_ranks_take_rank_0s_tokens_on_their_devices(tiny_pair, tiny_llama_dir):
    """The other ranks embed the placeholders' tokens too: rank 0 broadcasts its sampled
    tokens to them before the step (gloo here, NCCL on GPUs)."""
    sync, _ = tiny_pair
    prompts = [[(5 * i + 3 * j) % 600 + 3 for j in range(4 + 11 * i)] for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[17, 40])
    want = sync.generate(prompts, params)
    with LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8, max_num_batched_tokens=64,
             tensor_parallel_size=2, async_scheduling=True) as sharded:
        _same(want, sharded.generate(prompts, params))
