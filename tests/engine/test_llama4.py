"""Llama 4's text model (`Llama4ForCausalLM`, and on text the language model of
`Llama4ForConditionalGeneration`): rotary over interleaved pairs in the layers that rotate,
which attend within chunks of attention_chunk_size and normalize q and k after the turn; the
others with no positional encoding, over the whole context, their queries scaled by position;
experts chosen by their top logit's sigmoid, which scales the expert's input, beside a shared
expert, in the moe_layers, and dense MLPs of intermediate_size_mlp in the others. Greedy
output and log-probabilities equal transformers batched, chunked, from the prefix cache, over
two tensor-parallel ranks and through the Triton kernels."""

from __future__ import annotations

import pytest
from llama4_support import llama4_config
from model_support import (
    greedy_three_ways,
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
)

from tokenmill.engine import LLM

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              dtype="float32")
@pytest.fixture(scope="module")
def llama4_dir(tmp_path_factory, vocab_tokenizer) -> str:
    return make_random_model(str(tmp_path_factory.mktemp("llama4")),
                             llama4_config(len(vocab_tokenizer)), vocab_tokenizer,
                             draw_norms=True)


@pytest.fixture(scope="module")
def reference(llama4_dir):
    return hf_reference(llama4_dir)


@pytest.fixture(scope="module")
def expected(reference, prompts) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in prompts]


def test_greedy_and_logprobs_equal_transformers(llama4_dir, reference, prompts, expected):
    with LLM(llama4_dir, **ENGINE) as llm:
        layers = llm.engine.runner.model.model.layers
        assert [layer.self_attn.scores.chunk for layer in layers] == [8, None, 8, None]
        assert [layer.feed_forward_name for layer in layers] == ["mlp", "feed_forward"] * 2
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_tensor_parallel_equals_transformers(llama4_dir, reference, prompts, expected):
    """Two ranks: half the heads, half of each expert's, the shared expert's and the dense
    MLPs' widths."""
    with LLM(llama4_dir, tensor_parallel_size=2, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_the_language_model_of_the_multimodal_checkpoint(tmp_path, vocab_tokenizer, prompts):
    import transformers

    vocab = len(vocab_tokenizer)
    config = transformers.Llama4Config(
        text_config=llama4_config(vocab).to_dict(),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14,
                           vision_output_dim=32, projector_input_dim=32,
                           projector_output_dim=32),
        image_token_index=vocab - 1)
    directory = make_random_model(str(tmp_path), config, vocab_tokenizer, draw_norms=True,
                                  auto_class="AutoModelForImageTextToText")
    # Its language model, a Llama4ForCausalLM (the multimodal model's own text-only forward
    # fails in transformers 5.24, reading image outputs the text model does not return).
    model = hf_reference(directory, "AutoModelForImageTextToText").language_model
    model.generation_config.eos_token_id = None
    expected = [hf_greedy(model, p, MAX_NEW) for p in prompts]
    with LLM(directory, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, model, prompts, MAX_NEW) == expected


def test_a_lora_adapter_on_attention_and_the_dense_mlps_equals_peft(llama4_dir, tmp_path,
                                                                   prompts):
    """q and k rows reordered from Llama 4's adjacent rotary pairs, B's alike; the dense
    layers' MLP read under feed_forward."""
    from lora_support import Adapter, make_adapter, peft_greedy

    from tokenmill.engine import LoRARequest, SamplingParams

    targets = r".*layers\.\d+\.(self_attn\.(q|k|v|o)_proj|feed_forward\.(gate|up|down)_proj)"
    adapter = make_adapter(llama4_dir, str(tmp_path / "adapter"),
                           Adapter("llama4", 4, 8, targets))
    expected = peft_greedy(llama4_dir, adapter, prompts[:3], MAX_NEW)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(llama4_dir, enable_lora=True, max_lora_rank=4, **ENGINE) as llm:
        outputs = llm.generate(prompts[:3], params,
                               lora_request=LoRARequest("llama4", 1, adapter))
    assert [o.outputs[0].token_ids for o in outputs] == expected
