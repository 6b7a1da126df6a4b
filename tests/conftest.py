"""Shared fixtures: the real SmolLM2 model, its HF reference, and small random-weight models."""

from __future__ import annotations

import pytest
import torch
from model_support import SMOLLM2, make_random_model

from tokenmill.engine import LLM
from tokenmill.engine.models.source import resolve_model


@pytest.fixture(scope="session")
def smol_source():
    return resolve_model(SMOLLM2)


@pytest.fixture(scope="session")
def smol_tokenizer(smol_source):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_source.directory, gguf_file=smol_source.gguf_file)


@pytest.fixture(scope="session")
def smol_llm():
    return LLM(SMOLLM2, show_progress=False)


@pytest.fixture(scope="session")
def smol_hf(smol_source):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        smol_source.directory, gguf_file=smol_source.gguf_file, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smol_tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
    )
    return make_random_model(str(tmp_path_factory.mktemp("tiny-llama")), config, smol_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    return LLM(tiny_llama_dir, show_progress=False)

