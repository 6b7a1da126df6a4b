"""4-bit linears: a GGUF file's Q4_0/Q4_1 blocks read as int4 codes exactly, and the CPU int4
kernel's output against a float matmul over the same (dequantized) weight."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokenmill.engine.layers.int4_linear import (
    DEQUANTIZE_FROM_ROWS,
    GROUP_SIZE,
    Int4Linear,
    Int4MergedLinear,
    Int4Weight,
    int4_supported,
    quantize_int4,
)
from tokenmill.engine.models.gguf_weights import int4_blocks

gguf = pytest.importorskip("gguf")
CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not int4_supported(CPU), reason="this torch has no CPU int4 mm")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_blocks_read_as_codes_dequantize_exactly_as_gguf_does(kind):
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((48, 256)) * rng.uniform(0.01, 2, (48, 1))).astype(np.float32)
    weights[3] += 5  # a row far from zero: Q4_1's offset matters
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    blocks = gguf.quants.quantize(weights, qtype)
    expected = torch.from_numpy(np.asarray(gguf.quants.dequantize(blocks, qtype), np.float32))
    codes = int4_blocks(blocks, kind, (48, 256))
    assert codes.codes.dtype == torch.uint8 and int(codes.codes.max()) <= 15
    assert torch.equal(codes.dequantize(), expected)


def test_the_builtin_files_4bit_tensors_read_exactly(smol_source):
    reader = gguf.GGUFReader(smol_source.gguf_path)
    checked = 0
    for t in reader.tensors:
        if t.tensor_type.name != "Q4_1" or checked == 3:
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        expected = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        codes = int4_blocks(np.asarray(t.data), "Q4_1", shape)
        assert torch.equal(codes.dequantize(), torch.from_numpy(expected).reshape(shape))
        checked += 1
    assert checked == 3


def test_quantize_int4_is_within_half_a_step_of_every_weight():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * torch.rand(64, 1) * 3
    w[5, :GROUP_SIZE] = 0.25  # a flat group: scale 0, reproduced exactly
    codes = quantize_int4(w)
    err = (codes.dequantize() - w).abs().unflatten(1, (-1, GROUP_SIZE)).amax(2)
    assert (err <= codes.scale / 2 + 1e-6).all()
    assert torch.equal(codes.dequantize()[5, :GROUP_SIZE], w[5, :GROUP_SIZE])


@pytest.mark.parametrize("rows", [1, 7, 33, DEQUANTIZE_FROM_ROWS, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_linear_equals_a_float_matmul_over_the_dequantized_weight(rows, dtype):
    """The kernel computes in bfloat16 (activations, scales and offsets rounded to it), so it
    matches the float32 matmul over the same codes to bfloat16's precision; from
    DEQUANTIZE_FROM_ROWS rows the layer's own float matmul does too."""
    torch.manual_seed(rows)
    codes = quantize_int4(torch.randn(96, 192))
    bias = torch.randn(96, dtype=dtype)
    layer = Int4Linear(codes, bias)
    x = torch.randn(rows, 192, dtype=dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (rows, 96)
    expected = F.linear(x.float(), codes.dequantize()) + bias.float()
    scale = expected.abs().max()
    assert (y.float() - expected).abs().max() <= 0.02 * scale


def test_merged_int4_linear_splits_its_parts_like_separate_layers():
    torch.manual_seed(1)
    parts = {"q_proj": 64, "k_proj": 32, "v_proj": 32}
    weights = {name: quantize_int4(torch.randn(n, 64)) for name, n in parts.items()}
    merged = Int4MergedLinear(Int4Weight.cat(list(weights.values())), None, parts)
    x = torch.randn(3, 64)
    for got, name in zip(merged(x), parts, strict=True):
        torch.testing.assert_close(got, Int4Linear(weights[name], None)(x))


def test_inputs_not_in_groups_of_32_are_refused():
    codes = Int4Weight(torch.zeros(8, 48, dtype=torch.uint8), torch.ones(8, 1), torch.zeros(8, 1))
    with pytest.raises(ValueError, match="groups of 32"):
        Int4Linear(codes, None)


UNPACK_CHECK = """
import torch
from tokenmill.engine.layers.int4_linear import INNER_K_TILES, kernel_packing, unpack_codes
seeded = torch.Generator().manual_seed(1)
for shape in [(16, 32), (32, 32), (48, 64), (96, 192), (112, 64), (960, 576), (576, 1536)]:
    codes = torch.randint(0, 16, shape, dtype=torch.int32, generator=seeded)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES)
    assert torch.equal(unpack_codes(packed, *shape).to(torch.int32), codes), shape
print(torch.backends.cpu.get_cpu_capability(), *kernel_packing())
"""


@pytest.mark.parametrize("capability", [None, "avx2", "default"])
def test_unpacking_reads_the_kernels_packing_exactly(capability):
    """Whole blocks and a partial one, with the kernel build torch picks for this CPU and, in
    processes that force them (ATEN_CPU_CAPABILITY), the AVX2 and the portable builds: each
    packs its own way, so each layout is checked on any x86 machine with AVX2."""
    native = torch.backends.cpu.get_cpu_capability()
    if native not in ("AVX2", "AVX512"):
        pytest.skip(f"the int4 packing layouts are known for x86 CPUs with AVX2 (this: {native})")
    forced = {} if capability is None else {"ATEN_CPU_CAPABILITY": capability}
    result = subprocess.run([sys.executable, "-c", UNPACK_CHECK], capture_output=True,
                            text=True, check=True, env={**os.environ, **forced})
    built, block, halves = result.stdout.split()
    assert built == (capability or native).upper()
    assert (int(block), halves) == {"AVX512": (64, "True"), "AVX2": (32, "True"),
                                    "DEFAULT": (32, "False")}[built]


def test_many_rows_multiply_by_the_weight_the_kernel_multiplies_by():
    """The float path's weight is the kernel's: with a one-hot input row the kernel returns a
    column of its own weight (in bfloat16), and the float path's weight equals it to that
    rounding; a prompt's rows through both paths agree as closely as the kernel allows."""
    torch.manual_seed(3)
    codes = quantize_int4(torch.randn(64, 128) * 3 + 1)
    layer = Int4Linear(codes, None)
    assert layer.unpacks
    eye = torch.eye(128, dtype=torch.bfloat16)
    kernel_weight = torch.ops.aten._weight_int4pack_mm_for_cpu(
        eye, layer.weight, GROUP_SIZE, layer.scales_and_zeros).t().float()
    torch.testing.assert_close(layer.dequantized(), kernel_weight, rtol=2 ** -8, atol=1e-6)
    # The stored bfloat16 scales are those of the codes' float32 ones, rounded.
    assert (layer.dequantized() - codes.dequantize()).abs().max() <= 0.02 * codes.dequantize(
        ).abs().max()
    x = torch.randn(DEQUANTIZE_FROM_ROWS, 128)
    float_path = layer(x)
    kernel_path = torch.cat([layer(row) for row in x.split(DEQUANTIZE_FROM_ROWS - 1)])
    assert (float_path - kernel_path).abs().max() <= 0.02 * float_path.abs().max()
    torch.testing.assert_close(float_path, F.linear(x, layer.dequantized()))
    # bfloat16 rows are multiplied in float32 too (a bfloat16 matmul is slow on CPUs without
    # native bfloat16), then rounded once.
    half = x.bfloat16()
    assert torch.equal(layer(half), F.linear(half.float(), layer.dequantized()).bfloat16())
