"""--hf-config-path (vLLM's): the model's config.json read from elsewhere. A GGUF file whose
metadata cannot say its head size (transformers reads Qwen3's 128 from every qwen3 file)
runs right from the Hugging Face config; a directory of weights without a config loads from
one beside it; where the flag points at no config, the error names it."""

from __future__ import annotations

import shutil

import pytest
from gguf_support import gguf_and_reference
from model_support import hf_greedy, hf_reference, mixed_prompts

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.core.errors import ModelLoadError
from tokenmill.engine.models.source import ModelNotFound

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              dtype="float32", quantization="none")
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, smol_source, smol_tokenizer) -> tuple[str, str]:
    """A Qwen3 GGUF file of heads of 16 (not the 128 its metadata implies) and the Hugging
    Face checkpoint of the same weights."""
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, rope_theta=1e6)
    return gguf_and_reference(str(tmp_path_factory.mktemp("qwen3")), "qwen3", config,
                              smol_tokenizer, smol_source.gguf_path)


def test_a_gguf_file_runs_from_the_hugging_face_config(qwen3, smol_tokenizer):
    path, reference = qwen3
    prompts = mixed_prompts(smol_tokenizer)
    model = hf_reference(reference)
    expected = [hf_greedy(model, p, MAX_NEW) for p in prompts]
    with LLM(path, hf_config_path=reference, **ENGINE) as llm:
        assert llm.engine.model_config.head_dim == 16
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS)]
    assert got == expected
    with pytest.raises(ModelLoadError):  # its own metadata's heads of 128 do not fit
        LLM(path, **ENGINE)


def test_weights_without_a_config_load_from_one_beside_them(qwen3, smol_tokenizer, tmp_path):
    _, reference = qwen3
    weights = shutil.copytree(reference, tmp_path / "weights")
    (weights / "config.json").rename(tmp_path / "config.json")
    with pytest.raises(ModelNotFound, match="no config.json.*--hf-config-path"):
        LLM(str(weights), **ENGINE)
    prompt = smol_tokenizer.encode("a config from elsewhere")
    with LLM(str(weights), hf_config_path=str(tmp_path / "config.json"), **ENGINE) as llm:
        got = llm.generate([prompt], PARAMS)[0].outputs[0].token_ids
    assert got == hf_greedy(hf_reference(reference), prompt, MAX_NEW)
    with pytest.raises(ModelNotFound, match="--hf-config-path '/nowhere' holds no config"):
        LLM(str(weights), hf_config_path="/nowhere", **ENGINE)
