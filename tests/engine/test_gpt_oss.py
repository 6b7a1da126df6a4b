"""GPT-OSS: attention sinks, alternating sliding and full layers, YaRN, and experts of a
clamped SwiGLU with biases behind a biased router. Greedy output equals transformers' token for
token (batched, chunked, from the prefix cache, over two ranks), from the unquantized
checkpoint and from one whose experts are MXFP4 as OpenAI publishes them; the MXFP4 decoding
equals transformers'."""

from __future__ import annotations

import pytest
import torch
from gpt_oss_support import make_gpt_oss, mxfp4_copy
from model_support import REFERENCE, greedy_three_ways, hf_greedy, mixed_prompts

from tokenmill.engine import LLM
from tokenmill.engine.models.mxfp4 import dequantize_mxfp4
from tokenmill.engine.models.source import ModelLoadError

MAX_NEW = 10
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              kv_cache_memory=16 << 20, **REFERENCE)


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory, vocab_tokenizer):
    return make_gpt_oss(str(tmp_path_factory.mktemp("gpt-oss")), vocab_tokenizer)


def _hf_greedy(directory: str, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return [hf_greedy(model, p, MAX_NEW) for p in prompts]


def test_greedy_equals_transformers(gpt_oss_dir, vocab_tokenizer):
    prompts = mixed_prompts(vocab_tokenizer)
    expected = _hf_greedy(gpt_oss_dir, prompts)
    with LLM(gpt_oss_dir, **ENGINE) as llm:
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs["batched"] == expected
    assert runs["again"] == expected
    assert runs["alone"] == expected[-2:]
    # Over two ranks each holds half the heads' sinks and half of every expert's width.
    with LLM(gpt_oss_dir, tensor_parallel_size=2, **ENGINE) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())] == expected


def test_mxfp4_experts_equal_their_dequantized_weights(gpt_oss_dir, tmp_path, vocab_tokenizer):
    import shutil

    reference = shutil.copytree(gpt_oss_dir, tmp_path / "dequantized")
    packed = mxfp4_copy(str(reference), str(tmp_path / "mxfp4"))
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    expected = _hf_greedy(str(reference), prompts)
    with LLM(packed, **ENGINE) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())]
    assert got == expected


def test_mxfp4_decoding_equals_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(110, 140, (3, 5, 2), generator=gen, dtype=torch.uint8)
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [3, 64, 5]
    got = dequantize_mxfp4(blocks, scales, torch.float32)  # [3, 5, 64]
    assert torch.equal(got.transpose(1, 2), expected)
    with pytest.raises(ModelLoadError, match="do not match"):
        dequantize_mxfp4(blocks, scales[:, :4], torch.float32)


def test_an_mxfp4_tensor_without_its_scales_is_refused(gpt_oss_dir, tmp_path):
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    source = shutil.copytree(gpt_oss_dir, tmp_path / "source")
    packed = mxfp4_copy(str(source), str(tmp_path / "mxfp4"))
    path = os.path.join(packed, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="'model.layers.1.mlp.experts.down_proj' has no "
                                             "scales"):
        LLM(packed, **ENGINE)


def _greedy():
    from tokenmill.engine import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def test_a_config_without_swiglu_fields_takes_the_values_the_model_hard_codes(gpt_oss_dir,
                                                                            monkeypatch):
    """Some transformers versions keep no swiglu_alpha (nor swiglu_limit) in GPT-OSS's config;
    its MLP then uses 1.702 and 7.0, and so must the engine."""
    from transformers import AutoConfig, GptOssConfig

    from tokenmill.engine.models.architecture import moe_shape_of

    config = AutoConfig.from_pretrained(gpt_oss_dir)
    for name in ("swiglu_alpha", "swiglu_limit"):
        monkeypatch.delattr(GptOssConfig, name, raising=False)
        config.__dict__.pop(name, None)
        assert not hasattr(config, name)
    assert moe_shape_of(config).swiglu == (1.702, 7.0)
