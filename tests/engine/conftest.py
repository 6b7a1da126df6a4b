"""Fixtures the engine's model-family tests share."""

from __future__ import annotations

import pytest
from model_support import mixed_prompts


@pytest.fixture(scope="module")
def prompts(vocab_tokenizer) -> list[list[int]]:
    """Short and long prompts over the vocabulary tokenizer (model_support.mixed_prompts); a
    module that needs others defines its own."""
    return mixed_prompts(vocab_tokenizer)
