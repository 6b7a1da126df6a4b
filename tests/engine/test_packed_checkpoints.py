"""GPTQ and AWQ checkpoints: packed 4- and 8-bit weights dequantized at load.

A random Llama's projections are quantized here and written as AutoGPTQ and AutoAWQ write
them (the packing spelled out field by field from their formats); the engine reading the
packed checkpoint answers as transformers does on the same weights written plainly, token for
token and log-probability for log-probability."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from model_support import hf_logprobs, make_random_model, mixed_prompts, update_config_json
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.models.packed_int import PackedFormat, dequantize_packed
from tokenmill.engine.models.source import ModelLoadError

# AutoAWQ's GEMM packing: the output column each 4-bit field of a word holds, lowest bits up.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP = 32
MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words (held in int64) as the int32 tensors checkpoints store."""
    return (words - (words >= 2 ** 31).long() * 2 ** 32).to(torch.int32)


def _pack_gptq_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """[in, out] -> [in * bits / 32, out]: word i holds rows i * per + j at bit j * bits."""
    per = 32 // bits
    words = torch.zeros(q.shape[0] // per, q.shape[1], dtype=torch.long)
    for j in range(per):
        words |= q[j::per].long() << (j * bits)
    return _to_int32(words)


def _pack_gptq_columns(z: torch.Tensor, bits: int) -> torch.Tensor:
    """[groups, out] -> [groups, out * bits / 32], columns packed as rows are."""
    return _pack_gptq_rows(z.t().contiguous(), bits).t().contiguous()


def _pack_awq(q: torch.Tensor) -> torch.Tensor:
    """[rows, out] -> [rows, out / 8]: field k of word w holds column w * 8 + order[k]."""
    words = torch.zeros(q.shape[0], q.shape[1] // 8, dtype=torch.long)
    for k, column in enumerate(AWQ_ORDER):
        words |= q[:, column::8].long() << (4 * k)
    return _to_int32(words)


def _quantize(w: torch.Tensor, bits: int, symmetric: bool,
              groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min-max quantization of weight [out, in] by groups of input rows (`groups[i]`: row i's
    group): integers q [in, out], zero points and scales [groups, out]."""
    levels = 2 ** bits - 1
    cols = w.t()
    count = int(groups.max()) + 1
    scales = torch.empty(count, w.shape[0])
    zeros = torch.empty(count, w.shape[0], dtype=torch.long)
    for g in range(count):
        rows = cols[groups == g]
        if symmetric:
            scales[g] = rows.abs().amax(0).clamp_min(1e-8) * 2 / levels
            zeros[g] = (levels + 1) // 2
        else:
            low, high = rows.amin(0).clamp_max(0), rows.amax(0).clamp_min(0)
            scales[g] = ((high - low) / levels).clamp_min(1e-8)
            zeros[g] = (-low / scales[g]).round().long().clamp(0, levels)
    scales = scales.half().float()  # the checkpoint keeps them in float16
    q = (cols / scales[groups] + zeros[groups]).round().clamp(0, levels).long()
    return q, zeros, scales


@dataclass(frozen=True)
class Kind:
    method: str  # gptq, awq, compressed (pack-quantized), int8 (compressed int-quantized)
    bits: int
    symmetric: bool = True
    act_order: bool = False
    original_zeros: bool = True  # GPTQ's first format: zero points stored less one
    group: int = GROUP  # 0: one group per output channel


# GPTQ's common checkpoints: 4 bits, symmetric, act-order (g_idx), zero points stored less one;
# 8 bits in GPTQModel's v2 format, asymmetric; AWQ's 4-bit GEMM, asymmetric; llm-compressor's
# W4A16 (symmetric groups) and W8A16 (asymmetric, per channel) packed, and its W8A8-INT8
# (int8 weights as they are, a scale per channel).
KINDS = {"gptq-4bit-act-order": Kind("gptq", 4, act_order=True),
         "gptq-8bit-v2": Kind("gptq", 8, symmetric=False, original_zeros=False),
         "awq-4bit": Kind("awq", 4, symmetric=False),
         "compressed-w4a16": Kind("compressed", 4),
         "compressed-w8a16-asymmetric": Kind("compressed", 8, symmetric=False, group=0),
         "compressed-w8a8-int8": Kind("int8", 8, group=0)}


def _packed_tensors(module: str, weight: torch.Tensor, kind: Kind,
                    gen: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The tensors `kind` writes for one projection's weight [out, in], and the weight they
    stand for."""
    rows = weight.shape[1]
    groups = torch.arange(rows) // (kind.group or rows)
    tensors = {}
    if kind.act_order:  # rows quantized in a permuted order, grouped by their place in it
        order = torch.randperm(rows, generator=gen)
        groups = torch.empty(rows, dtype=torch.long)
        groups[order] = torch.arange(rows) // kind.group
        tensors[f"{module}.g_idx"] = groups.to(torch.int32)
    q, zeros, scales = _quantize(weight, kind.bits, kind.symmetric, groups)
    plain = ((q - zeros[groups]) * scales[groups]).t().contiguous()
    if kind.method == "awq":
        tensors[f"{module}.qweight"], tensors[f"{module}.qzeros"] = _pack_awq(q), _pack_awq(zeros)
        tensors[f"{module}.scales"] = scales.half()
    elif kind.method == "gptq":
        stored = zeros - 1 if kind.original_zeros else zeros
        tensors[f"{module}.qweight"] = _pack_gptq_rows(q, kind.bits)
        tensors[f"{module}.qzeros"] = _pack_gptq_columns(stored & (2 ** kind.bits - 1), kind.bits)
        tensors[f"{module}.scales"] = scales.half()
        # AutoGPTQ writes a bias for every projection, zero where the model has none.
        tensors[f"{module}.bias"] = torch.zeros(weight.shape[0], dtype=torch.float16)
    elif kind.method == "compressed":
        # Signed integers stored plus 2 ** (bits - 1): the unsigned q and zeros as they are.
        tensors[f"{module}.weight_packed"] = _pack_gptq_rows(q, kind.bits).t().contiguous()
        tensors[f"{module}.weight_scale"] = scales.t().contiguous().half()
        tensors[f"{module}.weight_shape"] = torch.tensor(list(weight.shape), dtype=torch.int32)
        if not kind.symmetric:
            tensors[f"{module}.weight_zero_point"] = _pack_gptq_rows(
                zeros.t().contiguous(), kind.bits)
    else:
        tensors[f"{module}.weight"] = (q - zeros[groups]).t().contiguous().to(torch.int8)
        tensors[f"{module}.weight_scale"] = scales.t().contiguous().half()
    return tensors, plain


def _settings(kind: Kind) -> dict[str, Any]:
    """The quantization_config `kind`'s tools write."""
    if kind.method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": kind.group, "version": "gemm",
                "zero_point": True}
    if kind.method == "gptq":
        return {"quant_method": "gptq", "bits": kind.bits, "group_size": kind.group,
                "desc_act": kind.act_order, "sym": kind.symmetric,
                "checkpoint_format": "gptq" if kind.original_zeros else "gptq_v2"}
    weights = {"num_bits": kind.bits, "type": "int", "symmetric": kind.symmetric,
               "strategy": "group" if kind.group else "channel",
               "group_size": kind.group or None}
    return {"quant_method": "compressed-tensors",
            "format": "pack-quantized" if kind.method == "compressed" else "int-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
            "ignore": ["lm_head"]}


def _write(reference: str, directory: str, kind: Kind) -> None:
    """`directory`: `reference`'s checkpoint with every projection written as `kind`'s tool
    writes it; `reference` itself is rewritten with the weights those values stand for."""
    shutil.copytree(reference, directory)
    tensors = load_file(os.path.join(reference, "model.safetensors"))
    packed, plain = {}, {}
    gen = torch.Generator().manual_seed(7)
    for name, tensor in tensors.items():
        module = name.removesuffix(".weight")
        if not module.endswith(PROJECTIONS):
            packed[name] = plain[name] = tensor
            continue
        written, plain[name] = _packed_tensors(module, tensor, kind, gen)
        packed.update(written)
    save_file(packed, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    save_file(plain, os.path.join(reference, "model.safetensors"), metadata={"format": "pt"})
    update_config_json(directory, quantization_config=_settings(kind))


@pytest.fixture(scope="module", params=sorted(KINDS))
def packed(request, tmp_path_factory, vocab_tokenizer) -> tuple[str, str, Kind]:
    """(the packed checkpoint, its weights written plainly, its kind)."""
    from transformers import LlamaConfig

    root = tmp_path_factory.mktemp(request.param)
    config = LlamaConfig(vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2)
    reference = make_random_model(str(root / "plain"), config, vocab_tokenizer)
    directory = str(root / "packed")
    _write(reference, directory, KINDS[request.param])
    return directory, reference, KINDS[request.param]


def test_the_packed_checkpoint_answers_as_its_weights_do(packed, vocab_tokenizer):
    from transformers import AutoModelForCausalLM

    directory, reference, kind = packed
    hf = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    prompts = mixed_prompts(vocab_tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    if kind.method == "int8":  # stored in 8 bits again unless asked otherwise
        with LLM(directory, **ENGINE) as llm:
            assert llm.engine.runner.model.quantization == "int8"
    with LLM(directory, quantization="none", **ENGINE) as llm:
        assert llm.engine.runner.model.quantization is None  # served in the model's dtype
        outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
    for prompt, out in zip(prompts, outputs, strict=True):
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(hf_logprobs(hf, prompt, out.token_ids), abs=1e-4)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            greedy = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW, pad_token_id=0)
        assert out.token_ids == greedy[0, len(prompt):].tolist()


def test_packed_fields_land_where_the_formats_put_them():
    """One word of 0x76543210 holds the fields 0..7 from its lowest bits up: GPTQ reads them as
    eight consecutive input rows, AWQ as the columns 0, 2, 4, 6, 1, 3, 5, 7."""
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    ones = torch.ones(1, 1, dtype=torch.int32)
    zero = torch.zeros(1, 1, dtype=torch.int32)
    gptq = dequantize_packed({"values": word, "zeros": zero, "scales": torch.ones(1, 1)},
                             PackedFormat("gptq", 4, -1, 0), torch.float32)
    assert gptq.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]  # [out 1, in 8]
    awq = dequantize_packed({"values": word.repeat(8, 1), "zeros": zero,
                             "scales": torch.ones(1, 8)}, PackedFormat("awq", 4, 8, 0),
                            torch.float32)
    assert awq[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # out column c, any input row
    # GPTQ's original format stores each zero point less one.
    shifted = dequantize_packed({"values": word, "zeros": ones, "scales": torch.ones(1, 1)},
                                PackedFormat("gptq", 4, -1, 1), torch.float32)
    assert shifted.tolist() == [[-2, -1, 0, 1, 2, 3, 4, 5]]


@pytest.mark.parametrize(("settings", "message"), [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ with 3 bits is not read"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"},
     "AWQ gemv with 4 bits is not read"),
])
def test_formats_the_engine_does_not_read_are_refused_by_name(tmp_path, tiny_llama_dir,
                                                              settings, message):
    directory = str(tmp_path / "model")
    shutil.copytree(tiny_llama_dir, directory)
    update_config_json(directory, quantization_config=settings)
    with pytest.raises(ModelLoadError, match=message):
        LLM(directory, **ENGINE)
