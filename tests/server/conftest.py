"""Fixtures of the server tests.

`server` is the module's own in-process server: SmolLM2, unless the module defines a
`server` fixture of its own. Module-scoped, so each module's metrics and prefix cache start
empty; `server_state`, `base_url` and `client` are its parts. `tiny_server` is one server over
the tiny random model for the whole run, shared by the tests that need no real model.
"""

from __future__ import annotations

import pytest
from model_support import REFERENCE, SMOLLM2
from server_support import in_process_server


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_dir):
    """A short context keeps every request quick (the fuzz test sends whatever the schema
    allows). Tests that change state.options restore them."""
    with in_process_server(tiny_llama_dir, "tiny", max_model_len=128) as server:
        yield server


@pytest.fixture(scope="module")
def server(smollm2_dir):
    """SmolLM2 served under its built-in name (from its safetensors copy, which loads in a
    second; `tokenmill serve`'s own default model is the startup tests')."""
    with in_process_server(str(smollm2_dir), SMOLLM2, **REFERENCE) as server:
        yield server


@pytest.fixture(scope="module")
def server_state(server):
    return server.state


@pytest.fixture(scope="module")
def base_url(server):
    return server.url


@pytest.fixture(scope="module")
def client(server):
    return server.client
