"""Speculative decoding with a draft model: a smaller model sharing the target's tokenizer
proposes each decoding sequence's next tokens (greedy, one batched pass per proposal), which
the target verifies as it verifies n-gram proposals. Outputs never change: greedy equals plain
decoding and HF, batched, mixed with sequences that do not speculate, under preemption and
with n > 1; seeded sampling draws the same tokens. The draft's own KV pool leaks no block."""

from __future__ import annotations

import json
import random

import pytest
import torch
from model_support import hf_greedy

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.truncated_model import save_truncated

MAX_NEW = 24


def _spec(model: str, k: int = 3) -> str:
    return json.dumps({"model": model, "num_speculative_tokens": k})


def _prompts() -> list[list[int]]:
    rng = random.Random(9)
    return [[rng.randrange(100, 3000) for _ in range(n)] for n in (5, 23, 40, 12)]


def _greedy(max_tokens: int = MAX_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _engine(target: str, draft: str | None, **options) -> LLM:
    options.setdefault("kv_cache_memory", 32 << 20)
    return LLM(target, show_progress=False,
               speculative_config=_spec(draft) if draft else None, **options)


def _outputs(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _check_clean(llm: LLM) -> None:
    """No block left in either pool, and the draft tracks no sequence."""
    engine = llm.engine
    engine.kv.allocator.check_all_free()
    proposer = engine.scheduler.proposer
    if proposer is not None:
        proposer.kv.allocator.check_all_free()
        assert not proposer.states


@pytest.fixture(scope="module")
def one_layer_draft(tiny_llama_dir, tmp_path_factory) -> str:
    return save_truncated(tiny_llama_dir, str(tmp_path_factory.mktemp("draft-1-layer")), 1)


@pytest.fixture(scope="module")
def hf_reference(tiny_llama_dir) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return [hf_greedy(model, p, MAX_NEW) for p in _prompts()]


@pytest.mark.parametrize("budget", [2048, 16])
def test_a_truncated_draft_keeps_greedy_outputs(tiny_llama_dir, one_layer_draft, hf_reference,
                                                budget):
    """Mixed: one request asks for a single token (it never speculates) beside the others;
    with a budget of 16 the prompts are prefilled in chunks."""
    plain = _engine(tiny_llama_dir, None, max_num_batched_tokens=budget, max_num_seqs=8)
    llm = _engine(tiny_llama_dir, one_layer_draft, max_num_batched_tokens=budget,
                  max_num_seqs=8)
    prompts = _prompts() + [_prompts()[1]]
    params = [_greedy()] * 4 + [_greedy(1)]
    outputs = _outputs(llm, prompts, params)
    assert outputs == _outputs(plain, prompts, params)
    assert outputs[:4] == hf_reference
    stats = llm.engine.speculation_stats
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_drafts
    _check_clean(llm)


def test_the_target_as_its_own_draft_is_accepted_nearly_always(tiny_llama_dir, hf_reference):
    llm = _engine(tiny_llama_dir, tiny_llama_dir, max_num_seqs=8)
    assert _outputs(llm, _prompts(), _greedy()) == hf_reference
    stats = llm.engine.speculation_stats
    assert stats.num_draft_tokens > 20
    assert stats.acceptance_rate > 0.9
    _check_clean(llm)


def test_preemption_under_a_small_pool_leaks_no_block(tiny_llama_dir, one_layer_draft,
                                                      hf_reference):
    from transformers import AutoConfig

    from tokenmill.engine.execution.kv_layout import KVCacheLayout

    def block(directory: str) -> int:
        return KVCacheLayout.for_model(AutoConfig.from_pretrained(directory), 16,
                                       torch.float32).bytes_per_block

    # The budget holds 7 blocks of the target's and 7 of the draft's: the draft's pool has the
    # target's number of blocks, both from kv_cache_memory.
    memory = 7 * (block(tiny_llama_dir) + block(one_layer_draft))
    llm = _engine(tiny_llama_dir, one_layer_draft, kv_cache_memory=memory, max_num_seqs=4,
                  max_num_batched_tokens=32)
    assert llm.engine.scheduler.proposer.kv.allocator.num_blocks == 7
    assert llm.engine.kv.allocator.num_blocks == 7
    assert _outputs(llm, _prompts(), _greedy()) == hf_reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.speculation_stats.num_drafts > 0
    _check_clean(llm)


def test_seeded_sampling_and_n_samples_are_unchanged(tiny_llama_dir, one_layer_draft):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=11, max_tokens=MAX_NEW,
                            ignore_eos=True, n=3)
    results = []
    for draft in (None, one_layer_draft):
        llm = _engine(tiny_llama_dir, draft, max_num_seqs=16)
        results.append([[c.token_ids for c in o.outputs]
                        for o in llm.generate(_prompts(), params)])
        _check_clean(llm)
    assert results[0] == results[1]
    assert all(len(out) == 3 for out in results[1])


def test_aborting_mid_speculation_frees_both_pools(tiny_llama_dir, one_layer_draft):
    llm = _engine(tiny_llama_dir, one_layer_draft)
    engine = llm.engine
    for i, prompt in enumerate(_prompts()):
        engine.add_request(f"r{i}", prompt, _greedy(200))
    for _ in range(8):
        engine.step()
    assert engine.speculation_stats.num_drafts > 0
    assert engine.scheduler.proposer.kv.allocator.num_used > 0
    for i in range(4):
        engine.abort_request(f"r{i}")
    _check_clean(llm)


def test_tensor_parallel_target_with_a_draft_on_rank_0(tiny_llama_dir, one_layer_draft,
                                                       hf_reference):
    with _engine(tiny_llama_dir, one_layer_draft, tensor_parallel_size=2) as llm:
        outputs = _outputs(llm, _prompts(), _greedy())
        assert llm.engine.speculation_stats.num_drafts > 0
        _check_clean(llm)
    assert outputs == hf_reference


@pytest.mark.parametrize("config, message", [
    ({"model": "x", "num_speculative_tokens": 17}, r"must be in 1\.\.16, got 17"),
    ({"model": "x", "num_speculative_tokens": 0}, r"must be in 1\.\.16, got 0"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method 'eagle' is not one of"),
])
def test_bad_draft_options_fail_at_start_up_naming_the_option(tiny_llama_dir, config, message):
    from tokenmill.engine.contract.config import ConfigError

    with pytest.raises(ConfigError, match=f"^speculative_config: .*{message}"):
        LLM(tiny_llama_dir, show_progress=False, speculative_config=json.dumps(config))


def _off_and_on(target: str, draft: str, run, **options) -> dict:
    """run(llm) on an engine without speculation, then with the draft; both leak nothing."""
    results = {}
    for spec in (None, draft):
        llm = _engine(target, spec, **options)
        results[spec is not None] = run(llm)
        _check_clean(llm)
        if spec is not None:
            stats = llm.engine.speculation_stats
            assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    return results


@pytest.fixture
def draft(tiny_llama_dir) -> str:
    """The target as its own draft: nearly every greedy proposal is accepted, so accepted runs
    cross stop strings and grammar states, and penalties turn proposals away (a draft that
    is mostly rejected is the one-layer copy of the tests above)."""
    return tiny_llama_dir


def test_penalties_and_logprobs_are_unchanged_by_a_draft(tiny_llama_dir, draft):
    """The draft proposes greedily without penalties; verification samples each row with them,
    so proposals the penalties turn away are rejected and the output is plain decoding's."""
    cases = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True,
                            repetition_penalty=1.3, frequency_penalty=0.4,
                            presence_penalty=0.2),
             SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=3)]

    def run(llm: LLM) -> list:
        return [[(c.token_ids, [sorted(lp.items()) for lp in (c.logprobs or [])])
                 for o in llm.generate(_prompts(), params) for c in o.outputs]
                for params in cases]

    results = _off_and_on(tiny_llama_dir, draft, run, max_num_seqs=8)
    tokens = [[(ids, [[t for t, _ in row] for row in lps]) for ids, lps in case]
              for case in results[True]]
    assert tokens == [[(ids, [[t for t, _ in row] for row in lps]) for ids, lps in case]
                      for case in results[False]]
    values = [v for case in results[True] for _, lps in case for row in lps for _, v in row]
    plain = [v for case in results[False] for _, lps in case for row in lps for _, v in row]
    assert len(values) == 4 * MAX_NEW * 3 and values == pytest.approx(plain, abs=1e-4)


