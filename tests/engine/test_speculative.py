"""Speculative decoding (n-gram prompt lookup): proposals verified in one step never change an
output. Greedy outputs equal plain decoding and HF token for token, batched and mixed with
sequences that do not speculate, with the prefix cache, chunked prefill, penalties, logprobs,
stop strings and n > 1; seeded sampling draws the same tokens; rejected proposals leave no
block behind."""

from __future__ import annotations

import json
import random

import pytest
import torch
from model_support import hf_greedy

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError

MAX_NEW = 24


def _spec(k: int = 4, **extra) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1, **extra})


def _repetitive_prompts() -> list[list[int]]:
    """Prompts that repeat themselves, so lookups find proposals (random models copy poorly,
    but greedy continuations of repeated text repeat often enough), and plain random ones."""
    rng = random.Random(5)
    motif = [rng.randrange(100, 3000) for _ in range(7)]
    return [motif * 4, motif * 3 + motif[:3], [rng.randrange(100, 3000) for _ in range(20)],
            [5, 6, 7, 5, 6, 7, 5, 6]]


def _greedy(max_tokens: int = MAX_NEW, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra)


def _engine(directory: str, speculative: str | None, **options) -> LLM:
    options.setdefault("kv_cache_memory", 32 << 20)
    return LLM(directory, show_progress=False, speculative_config=speculative, **options)


def _outputs(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def hf_reference(tiny_llama_dir) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return [hf_greedy(model, p, MAX_NEW) for p in _repetitive_prompts()]


def _check_clean(llm: LLM) -> None:
    llm.engine.kv.allocator.check_all_free()
    assert all(not s.spec_tokens for s in llm.engine.scheduler.running)


@pytest.mark.parametrize("budget", [2048, 16])
def test_greedy_batched_equals_plain_decoding_and_hf(tiny_llama_dir, hf_reference, budget):
    llm = _engine(tiny_llama_dir, _spec(), max_num_batched_tokens=budget, max_num_seqs=8)
    outputs = _outputs(llm, _repetitive_prompts(), _greedy())
    assert outputs == hf_reference
    stats = llm.engine.speculation_stats
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_drafts
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    _check_clean(llm)


def _off_and_on(directory: str, run, speculative: str | None = None, **options) -> dict:
    """run(llm) on an engine without speculation, then with it; both leak nothing."""
    results = {}
    for spec in (None, speculative or _spec()):
        llm = _engine(directory, spec, **options)
        results[spec is not None] = run(llm)
        _check_clean(llm)
        if spec is not None:
            assert llm.engine.speculation_stats.num_drafts > 0
    return results


def test_penalties_logprobs_stop_strings_and_n_samples_are_unchanged(tiny_llama_dir):
    prompts = _repetitive_prompts()
    cases = [
        _greedy(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2),
        _greedy(logprobs=3),
        SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=11, max_tokens=MAX_NEW,
                       ignore_eos=True, n=3),
    ]

    def run(llm: LLM) -> list:
        got = []
        for params in cases:
            for out in llm.generate(prompts, params):
                got.append([(c.token_ids, c.finish_reason,
                             [sorted(lp.items()) for lp in (c.logprobs or [])])
                            for c in out.outputs])
        return got

    results = _off_and_on(tiny_llama_dir, run, max_num_seqs=16)
    # Tokens and finish reasons exactly; logprobs to float rounding (a verify step computes
    # several rows of a sequence at once, plain decoding one).
    strip = [[(tokens, reason, [[t for t, _ in row] for row in lps])
              for tokens, reason, lps in out] for out in results[True]]
    assert strip == [[(tokens, reason, [[t for t, _ in row] for row in lps])
                      for tokens, reason, lps in out] for out in results[False]]
    values = [v for out in results[True] for _, _, lps in out for row in lps for _, v in row]
    plain = [v for out in results[False] for _, _, lps in out for row in lps for _, v in row]
    assert values == pytest.approx(plain, abs=1e-4) and len(values) > 0


