"""Phi-3 and Phi-4 (`Phi3ForCausalLM`): their checkpoints store q/k/v as one `qkv_proj` and
gate/up as one `gate_up_proj`; Phi-3.5 and Phi-4-mini stretch their context with LongRoPE, and
Phi-4-mini rotates three quarters of each head. Greedy output equals transformers token for
token (batched, chunked, from the prefix cache, past a sliding window, under tensor
parallelism, within and past the original context); what the engine does not compute is
refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from model_support import (
    greedy_three_ways,
    hf_greedy,
    hf_reference,
    make_random_model,
    mixed_prompts,
)
from safetensors import safe_open

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.fused_weights import RowWindow, fused_parts
from tokenmill.engine.models.source import ModelLoadError

MAX_NEW = 8
WINDOW = 16
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def _config(vocab: int, **changes):
    import transformers

    settings = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                    pad_token_id=0, tie_word_embeddings=False)
    return transformers.Phi3Config(**(settings | changes))


@pytest.fixture(scope="module", params=["full", "sliding"])
def phi3_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    window = WINDOW if request.param == "sliding" else None
    directory = str(tmp_path_factory.mktemp(f"phi3-{request.param}"))
    return make_random_model(directory, _config(len(vocab_tokenizer), sliding_window=window),
                             vocab_tokenizer)


@pytest.fixture(scope="module")
def expected(phi3_dir, vocab_tokenizer) -> list[list[int]]:
    model = hf_reference(phi3_dir, attn_implementation="eager")
    return [hf_greedy(model, p, MAX_NEW) for p in mixed_prompts(vocab_tokenizer)]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_the_checkpoint_stores_fused_projections(phi3_dir):
    with safe_open(f"{phi3_dir}/model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(n.endswith((".q_proj.weight", ".up_proj.weight")) for n in names)


def test_greedy_equals_hf_batched_chunked_and_prefix_cached(phi3_dir, expected,
                                                            vocab_tokenizer):
    prompts = mixed_prompts(vocab_tokenizer)
    assert max(len(p) for p in prompts) > 3 * WINDOW
    with LLM(phi3_dir, **ENGINE) as llm:
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_tensor_parallel_equals_hf(phi3_dir, expected, vocab_tokenizer):
    """Each rank reads only its rows of every part of the fused tensors."""
    with LLM(phi3_dir, tensor_parallel_size=2, **ENGINE) as llm:
        assert _greedy(llm, mixed_prompts(vocab_tokenizer)) == expected


def test_parts_are_row_ranges_of_the_fused_tensor():
    config = _config(100)  # 4 heads of 16, 2 KV heads, MLP width 128
    assert fused_parts(config, "model.layers.2.self_attn.qkv_proj.weight") == [
        ("model.layers.2.self_attn.q_proj.weight", 0, 64),
        ("model.layers.2.self_attn.k_proj.weight", 64, 96),
        ("model.layers.2.self_attn.v_proj.weight", 96, 128)]
    assert fused_parts(config, "model.layers.0.mlp.gate_up_proj.weight") == [
        ("model.layers.0.mlp.gate_proj.weight", 0, 128),
        ("model.layers.0.mlp.up_proj.weight", 128, 256)]
    assert fused_parts(config, "model.layers.0.self_attn.o_proj.weight") is None
    fused = torch.arange(40.0).reshape(10, 4)
    window = RowWindow(fused, 6, 10)
    assert window.shape == (4, 4)
    assert torch.equal(window[:], fused[6:10]) and torch.equal(window[1:3], fused[7:9])
    with pytest.raises(IndexError):
        window[:, 0:2]


ORIGINAL_CONTEXT = 32


@pytest.fixture(scope="module")
def phi4_mini_dir(tmp_path_factory, vocab_tokenizer) -> str:
    """Phi-4-mini's layout: tied embeddings, LongRoPE from a 32-token original context to 256,
    over 12 of each 16-wide head (6 frequencies, each with its own short and long factor)."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
            "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0]}
    config = _config(len(vocab_tokenizer), tie_word_embeddings=True, partial_rotary_factor=0.75,
                     max_position_embeddings=256, rope_scaling=rope,
                     original_max_position_embeddings=ORIGINAL_CONTEXT)
    directory = make_random_model(str(tmp_path_factory.mktemp("phi4-mini")), config,
                                  vocab_tokenizer)
    _write_rope_as_the_hub_does(directory, dict(rope, type=rope.pop("rope_type")))
    return directory


