"""A GGUF file's quantization kept at load: what the default picks, what each linear becomes,
that the kept codes are the file's (rows in Hugging Face order), and the refusals."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.execution import cpu_dtype
from tokenmill.engine.layers.int4_linear import Int4Linear, Int4MergedLinear, int4_supported
from tokenmill.engine.layers.quantized_linear import QuantizedLinear
from tokenmill.engine.models.loader import _gguf_int4_named, _gguf_named, load_config
from tokenmill.engine.models.quantize import auto_quantization, check_gguf_kept

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not int4_supported(CPU), reason="this torch has no CPU int4 mm")


def test_kept_codes_are_the_dequantized_weights_in_hugging_face_row_order(smol_source):
    """Layer 0's Q4_1 tensors: the codes dequantize to exactly the tensors the reference path
    loads, q_proj and k_proj included (llama.cpp's rotary row order undone on both)."""
    config = load_config(smol_source)
    codes = {name: c for name, c in _gguf_int4_named(smol_source, config)
             if name.startswith("model.layers.0.")}
    assert len(codes) == 7
    checked = set()
    for name, tensor, _ in _gguf_named(smol_source, config):
        if name in codes:
            assert torch.equal(codes[name].dequantize(), tensor), name
            checked.add(name.split(".")[-2])
        if len(checked) == len(codes):
            break
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
            "down_proj"} == checked


def test_the_builtin_model_keeps_its_file_quantization_by_default(smol_llm, monkeypatch):
    """As `make serve` starts it on cores with native bfloat16, where the model dtype would
    otherwise be bfloat16: float32 beside the kept codes, and the README's answer."""
    monkeypatch.delenv("TOKENMILL_CPU_DTYPE", raising=False)
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: frozenset({"amx_tile", "amx_bf16"}))
    llm = LLM(show_progress=False, max_model_len=256, kv_cache_memory=16 << 20)
    assert llm.engine.dtype == torch.float32
    reference = smol_llm  # float32, nothing quantized
    model = llm.engine.runner.model
    assert llm.engine.quantization == "gguf" and reference.engine.quantization == "none"
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Int4MergedLinear)
    assert isinstance(layer.mlp.down_proj, Int4Linear)
    # The file stores the tied embeddings as Q8_0: the head reads int8, lookups stay float.
    assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.weight.dtype == torch.int8
    assert model.model.embed_tokens.weight.dtype == llm.engine.dtype
    kept, full = (e.engine.memory_report() for e in (llm, reference))
    assert kept["weights_bytes"] < 0.45 * full["weights_bytes"]
    # A step reads the embedding table only at its rows once the head no longer shares it.
    table = model.model.embed_tokens.weight.nbytes
    assert kept["step_weights_bytes"] == kept["weights_bytes"] - table
    assert full["step_weights_bytes"] == full["weights_bytes"]  # tied: the head reads it all
    params = SamplingParams(temperature=0.0, max_tokens=24)
    prompt = "The capital of France is"
    [out] = llm.generate([prompt], params)
    [ref] = reference.generate([prompt], params)
    # Different weights' precision, same model: the answer starts the same way.
    assert "Paris" in out.outputs[0].text and "Paris" in ref.outputs[0].text
    [answer] = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                        SamplingParams(temperature=0.0, max_tokens=16))
    assert answer.outputs[0].text == "The capital of France is Paris."
    assert llm.engine.kv.allocator.num_used == 0


def test_auto_keeps_only_what_the_cpu_kernels_take_on_one_rank():
    q4 = {"model.layers.0.self_attn.q_proj.weight": "Q4_1", "model.norm.weight": "F32"}
    assert auto_quantization(q4, CPU, 1) == "gguf"
    assert auto_quantization(q4, CPU, 2) is None
    assert auto_quantization(q4, torch.device("meta"), 1) is None
    assert auto_quantization({"model.layers.0.mlp.up_proj.weight": "F16"}, CPU, 1) is None
    assert auto_quantization({}, CPU, 1) is None  # safetensors


def test_gguf_is_refused_where_it_cannot_run(tiny_llama_dir):
    with pytest.raises(ConfigError, match="quantization: gguf keeps a GGUF file"):
        LLM(tiny_llama_dir, quantization="gguf", show_progress=False)
    with pytest.raises(ConfigError, match="quantization: gguf runs on the CPU only"):
        check_gguf_kept(torch.device("cuda"), 1, "model.gguf")
    with pytest.raises(ConfigError, match="quantization: gguf runs with tensor_parallel_size 1"):
        check_gguf_kept(CPU, 2, "model.gguf")
    with pytest.raises(ConfigError, match="quantization: 'int4' is not one of"):
        LLM(tiny_llama_dir, quantization="int4", show_progress=False)
