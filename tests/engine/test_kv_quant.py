"""int8 and fp8 KV cache: the quantizer's error bounds, pool sizing, copy-on-write of scales, and
greedy output of engines that store their KV quantized."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.execution.kv_layout import KVCacheLayout
from tokenmill.engine.layers.attention import check_kv_cache_dtype
from tokenmill.engine.layers.kv_quant import dequantize, quantize

INT8, FP8, E5M2 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2


def _rows(seed: int = 0) -> torch.Tensor:
    """[tokens, heads, dim] rows whose magnitudes span six decades, plus a zero row and a row
    with one outlier."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 4, 32, generator=gen)
    x *= 10.0 ** (torch.rand(64, 4, 1, generator=gen) * 6 - 3)
    x[0, 0] = 0.0
    x[1, 2, 5] = 1e4
    return x


def test_int8_round_trip_error_is_at_most_half_a_step():
    x = _rows()
    values, scales = quantize(x, INT8)
    assert values.dtype == INT8 and scales.dtype == torch.float32
    assert values.abs().max() <= 127
    amax = x.abs().amax(-1, keepdim=True)
    err = (dequantize(values, scales, torch.float32) - x).abs()
    # Half a step of amax/127 per element, plus float32 rounding of the divide and multiply.
    assert (err <= amax / 254 * (1 + 1e-5)).all()
    # The largest element of each row lands on +-127 exactly.
    top = values.float().abs().amax(-1)
    assert (top[x.abs().amax(-1) > 0] == 127).all()


def test_fp8_round_trip_error_is_within_the_e4m3_mantissa():
    x = _rows(1)
    values, scales = quantize(x, FP8)
    assert values.dtype == FP8 and values.float().abs().max() <= 448
    err = (dequantize(values, scales, torch.float32) - x).abs()
    # e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 2^-4 of itself; below
    # 2^-6 (subnormal) the step is 2^-9, so at most 2^-10 in scaled units.
    bound = torch.maximum(x.abs() * 2 ** -4, scales.unsqueeze(-1) * 2 ** -10)
    assert (err <= bound * (1 + 1e-5) + 1e-12).all()


def test_fp8_e5m2_round_trip_error_is_within_its_two_mantissa_bits():
    """e5m2 spends a bit of e4m3's mantissa on range: the same scaled rows round by at most
    2^-3 of a normal value; below 2^-14 (subnormal, in scaled units) the step is 2^-16."""
    x = _rows(2)
    values, scales = quantize(x, E5M2)
    assert values.dtype == E5M2 and values.float().abs().max() == 57344
    err = (dequantize(values, scales, torch.float32) - x).abs()
    bound = torch.maximum(x.abs() * 2 ** -3, scales.unsqueeze(-1) * 2 ** -17)
    assert (err <= bound * (1 + 1e-5) + 1e-12).all()
    assert (err > x.abs() * 2 ** -4 * (1 + 1e-5)).any()  # coarser than e4m3's bound


@pytest.mark.parametrize("dtype", [INT8, FP8, E5M2])
def test_a_zero_row_reads_back_as_zeros(dtype):
    x = torch.zeros(3, 2, 8, dtype=torch.bfloat16)
    values, scales = quantize(x, dtype)
    assert torch.equal(scales, torch.ones(3, 2))
    out = dequantize(values, scales, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, x)


def test_bytes_per_token_count_the_scales():
    llama_8b = SimpleNamespace(num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8, hidden_size=4096)

    def per_token(dtype, kv):
        return KVCacheLayout.for_model(llama_8b, 16, dtype, kv).bytes_per_token

    rows = 2 * 32 * 8  # K and V, layers, KV heads
    assert per_token(torch.bfloat16, "auto") == rows * 128 * 2
    assert per_token(torch.bfloat16, "int8") == per_token(torch.bfloat16, "fp8") == rows * 132
    assert per_token(torch.bfloat16, "fp8_e5m2") == rows * 132
    # About 2x the tokens of bfloat16 in the same memory, about 4x those of float32.
    assert Fraction(per_token(torch.bfloat16, "auto"), per_token(torch.bfloat16, "int8")) \
        == Fraction(2 * 128, 132)
    assert Fraction(per_token(torch.float32, "auto"), per_token(torch.float32, "fp8")) \
        == Fraction(4 * 128, 132)