def test_a_stop_string_inside_accepted_proposals_ends_the_output_there(tiny_llama_dir):
    prompt = _repetitive_prompts()[0]
    plain = _engine(tiny_llama_dir, None)
    text = plain.generate([prompt], _greedy())[0].outputs[0].text
    # The 3 characters that first appear latest: the output runs long before it stops.
    stop = max((text[i:i + 3] for i in range(len(text) - 2)), key=text.find)
    assert text.find(stop) > len(text) // 2

    def run(llm: LLM):
        c = llm.generate([prompt], _greedy(stop=[stop]))[0].outputs[0]
        return c.text, c.token_ids, c.finish_reason, c.stop_reason

    results = _off_and_on(tiny_llama_dir, run)
    assert results[True] == results[False]
    assert results[True][2] == "stop" and results[True][3] == stop


def test_prefix_cache_preemption_and_mixed_batches_keep_outputs(tiny_llama_dir, hf_reference):
    """The second round reuses the first's cached prefixes (full blocks that include accepted
    proposals); one request per round asks for a single token (it cannot speculate) beside the
    others, which do; prompts are prefilled in chunks of the token budget."""
    prompts = _repetitive_prompts()

    def run(llm: LLM):
        rounds = []
        for _ in range(2):
            outs = llm.generate(prompts + [prompts[0]], [_greedy()] * 4 + [_greedy(1)])
            rounds.append([o.outputs[0].token_ids for o in outs])
        assert llm.engine.kv.prefix_hits > 0
        return rounds

    results = _off_and_on(tiny_llama_dir, run, max_num_seqs=8, max_num_batched_tokens=32)
    assert results[True] == results[False]
    assert results[True][0][:4] == hf_reference


def test_preemption_under_a_small_pool_leaks_no_block(tiny_llama_dir, hf_reference):
    from transformers import AutoConfig

    from tokenmill.engine.execution.kv_layout import KVCacheLayout

    block = KVCacheLayout.for_model(AutoConfig.from_pretrained(tiny_llama_dir), 16,
                                    torch.float32).bytes_per_block

    def run(llm: LLM):
        outputs = _outputs(llm, _repetitive_prompts(), _greedy())
        assert llm.engine.scheduler.num_preemptions > 0
        return outputs

    results = _off_and_on(tiny_llama_dir, run, kv_cache_memory=7 * block, max_num_seqs=4,
                          max_num_batched_tokens=32)
    assert results[True] == results[False] == hf_reference


def test_aborting_mid_speculation_frees_everything(tiny_llama_dir):
    llm = _engine(tiny_llama_dir, _spec())
    engine = llm.engine
    for i, prompt in enumerate(_repetitive_prompts()):
        engine.add_request(f"r{i}", prompt, _greedy(200))
    for _ in range(12):
        engine.step()
    assert engine.speculation_stats.num_drafts > 0
    for i in range(4):
        engine.abort_request(f"r{i}")
    assert not engine.has_unfinished_requests()
    _check_clean(llm)


def test_speculation_turns_off_at_the_batch_size_asked(tiny_llama_dir):
    llm = _engine(tiny_llama_dir, _spec(disable_by_batch_size=2), max_num_seqs=8)
    _outputs(llm, _repetitive_prompts(), _greedy())  # four at once: never speculates
    assert llm.engine.speculation_stats.num_drafts == 0
    _outputs(llm, _repetitive_prompts()[:1], _greedy())  # alone: speculates
    assert llm.engine.speculation_stats.num_drafts > 0


