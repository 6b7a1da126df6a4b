"""Read GGUF tensors under Hugging Face parameter names: dequantized to float32, or, for the
4-bit block types (Q4_0, Q4_1), as the int4 codes, scales and offsets they are stored as."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tokenmill.engine.layers.int4_linear import GROUP_SIZE, Int4Weight
from tokenmill.engine.models.source import ModelLoadError

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Mixture-of-experts GGUF files stack each layer's experts in one tensor (and transformers
# reads only part of their shape from the metadata): not read here.
MOE_GGUF_REFUSAL = ("a mixture of experts, which tokenmill serves from safetensors checkpoints "
                    "only; serve the model's Hugging Face checkpoint (hf://ORG/NAME) instead "
                    "of its GGUF file")
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 4 and parts[2].startswith(("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                                                "ffn_down_exps")):
        raise ModelLoadError(f"GGUF tensor {gguf_name!r} belongs to {MOE_GGUF_REFUSAL}")
    raise ModelLoadError(f"GGUF tensor {gguf_name!r} is not part of a supported architecture")


class _PlainArrayReader:
    """Mixed into gguf's reader: the file stays memory-mapped, but the reader slices it as a
    plain array. Parsing slices it once per metadata value (a tokenizer's whole vocabulary
    and merges), and each slice of a numpy memmap builds a memmap object, which costs most
    of the parse; a plain array's slice is the same bytes at a fraction of the cost."""

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        self._plain = mapped.view(np.ndarray)


@functools.cache
def _fast_reader_class() -> type:
    from gguf.gguf_reader import GGUFReader  # the class itself, which the package name stands for

    return type("PlainArrayGGUFReader", (_PlainArrayReader, GGUFReader), {})


@functools.cache
def _name_map(arch: Any, n_blocks: int) -> Any:
    import gguf

    return gguf.TensorNameMap(arch, n_blocks)


@contextlib.contextmanager
def fast_gguf_parsing() -> Iterator[None]:
    """transformers' reading of a GGUF file (its config, tokenizer or weights), the same values
    in a fraction of the time: the reader it builds is the file's one parse (`parsed`), and
    the tensor-name map it asks gguf for once per tensor is built once per architecture."""
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = _shared_reader, _name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def _shared_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
    if mode != "r":  # a writable mapping is the caller's own
        return _fast_reader_class()(path, mode)
    return parsed(str(path))


def parsed(path: str) -> Any:
    """The file's reader, parsed once while the file is unchanged: parsing the metadata (a
    tokenizer's whole vocabulary) takes seconds, and a load reads the file up to three times
    (its config, its tokenizer, its weights)."""
    stat = os.stat(path)
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _parse(path: str, mtime_ns: int, size: int) -> Any:
    return _fast_reader_class()(path)


def open_gguf(path: str) -> Any:
    """`parsed`, a file that cannot be parsed refused in one line."""
    try:
        return parsed(path)
    except Exception as exc:  # a truncated or corrupt file
        raise ModelLoadError.reading(f"the weights in {path}", exc) from exc


def gguf_tensors(path: str) -> Iterator[tuple[str, torch.Tensor, int]]:
    """(HF name, float32 tensor, number of tensors) for every tensor in the file."""
    import gguf

    reader = open_gguf(path)
    total = len(reader.tensors)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        array = np.array(data, dtype=np.float32, copy=True).reshape(shape)
        yield hf_name(t.name), torch.from_numpy(array), total


# Bytes per block of 32 weights before the 16 bytes of nibbles: a float16 scale d (Q4_0:
# w = (q - 8) d), or d and an offset m (Q4_1: w = q d + m).
INT4_TYPES = {"Q4_0": 2, "Q4_1": 4}
# The storage types of plain floats: a tensor of any other type is quantized.
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


def gguf_tensor_types(path: str) -> dict[str, str]:
    """{HF name: GGUF storage type name (F32, Q4_1, Q8_0, ...)} for every tensor in the file."""
    return {hf_name(t.name): t.tensor_type.name for t in open_gguf(path).tensors}


def gguf_quantized(path: str) -> bool:
    """Whether any tensor of the file is stored quantized (in blocks of small integers, not
    as floats)."""
    return any(t.tensor_type.name not in FLOAT_TYPES for t in open_gguf(path).tensors)


def gguf_int4_tensors(path: str) -> Iterator[tuple[str, Int4Weight]]:
    """(HF name, codes) for every Q4_0 and Q4_1 tensor: the stored blocks, not dequantized."""
    for t in open_gguf(path).tensors:
        if t.tensor_type.name in INT4_TYPES:
            shape = tuple(int(d) for d in reversed(t.shape))
            yield hf_name(t.name), int4_blocks(np.asarray(t.data), t.tensor_type.name, shape)


def int4_blocks(data: np.ndarray, type_name: str, shape: tuple[int, int]) -> Int4Weight:
    """The codes, scales and offsets of a Q4_0 or Q4_1 tensor's raw blocks ([rows, bytes])."""
    rows, columns = shape
    head = INT4_TYPES[type_name]
    blocks = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True).reshape(
        rows, columns // GROUP_SIZE, head + GROUP_SIZE // 2))
    d = blocks[..., :2].contiguous().view(torch.float16)[..., 0].float()
    nibbles = blocks[..., head:]
    # Byte j holds weight j in its low nibble and weight j + 16 in its high one.
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).reshape(rows, columns)
    if type_name == "Q4_0":
        zero = torch.zeros_like(d)
    else:
        m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0].float()
        zero = m + 8 * d
    return Int4Weight(codes, d, zero)