def test_a_stop_string_ends_a_drafted_output_where_plain_decoding_ends_it(tiny_llama_dir,
                                                                          draft):
    prompt = _prompts()[1]
    text = _engine(tiny_llama_dir, None).generate([prompt], _greedy())[0].outputs[0].text
    stop = max((text[i:i + 3] for i in range(len(text) - 2)), key=text.find)
    assert text.find(stop) > len(text) // 2

    def run(llm: LLM):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True,
                                stop=[stop])
        c = llm.generate([prompt], params)[0].outputs[0]
        return c.text, c.token_ids, c.finish_reason, c.stop_reason

    results = _off_and_on(tiny_llama_dir, draft, run)
    assert results[True] == results[False]
    assert results[True][2] == "stop" and results[True][3] == stop


def test_structured_outputs_under_a_draft_keep_their_grammar(tiny_llama_dir, draft):
    pytest.importorskip("xgrammar")
    from structured_support import PERSON

    from tokenmill.engine.core.structured import StructuredOutputsParams

    params = [SamplingParams(temperature=0.0, max_tokens=80,
                             structured_outputs=StructuredOutputsParams(json=PERSON)),
              _greedy()]

    def run(llm: LLM):
        return [(o.outputs[0].token_ids, o.outputs[0].text)
                for o in llm.generate(_prompts()[:2], params)]

    results = _off_and_on(tiny_llama_dir, draft, run)
    assert results[True] == results[False]
    assert json.loads(results[True][0][1]).keys() == PERSON["properties"].keys()


def test_prefix_cache_hits_under_a_draft_keep_outputs(tiny_llama_dir, draft, hf_reference):
    """The second round's prompts hit the target's prefix cache; the draft, which keeps no
    prefix cache of its own, catches up on the prompt in one pass and proposes as before."""

    def run(llm: LLM):
        rounds = [_outputs(llm, _prompts(), _greedy()) for _ in range(2)]
        assert llm.engine.kv.prefix_hits > 0
        return rounds

    results = _off_and_on(tiny_llama_dir, draft, run, max_num_seqs=8,
                          max_num_batched_tokens=32)
    assert results[True] == results[False]
    assert results[True][0] == results[True][1] == hf_reference
