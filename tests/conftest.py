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


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_dir):
    """(base URL, ServerState) of a server over the tiny random model, shared by the server
    tests that need no real model. A short context keeps every request quick (the fuzz test
    sends whatever the schema allows). Tests that change state.options restore them."""
    from server_support import running_server

    from tokenmill.engine import EngineConfig
    from tokenmill.engine.metrics import EngineMetrics
    from tokenmill.engine.server.state import ServerOptions, ServerState

    state = ServerState(ServerOptions(served_model_name="tiny"),
                        EngineConfig(model=tiny_llama_dir, max_model_len=128),
                        EngineMetrics("tiny"))
    state.load(show_progress=False)
    with running_server(state) as url:
        yield url, state