def test_on_a_cpu_speculation_turns_off_at_the_measured_default(tiny_llama_dir):
    from tokenmill.engine.contract.speculative import DEFAULT_DISABLE_BY_BATCH_SIZE

    cut = DEFAULT_DISABLE_BY_BATCH_SIZE["cpu"]
    llm = _engine(tiny_llama_dir, _spec(), max_num_seqs=2 * cut)
    engine = llm.engine
    prompts = (_repetitive_prompts() * cut)[:cut]
    for i, prompt in enumerate(prompts):  # as many as the cut-off, all running at once
        engine.add_request(f"r{i}", prompt, _greedy())
    for _ in range(6):
        engine.step()
    assert engine.num_running == cut
    assert engine.speculation_stats.num_drafts == 0
    for i in range(cut - 1):  # one left: below the cut-off, it speculates
        engine.abort_request(f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.speculation_stats.num_drafts > 0
    _check_clean(llm)


def test_tensor_parallel_ranks_verify_the_same_rows(tiny_llama_dir, hf_reference):
    with _engine(tiny_llama_dir, _spec(), tensor_parallel_size=2) as llm:
        outputs = _outputs(llm, _repetitive_prompts(), _greedy())
        assert llm.engine.speculation_stats.num_accepted_tokens > 0
    assert outputs == hf_reference


def test_a_draft_with_another_vocabulary_fails_at_start_up(tiny_llama_dir, tmp_path):
    from model_support import make_random_model
    from transformers import LlamaConfig

    from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer

    tokenizer = word_level_tokenizer(1000)
    config = LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024)
    draft = make_random_model(str(tmp_path / "other-vocab"), config, tokenizer)
    with pytest.raises(ConfigError, match="^speculative_config: the draft model's vocabulary "
                                          r"\(1000 tokens.* is not the target's"):
        _engine(tiny_llama_dir, json.dumps({"model": draft, "num_speculative_tokens": 2}))


def test_structured_outputs_keep_their_grammar_and_output(tiny_llama_dir):
    """Proposals the grammar forbids are rejected like any mismatch (each row is sampled under
    the grammar as it stands after the tokens accepted before it)."""
    pytest.importorskip("xgrammar")
    from structured_support import PERSON

    from tokenmill.engine.core.structured import StructuredOutputsParams

    params = [SamplingParams(temperature=0.0, max_tokens=80,
                             structured_outputs=StructuredOutputsParams(json=PERSON)),
              _greedy()]
    prompts = _repetitive_prompts()[:2]

    def run(llm: LLM):
        outs = llm.generate(prompts, params)
        return [(o.outputs[0].token_ids, o.outputs[0].text) for o in outs]

    results = _off_and_on(tiny_llama_dir, run)
    assert results[True] == results[False]
    assert json.loads(results[True][0][1]).keys() == PERSON["properties"].keys()


def test_smollm2_copying_a_text_accepts_proposals_and_equals_hf(smollm2_dir, smol_hf,
                                                                smol_tokenizer):
    """The real model asked to repeat a passage: most proposals are accepted, and the answer is
    HF's greedy answer token for token."""
    from model_support import REFERENCE

    passage = ("The river rises in the hills, runs past the old mill and the stone bridge, "
               "and reaches the sea at the harbour town.")
    ids = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Repeat this sentence exactly: {passage}"}],
        add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    llm = LLM(str(smollm2_dir), show_progress=False, kv_cache_memory=64 << 20,
              speculative_config=_spec(k=4), **REFERENCE)
    out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=40))[0].outputs[0]
    assert out.token_ids == hf_greedy(smol_hf, ids, 40)  # both stop at the end-of-turn token
    assert out.text.startswith("The river rises in the hills")
    stats = llm.engine.speculation_stats
    assert stats.acceptance_rate > 0.5 and stats.mean_accepted_length > 2


def test_a_random_qwen3_equals_hf_with_speculation(tmp_path, vocab_tokenizer):
    import transformers
    from model_support import make_random_model

    config = transformers.Qwen3Config(
        vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    directory = make_random_model(str(tmp_path / "qwen3"), config, vocab_tokenizer)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory,
                                                              dtype=torch.float32).eval()
    llm = _engine(directory, _spec(), max_num_batched_tokens=16, max_num_seqs=4)
    prompts = _repetitive_prompts()
    assert _outputs(llm, prompts, _greedy()) == [hf_greedy(model, p, MAX_NEW) for p in prompts]
    assert llm.engine.speculation_stats.num_drafts > 0
    _check_clean(llm)