def _write_rope_as_the_hub_does(directory: str, rope_scaling: dict) -> None:
    """Phi's config.json on the hub keeps the older layout: rope_scaling with "type",
    rope_theta and partial_rotary_factor at the top level."""
    path = Path(directory, "config.json")
    config = json.loads(path.read_text())
    parameters = config.pop("rope_parameters", None)
    if parameters:
        config.update(rope_theta=parameters["rope_theta"],
                      partial_rotary_factor=parameters["partial_rotary_factor"])
    config["rope_scaling"] = rope_scaling
    path.write_text(json.dumps(config))


def _hf_greedy_of(directory: str, prompts: list[list[int]]) -> list[list[int]]:
    model = hf_reference(directory, attn_implementation="eager")
    return [hf_greedy(model, p, MAX_NEW) for p in prompts]


def test_longrope_within_the_original_context_equals_hf(phi4_mini_dir, vocab_tokenizer):
    """--max-model-len within the original context: the short factors, as transformers uses
    for such sequences; under tensor parallelism too."""
    prompts = [vocab_tokenizer.encode(t) for t in ("a", "The quick brown fox",
                                                   "one two three four five six seven")]
    assert max(len(p) for p in prompts) + MAX_NEW <= ORIGINAL_CONTEXT
    expected = _hf_greedy_of(phi4_mini_dir, prompts)
    for tp in (1, 2):
        with LLM(phi4_mini_dir, max_model_len=ORIGINAL_CONTEXT, tensor_parallel_size=tp,
                 **ENGINE) as llm:
            assert _greedy(llm, prompts) == expected, f"tensor_parallel_size={tp}"


def test_longrope_past_the_original_context_equals_hf(phi4_mini_dir, vocab_tokenizer):
    """The default --max-model-len (256) runs past the original context: the long factors,
    as transformers uses for a sequence that long; batched, chunked and prefix-cached."""
    prompts = [p for p in mixed_prompts(vocab_tokenizer) if len(p) > ORIGINAL_CONTEXT]
    assert len(prompts) == 3
    expected = _hf_greedy_of(phi4_mini_dir, prompts)
    with LLM(phi4_mini_dir, **ENGINE) as llm:
        assert llm.engine.max_model_len == 256
        runs = greedy_three_ways(llm, prompts, MAX_NEW)
    assert runs == {"batched": expected, "again": expected, "alone": expected[-2:]}


def test_rope_that_cannot_work_is_refused_by_name(phi4_mini_dir, tmp_path):
    """A LongRoPE factor list that does not match the rotated width (6 frequencies, 5
    factors) is refused at load, in one line naming the field."""
    directory = str(shutil.copytree(phi4_mini_dir, tmp_path / "m"))
    _write_rope_as_the_hub_does(directory, {"type": "longrope", "short_factor": [1.0] * 5,
                                            "long_factor": [1.0] * 6})
    with pytest.raises(ModelLoadError, match="short_factor") as refused:
        LLM(directory, **ENGINE)
    assert "\n" not in str(refused.value)


def test_a_phi3_gguf_is_refused_by_name(phi3_dir):
    from transformers import AutoConfig

    from tokenmill.engine.models.loader import build_model
    from tokenmill.engine.models.source import ModelSource

    source = ModelSource(directory=phi3_dir, gguf_file="Phi-3-mini-4k-instruct-q4.gguf")
    with pytest.raises(ModelLoadError, match="q4.gguf holds a Phi-3 model"):
        build_model(AutoConfig.from_pretrained(phi3_dir), source, 64, torch.float32,
                    torch.device("cpu"))


def test_a_lora_adapter_on_the_fused_projections_equals_peft(phi3_dir, tmp_path,
                                                             vocab_tokenizer):
    """PEFT adapts qkv_proj and gate_up_proj whole: each part gets the same A and its rows
    of B."""
    from lora_support import Adapter, make_adapter, peft_greedy

    adapter = make_adapter(phi3_dir, str(tmp_path / "a"),
                           Adapter("a", 4, 8, ["qkv_proj", "o_proj", "gate_up_proj",
                                               "down_proj"]))
    prompts = mixed_prompts(vocab_tokenizer)[:3]
    want = peft_greedy(phi3_dir, adapter, prompts, MAX_NEW)
    assert want != peft_greedy(phi3_dir, None, prompts, MAX_NEW)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(phi3_dir, enable_lora=True, max_lora_rank=4, lora_modules=(f"a={adapter}",),
             **ENGINE) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora="a")]
    assert got == want
