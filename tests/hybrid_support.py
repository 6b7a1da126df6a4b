"""The check every hybrid family's test runs (Granite 4.0-H, Bamba, Nemotron-H): layers that
keep a state per sequence beside attention, against transformers."""

from __future__ import annotations

from model_support import greedy_with_hf_logprobs, hf_greedy, hf_reference

from tokenmill.engine import LLM, SamplingParams

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              dtype="float32")


def greedy(llm: LLM, prompts: list[list[int]], n: int = 1) -> list[list[list[int]]]:
    """Each prompt's `n` greedy continuations of MAX_NEW tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, n=n)
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def check_equals_transformers(directory: str, prompts: list[list[int]],
                              attention_layers: int) -> None:
    """Greedy output and log-probabilities equal transformers' batched and chunked, with
    `attention_layers` layers in the KV pool; again with two state slots reused by every
    prompt in turn, and forked (n = 2); every block and slot free after."""
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, **ENGINE) as llm:
        assert llm.engine.runner.kv_pool.shape[0] == attention_layers
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        assert [out[0] for out in greedy(llm, prompts)] == expected
    with LLM(directory, **dict(ENGINE, max_num_seqs=2)) as llm:
        assert [out[0] for out in greedy(llm, prompts)] == expected
        assert greedy(llm, prompts[:1], n=2) == [[expected[0]] * 2]
        llm.engine.kv.allocator.check_all_free()
        assert llm.engine.kv.states.num_free == 2


def check_tensor_parallel_equals_transformers(directory: str, prompts: list[list[int]],
                                              size: int, state_heads: int) -> None:
    """Over `size` ranks, each holding `state_heads` // size heads of the state pool, greedy
    output and log-probabilities equal transformers'."""
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=size, **ENGINE) as llm:
        assert llm.engine.runner.states.ssm.shape[2] == state_heads // size
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
