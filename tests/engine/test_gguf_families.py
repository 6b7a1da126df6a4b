"""GGUF files of Qwen2 and Qwen3 (llama.cpp's `qwen2` and `qwen3` architectures: q/k/v biases,
per-head q/k norms, rows stored in Hugging Face's order), float32 or Q8_0: greedy output equals
transformers on the same weights token for token, with the head tied to the embeddings or
stored apart."""

from __future__ import annotations

import pytest
from gguf_support import gguf_and_reference
from model_support import hf_greedy, hf_reference, mixed_prompts

from tokenmill.engine import LLM, SamplingParams

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              dtype="float32", quantization="none")
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
             eos_token_id=2)


def _config(arch: str, vocab: int, tied: bool):
    import transformers

    if arch == "qwen2":
        return transformers.Qwen2Config(vocab_size=vocab, tie_word_embeddings=tied,
                                        rope_theta=1e6, **SHAPE)
    # transformers reads no head size from a qwen3 file: Qwen3's 128, whatever the width.
    return transformers.Qwen3Config(vocab_size=vocab, tie_word_embeddings=tied, head_dim=128,
                                    rope_theta=1e6, **SHAPE)


@pytest.mark.parametrize(("arch", "tied", "q8"), [("qwen2", True, False), ("qwen3", False, False),
                                                  ("qwen3", True, True)])
def test_greedy_equals_transformers_on_the_files_weights(tmp_path, smol_source, smol_tokenizer,
                                                         arch, tied, q8):
    path, reference = gguf_and_reference(
        str(tmp_path), arch, _config(arch, len(smol_tokenizer), tied), smol_tokenizer,
        smol_source.gguf_path, q8=q8)
    prompts = mixed_prompts(smol_tokenizer)
    model = hf_reference(reference)
    expected = [hf_greedy(model, p, MAX_NEW) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(path, **ENGINE) as llm:
        assert llm.engine.model_config.model_type == arch
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == expected
