"""The CPU's default dtype: bfloat16 only where the cores compute it natively, and not for a
GGUF file's quantized weights."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.execution import cpu_dtype
from tokenmill.engine.execution.cpu_dtype import cpu_flags, default_cpu_dtype


def test_flags_are_read_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\n"
                   "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(x86)) == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert "bf16" in cpu_flags(str(arm))
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_bfloat16_only_with_native_support():
    assert default_cpu_dtype(frozenset({"avx2", "avx512f", "avx512_bf16"})) == torch.bfloat16
    assert default_cpu_dtype(frozenset({"amx_tile", "amx_bf16"})) == torch.bfloat16
    assert default_cpu_dtype(frozenset({"fp", "asimd", "bf16"})) == torch.bfloat16
    assert default_cpu_dtype(frozenset({"avx2", "fma", "avx512f"})) == torch.float32
    assert default_cpu_dtype(frozenset()) == torch.float32
    assert default_cpu_dtype(frozenset({"amx_tile", "amx_bf16"}),
                             quantized_file=True) == torch.float32


def test_the_engine_picks_this_machines_default_and_says_so(tiny_llama_dir, caplog):
    with caplog.at_level("INFO", logger="tokenmill.engine.core.engine"):
        llm = LLM(tiny_llama_dir, show_progress=False, max_model_len=64)
    assert llm.engine.dtype == default_cpu_dtype()
    [record] = [r for r in caplog.records if r.getMessage() == "loading model"]
    assert record.dtype == str(default_cpu_dtype())


def test_the_environment_sets_the_default_for_every_engine(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CPU_DTYPE", "bfloat16")
    assert default_cpu_dtype() == torch.bfloat16
    assert LLM(tiny_llama_dir, show_progress=False, max_model_len=64).engine.dtype == (
        torch.bfloat16)
    # Flags given explicitly are the machine being asked about, not this process's setting.
    assert default_cpu_dtype(frozenset({"avx2"})) == torch.float32
    monkeypatch.setenv("TOKENMILL_CPU_DTYPE", "fp8")
    with pytest.raises(ConfigError, match="^dtype: TOKENMILL_CPU_DTYPE='fp8' is not one of "
                                          "float32, bfloat16, float16$"):
        LLM(tiny_llama_dir, show_progress=False, max_model_len=64)


def test_a_gguf_files_quantized_weights_run_in_float32_on_native_bfloat16_cores(
        tmp_path, monkeypatch, smol_source, smol_tokenizer, tiny_llama_dir):
    """The file's quantization and bfloat16 everywhere else together turn the embedded
    model's greedy answers; its kernels take bfloat16 inside the matmuls anyway. A GGUF file
    of float weights, and any other checkpoint, stay bfloat16 on such cores."""
    import transformers
    from gguf_support import gguf_and_reference

    monkeypatch.delenv("TOKENMILL_CPU_DTYPE", raising=False)
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: frozenset({"amx_tile", "amx_bf16"}))
    config = transformers.LlamaConfig(
        vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    dtypes = {}
    for q8 in (True, False):
        path, _ = gguf_and_reference(str(tmp_path / f"q8-{q8}"), "llama", config,
                                     smol_tokenizer, smol_source.gguf_path, q8=q8)
        for quantization in (None, "none"):
            with LLM(path, show_progress=False, max_model_len=64,
                     quantization=quantization) as llm:
                dtypes[q8, quantization] = llm.engine.dtype
    assert dtypes == {(True, None): torch.float32, (True, "none"): torch.float32,
                      (False, None): torch.bfloat16, (False, "none"): torch.bfloat16}
    assert LLM(tiny_llama_dir, show_progress=False, max_model_len=64).engine.dtype == (
        torch.bfloat16)
