"""Gemma 3n (`Gemma3nForCausalLM`, E2B and E4B's language model): AltUp's four streams for
the residual stream, LAuReL beside attention, per-layer inputs (from a table smaller than the
vocabulary here), the last layers reading earlier layers' keys and values, activations cut
at a Gaussian quantile in the first layers, q, k and v normed. Greedy output equals
transformers batched, chunked and from the prefix cache; log-probabilities within 1e-4."""

from __future__ import annotations

import pytest
import torch
from gemma3n_support import gemma3n_config
from model_support import (
    greedy_three_ways,
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
)

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def gemma3n_dir(tmp_path_factory, vocab_tokenizer) -> str:
    return make_random_model(str(tmp_path_factory.mktemp("gemma3n")),
                             gemma3n_config(len(vocab_tokenizer)), vocab_tokenizer,
                             draw_norms=True)


@pytest.fixture(scope="module")
def reference(gemma3n_dir):
    return hf_reference(gemma3n_dir)


@pytest.fixture(scope="module")
def expected(reference, vocab_tokenizer) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


def test_greedy_and_logprobs_equal_transformers(gemma3n_dir, reference, expected,
                                                vocab_tokenizer):
    prompts = mixed_prompts(vocab_tokenizer)
    with LLM(gemma3n_dir, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_tensor_parallelism_is_refused_naming_the_option(gemma3n_dir):
    with pytest.raises(ConfigError, match="tensor_parallel_size: 2: Gemma 3n is served on one"):
        LLM(gemma3n_dir, tensor_parallel_size=2, **ENGINE)


def test_the_multimodal_checkpoint_serves_its_language_model(tmp_path, gemma3n_dir, expected,
                                                             vocab_tokenizer):
    """Gemma 3n's published checkpoints (Gemma3nForConditionalGeneration): the language model
    under model.language_model., beside the vision and audio towers and their embedders,
    which are not read. The same greedy output as the text model's in transformers."""
    import shutil

    import transformers
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "multimodal"
    shutil.copytree(gemma3n_dir, directory)
    text = transformers.AutoConfig.from_pretrained(gemma3n_dir)
    config = transformers.Gemma3nConfig(text_config=text.to_dict())
    config.architectures = ["Gemma3nForConditionalGeneration"]
    (directory / "config.json").unlink()
    config.save_pretrained(directory)
    tensors = {name.replace("model.", "model.language_model.", 1): t
               for name, t in load_file(f"{gemma3n_dir}/model.safetensors").items()}
    for tower in ("model.vision_tower.timm_model.conv_stem.conv.weight",
                  "model.audio_tower.conformer.0.attention.attn.q_proj.weight",
                  "model.embed_vision.embedding.weight", "model.embed_audio.embedding.weight"):
        tensors[tower] = torch.randn(4, 4)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(str(directory), **ENGINE) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected[:3]