def test_a_fixed_kv_memory_holds_more_blocks_when_quantized(tiny_llama_dir):
    # The tiny Llama: 2 layers, 2 KV heads, head_dim 16, float32 on CPU; blocks of 16 tokens.
    auto_block = 2 * 2 * 2 * 16 * 4 * 16
    quant_block = 2 * 2 * 2 * (16 + 4) * 16
    memory = 25 * math.lcm(auto_block, quant_block)
    engines = {kv: LLM(tiny_llama_dir, show_progress=False, dtype="float32", device="cpu",
                       kv_cache_memory=memory, kv_cache_dtype=kv).engine
               for kv in ("auto", "int8", "fp8")}
    blocks = {kv: e.kv.allocator.num_blocks for kv, e in engines.items()}
    assert blocks["auto"] == memory // auto_block
    assert blocks["int8"] == blocks["fp8"] == memory // quant_block
    assert Fraction(blocks["int8"], blocks["auto"]) == Fraction(4 * 16, 16 + 4)
    stats = {kv: e.kv_cache_stats() for kv, e in engines.items()}
    assert (stats["auto"].dtype, stats["int8"].dtype, stats["fp8"].dtype) == (
        "float32", "int8", "float8_e4m3fn")
    assert stats["int8"].bytes_per_token == quant_block // 16
    assert stats["int8"].tokens_per_gib == (1 << 30) / (quant_block // 16)
    runner = engines["fp8"].runner
    assert runner.kv_pool.dtype == FP8 and runner.kv_scales.dtype == torch.float32
    assert runner.kv_pool.numel() + 4 * runner.kv_scales.numel() == blocks["fp8"] * quant_block
    assert engines["auto"].runner.kv_scales is None
    assert engines["auto"].runner.kv_caches[0].k_scale is None


def test_copy_on_write_copies_values_and_scales(tiny_llama_dir):
    engine = LLM(tiny_llama_dir, show_progress=False, device="cpu", kv_cache_memory=1 << 20,
                 kv_cache_dtype="int8").engine
    runner = engine.runner
    runner.kv_pool.copy_(torch.randint(-127, 128, runner.kv_pool.shape, dtype=torch.int8))
    runner.kv_scales.copy_(torch.rand(runner.kv_scales.shape))
    pool, scales = runner.kv_pool.clone(), runner.kv_scales.clone()
    runner.copy_blocks([(1, 3), (2, 0)])
    pool[:, :, [3, 0]] = pool[:, :, [1, 2]]
    scales[:, :, [3, 0]] = scales[:, :, [1, 2]]
    assert torch.equal(runner.kv_pool, pool) and torch.equal(runner.kv_scales, scales)
    # The per-layer views attention reads are views of the pools, so they see the copies.
    layer = runner.kv_caches[1]
    assert torch.equal(layer.v_scale[3], layer.v_scale[1])


@pytest.mark.parametrize("kv", ["int8", "fp8", "fp8_e5m2"])
def test_forked_sequences_read_their_copied_block_scales(tiny_llama_dir, kv):
    """n=2 shares the prompt's blocks; the first decode copies the partly filled last block.
    Without its scales the copy would read back as zeros and the outputs would change."""
    llm = LLM(tiny_llama_dir, show_progress=False, device="cpu", kv_cache_memory=1 << 20,
              kv_cache_dtype=kv, enable_prefix_caching=False)
    prompt = list(range(300, 321))  # 21 tokens: the second block is partly filled
    params = dict(temperature=0.0, max_tokens=8, ignore_eos=True)
    single = llm.generate([prompt], SamplingParams(**params))[0].outputs[0].token_ids
    forked = llm.generate([prompt], SamplingParams(n=2, **params))[0].outputs
    assert [o.token_ids for o in forked] == [single, single]


def _first_tokens(llm: LLM, prompts, logprobs: int = 0):
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=logprobs)
    return [r.outputs[0] for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("kv,tolerance,flips", [("int8", 0.02, 2), ("fp8", 0.2, 2),
                                               ("fp8_e5m2", 0.4, 4)])
def test_tiny_model_greedy_picks_agree_up_to_near_ties(tiny_llama_dir, kv, tolerance, flips):
    """The random tiny model's next-token distribution is nearly flat (top logprobs ~ -8.4, the
    best two often 1e-5 apart), so a quantized KV may flip a near-tie and greedy runs then go
    apart. What must hold: every token the quantized engine picks first is one the unquantized
    engine scores within `tolerance` (in logprob) of its best; int8 moves logprobs by ~0.005
    here, fp8 by ~0.1, fp8_e5m2 (a mantissa bit less) by more, and flips more of the 12
    near-ties. Longer runs must complete with finite logprobs."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(5, 40))]
               for _ in range(12)]
    options = dict(show_progress=False, device="cpu", kv_cache_memory=1 << 22)
    reference = _first_tokens(LLM(tiny_llama_dir, **options), prompts, logprobs=20)
    quantized = LLM(tiny_llama_dir, kv_cache_dtype=kv, **options)
    agree = 0
    for ref, out in zip(reference, _first_tokens(quantized, prompts), strict=True):
        scores = ref.logprobs[0]
        token = out.token_ids[0]
        assert token in scores and scores[token] >= max(scores.values()) - tolerance
        agree += token == ref.token_ids[0]
    assert agree >= len(prompts) - flips
    long = quantized.generate(prompts[:4], SamplingParams(temperature=0.0, max_tokens=24,
                                                          ignore_eos=True, logprobs=1))
    for r in long:
        assert len(r.outputs[0].token_ids) == 24
        assert all(torch.isfinite(torch.tensor(list(lp.values()))).all()
                   for lp in r.outputs[0].logprobs)


def test_smollm2_answers_the_same_with_an_fp8_kv_cache(smollm2_dir):
    """A real model has real margins: short factual answers are unchanged token for token. fp8
    is the coarser of the two (3 mantissa bits against int8's 127 steps per row), so only fp8
    runs here (on SmolLM2's float32 safetensors copy, which loads in a second)."""
    llm = LLM(str(smollm2_dir), show_progress=False, kv_cache_dtype="fp8",
              kv_cache_memory=64 << 20, device="cpu", dtype="float32")
    questions = ["What is the capital of France?", "Name three primary colors.",
                 "What is 12 times 12?"]
    outs = llm.chat([[{"role": "user", "content": q}] for q in questions],
                    SamplingParams(temperature=0.0, max_tokens=30))
    assert [o.outputs[0].text for o in outs] == [
        "The capital of France is Paris.", "The primary colors are: Red, Blue, and Yellow.",
        "12 times 12 is equal to 120."]


def test_fp8_on_the_triton_backend_needs_compute_capability_8_9(monkeypatch):
    cuda = torch.device("cuda")
    capability = (8, 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    with pytest.raises(ConfigError, match="kv_cache_dtype.*8.9"):
        check_kv_cache_dtype("fp8", "triton", cuda)
    check_kv_cache_dtype("int8", "triton", cuda)
    check_kv_cache_dtype("fp8", "torch", cuda)
    capability = (9, 0)
    check_kv_cache_dtype("fp8", "triton", cuda)
    check_kv_cache_dtype("fp8_e5m2", "triton", cuda)
    capability = (8, 6)
    with pytest.raises(ConfigError, match="fp8_e5m2 with the Triton attention backend.*8.9"):
        check_kv_cache_dtype("fp8_e5m2", "triton", cuda)
    # Triton's CPU interpreter rounds to fp8 wrongly; the torch path runs fp8 on CPU.
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        check_kv_cache_dtype("fp8", "triton", torch.device("cpu"))
    check_kv_cache_dtype("fp8", "torch", torch.device("cpu"))


def test_the_quantized_kv_dtypes_are_supported():
    for kv in ("auto", "int8", "fp8", "fp8_e5m2"):
        EngineConfig(kv_cache_dtype=kv).check_supported()
