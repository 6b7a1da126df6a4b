"""Phi-3 and Phi-4 (`Phi3ForCausalLM`): their checkpoints store q/k/v as one `qkv_proj` and
gate/up as one `gate_up_proj`. Greedy output equals transformers token for token (batched,
chunked, from the prefix cache, past a sliding window, under tensor parallelism); what the
engine does not compute is refused by name."""

from __future__ import annotations

import pytest
import torch
from model_support import greedy_three_ways, hf_greedy, make_random_model, mixed_prompts
from safetensors import safe_open

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.fused_weights import RowWindow, fused_parts
from tokenmill.engine.models.source import ModelLoadError

MAX_NEW = 8
WINDOW = 16
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def _config(vocab: int, **changes):
    import transformers

    return transformers.Phi3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **changes)


@pytest.fixture(scope="module", params=["full", "sliding"])
def phi3_dir(request, tmp_path_factory, vocab_tokenizer) -> str:
    window = WINDOW if request.param == "sliding" else None
    directory = str(tmp_path_factory.mktemp(f"phi3-{request.param}"))
    return make_random_model(directory, _config(len(vocab_tokenizer), sliding_window=window),
                             vocab_tokenizer)


@pytest.fixture(scope="module")
def expected(phi3_dir, vocab_tokenizer) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(phi3_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None  # as ignore_eos
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


def test_partial_rotary_embeddings_are_refused_by_name(tmp_path, vocab_tokenizer):
    """Phi-4-mini turns only three quarters of each head: not computed here."""
    config = _config(len(vocab_tokenizer), partial_rotary_factor=0.75)
    directory = make_random_model(str(tmp_path / "m"), config, vocab_tokenizer)
    with pytest.raises(ModelLoadError, match="partial_rotary_factor 0.75"):
        LLM(directory, **ENGINE)


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
