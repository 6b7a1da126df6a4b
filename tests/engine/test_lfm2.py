"""Liquid AI's LFM2 (`Lfm2ForCausalLM`): gated short convolutions (B * x through a depthwise
causal convolution of three taps, times C), which keep a sequence's last inputs in place of
keys and values, and attention layers with q and k normalized per head; the MLP's width
adjusted from intermediate_size; the final norm named embedding_norm; embeddings tied; and
its mixtures of experts; LFM3 (`Lfm3ForCausalLM`): the same convolutions, full and sliding
attention layers, each with its rotary and each head's output gated, and a norm before and
after each branch.
Greedy output and log-probabilities equal transformers batched, chunked, with state slots
reused and forked, over two tensor-parallel ranks, and resuming from the prefix cache's
checkpoints."""

from __future__ import annotations

import pytest
from hybrid_support import ENGINE, MAX_NEW, check_equals_transformers, greedy
from lfm2_support import lfm2_config, lfm2_moe_config, lfm3_config
from model_support import (
    draw_correction_bias,
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
)

from tokenmill.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def lfm2_dir(tmp_path_factory, vocab_tokenizer) -> str:
    return make_random_model(str(tmp_path_factory.mktemp("lfm2")),
                             lfm2_config(len(vocab_tokenizer)), vocab_tokenizer,
                             draw_norms=True)


def test_greedy_and_logprobs_equal_transformers(lfm2_dir, prompts):
    check_equals_transformers(lfm2_dir, prompts, attention_layers=1)
    with LLM(lfm2_dir, **ENGINE) as llm:
        mlp = llm.engine.runner.model.model.layers[0].mlp
        assert mlp.down_proj.in_features == 96  # 2/3 of 144, a multiple of 32


def test_tensor_parallel_and_prefix_cached_equal_transformers(lfm2_dir, prompts):
    """Two ranks, each with half of every convolution's channels (its rows of B, C and x);
    then the prompts again, resuming from the checkpoints the first run kept."""
    reference = hf_reference(lfm2_dir)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(lfm2_dir, tensor_parallel_size=2, **ENGINE) as llm:
        assert llm.engine.runner.model.model.layers[0].conv.channels == 32
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        hits = llm.engine.kv.prefix_hits
        assert [out[0] for out in greedy(llm, prompts)] == expected
        assert llm.engine.kv.prefix_hits > hits


def test_the_mixture_of_experts_equals_transformers(tmp_path, vocab_tokenizer, prompts):
    """LFM2-8B-A1B's layers: a dense MLP in the first, experts chosen by sigmoid scores plus
    a drawn bias, renormalized and scaled, in the others; alone and over two ranks."""
    directory = draw_correction_bias(make_random_model(
        str(tmp_path), lfm2_moe_config(len(vocab_tokenizer)), vocab_tokenizer,
        draw_norms=True))
    check_equals_transformers(directory, prompts, attention_layers=1)
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert len(llm.engine.runner.model.model.layers[1].feed_forward.experts) == 4
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_lora_on_attention_equals_peft_and_lfm2s_own_names_are_refused(lfm2_dir, tmp_path):
    """An adapter on q_proj and v_proj equals peft's greedy output; one naming LFM2's own
    projections (out_proj) is refused with the targets the engine serves."""
    from lora_support import Adapter, make_adapter, peft_greedy

    from tokenmill.engine.contract.config import ConfigError

    options = dict(ENGINE, enable_lora=True, max_lora_rank=8)
    served = make_adapter(lfm2_dir, str(tmp_path / "qv"), Adapter("qv", 4, 8,
                                                                  ["q_proj", "v_proj"]))
    prompt = [5, 6, 7, 8, 9]
    with LLM(lfm2_dir, lora_modules=(f"qv={served}",), **options) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                    ignore_eos=True), lora="qv")
    adapted = peft_greedy(lfm2_dir, served, [prompt], MAX_NEW)
    assert [out[0].outputs[0].token_ids] == adapted != peft_greedy(lfm2_dir, None, [prompt],
                                                                   MAX_NEW)
    own = make_adapter(lfm2_dir, str(tmp_path / "own"), Adapter("own", 4, 8, ["out_proj"]))
    with pytest.raises(ConfigError, match="target module 'out_proj' is not one of"):
        LLM(lfm2_dir, lora_modules=(f"own={own}",), **options)


def test_lfm3_equals_transformers_alone_and_over_two_ranks(tmp_path, vocab_tokenizer, prompts):
    """LFM3's layers (conv, conv, full, conv, sliding, conv), norms drawn; alone, then over two
    ranks, each with its heads' output gates."""
    directory = make_random_model(str(tmp_path), lfm3_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    check_equals_transformers(directory, prompts, attention_layers=2)
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert llm.engine.runner.model.model.layers[2].self_attn.qkv_proj.parts["head_gate_proj"] \
            == 2
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
