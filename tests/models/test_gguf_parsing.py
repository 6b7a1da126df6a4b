"""The engine's GGUF parsing reads the same fields and tensors as gguf's own reader, from the
same memory mapping, and leaves gguf as it found it."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from model_support import SMOLLM2, smollm2_installed

pytestmark = pytest.mark.skipif(not smollm2_installed(), reason="needs the built-in SmolLM2")


@pytest.fixture(scope="module")
def gguf_path() -> str:
    from tokenmill.engine.models.source import resolve_model

    return resolve_model(SMOLLM2).gguf_path


def test_every_field_and_tensor_equals_gguf_s_reader(gguf_path):
    import gguf

    from tokenmill.engine.models.gguf_weights import open_gguf

    fast, plain = open_gguf(gguf_path), gguf.GGUFReader(gguf_path)
    assert type(fast) is not gguf.GGUFReader and isinstance(fast, gguf.GGUFReader)
    assert list(fast.fields) == list(plain.fields)
    assert len(fast.fields["tokenizer.ggml.tokens"].data) > 40_000
    for name, field in plain.fields.items():
        mine = fast.fields[name]
        assert (mine.types, mine.data, mine.offset) == (field.types, field.data, field.offset)
        assert len(mine.parts) == len(field.parts)
        assert all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts, strict=True))
    assert [t.name for t in fast.tensors] == [t.name for t in plain.tensors]
    for mine, theirs in zip(fast.tensors, plain.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type
        assert np.array_equal(mine.shape, theirs.shape)
        assert np.array_equal(mine.data, theirs.data)
    # Still the file's mapping, read-only, not a copy of the file in memory.
    base = fast.data
    while not isinstance(base, mmap.mmap):
        assert not isinstance(base, np.ndarray) or not base.flags.owndata
        base = base.base
    assert not fast.data.flags.writeable


def test_a_load_parses_the_file_once_and_gguf_is_restored_after(gguf_path):
    """The config and the tokenizer (transformers' own readers) and the weights' types all
    come from one parse."""
    import gguf

    from tokenmill.engine.models import gguf_weights, loader
    from tokenmill.engine.models.source import resolve_model

    source = resolve_model(SMOLLM2)
    for cached in (gguf_weights._parse, loader._gguf_config, loader._gguf_tokenizer):
        cached.cache_clear()
    config, tokenizer = loader.load_config(source), loader.load_tokenizer(source)
    types = gguf_weights.gguf_tensor_types(gguf_path)
    assert gguf_weights._parse.cache_info().misses == 1
    assert config.num_hidden_layers == 30 and len(tokenizer) == 49152
    assert types["model.layers.0.self_attn.q_proj.weight"] == "Q4_1"
    assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader

    name_map = gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="stop"), gguf_weights.fast_gguf_parsing():
        assert gguf.GGUFReader(gguf_path) is gguf_weights.parsed(gguf_path)
        raise RuntimeError("stop")
    assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader
    assert gguf.get_tensor_name_map is name_map
