"""KV pool sizing: the budget arithmetic on known figures, the worst-case profiling step (run on
CPU with a probe of known allocator figures in place of CUDA's), and that profiling a serving
engine's model changes nothing it generates."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
from model_support import hf_greedy

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.core.sampler import sample_worst_case
from tokenmill.engine.execution.kv_sizing import (
    CUDA_GRAPH_MARGIN,
    MemoryProfile,
    kv_budget,
    kv_sizing,
    profiled_blocks,
)
from tokenmill.engine.execution.profile_run import (
    MemoryReading,
    profile_memory,
    worst_case_step,
)
from tokenmill.engine.execution.runner import ModelRunner

GIB = 1 << 30
MIB = 1 << 20
# Llama-3.1-8B in bf16 on an H100: 16 GiB of weights, 2 GiB of activations at the largest step.
H100 = MemoryProfile(total=80 * GIB, weights=16 * GIB, peak=18 * GIB, non_torch=GIB)
BLOCK_8B = 2 * MIB  # 16 tokens x 32 layers x K,V x 8 heads x 128 x 2 bytes


def test_budget_is_the_utilized_share_minus_peak_non_torch_and_graph_margin():
    assert CUDA_GRAPH_MARGIN == 512 * MIB
    # 72 GiB usable - 18 GiB peak - 1 GiB outside torch - 0.5 GiB for graphs.
    assert kv_budget(H100, 0.9) == 52 * GIB + 512 * MIB
    assert profiled_blocks(H100, 0.9, BLOCK_8B) == 26_880
    assert H100.activation == 2 * GIB


def test_a_budget_without_a_block_names_gpu_memory_utilization_and_the_figures():
    with pytest.raises(ConfigError) as err:
        profiled_blocks(H100, 0.24, BLOCK_8B)  # 19.2 GiB < 18 + 1 + 0.5
    assert err.value.option == "gpu_memory_utilization"
    message = str(err.value)
    assert "80.00 GiB" in message and "18.00 GiB" in message and "1.00 GiB" in message


def _never() -> MemoryProfile:
    raise AssertionError("profiled although the budget was given")


def test_kv_cache_memory_wins_and_cpu_keeps_its_default_without_profiling():
    given = kv_sizing(EngineConfig(kv_cache_memory=10 * MIB), MIB, "cuda", _never)
    assert (given.blocks, given.budget, given.profile) == (10, 10 * MIB, None)
    cpu = kv_sizing(EngineConfig(), MIB, "cpu", _never)
    assert (cpu.blocks, cpu.log_fields()["source"]) == (1024, "kv_cache_memory")
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        kv_sizing(EngineConfig(kv_cache_memory=MIB - 1), MIB, "cuda", _never)


def test_a_block_count_override_wins_over_memory_and_profile():
    for device, memory in (("cuda", None), ("cpu", 10 * MIB), ("cpu", None)):
        sizing = kv_sizing(EngineConfig(num_gpu_blocks_override=3, kv_cache_memory=memory),
                           MIB, device, _never)
        assert (sizing.blocks, sizing.budget, sizing.profile) == (3, 3 * MIB, None)
        assert sizing.log_fields()["source"] == "num_gpu_blocks_override"


def test_an_attention_free_pool_counts_tokens_and_cuda_checks_that_the_states_fit():
    """Blocks of no bytes (Mamba-2): enough for max_num_seqs sequences of max_model_len twice
    over; on CUDA the profile (the states in its peak) must fit under the utilization."""
    config = EngineConfig(max_num_seqs=4, block_size=16)
    cpu = kv_sizing(config, 0, "cpu", _never, max_model_len=100)
    assert (cpu.blocks, cpu.budget, cpu.log_fields()["source"]) == (2 * 4 * 7, 0,
                                                                     "attention_free")
    assert kv_sizing(config, 0, "cuda", lambda: H100, max_model_len=100).blocks == 56
    with pytest.raises(ConfigError) as err:
        kv_sizing(EngineConfig(gpu_memory_utilization=0.2), 0, "cuda", lambda: H100,
                  state_bytes=GIB, max_model_len=100)
    assert err.value.option == "max_num_seqs" and "1.00 GiB" in str(err.value)


def test_cuda_sizing_uses_the_profile_and_logs_its_figures():
    sizing = kv_sizing(EngineConfig(gpu_memory_utilization=0.9), BLOCK_8B, "cuda", lambda: H100)
    assert sizing.blocks == 26_880
    fields = sizing.log_fields()
    assert fields["source"] == "profiled" and fields["total_bytes"] == 80 * GIB
    assert fields["weights_bytes"] == 16 * GIB and fields["peak_activation_bytes"] == 2 * GIB
    assert fields["non_torch_bytes"] == GIB and fields["gpu_memory_utilization"] == 0.9
    assert fields["budget_bytes"] == kv_budget(H100, 0.9)


@pytest.mark.parametrize("tokens,seqs,max_len,block", [
    (2048, 256, 8192, 16),  # the defaults: one long prompt and 255 decodes
    (2048, 4, 300, 16),     # prompts capped at max_model_len
    (2048, 4, 100, 16),     # the budget exceeds what 4 sequences can hold
    (96, 8, 40, 8),
    (64, 64, 1000, 16),     # every row a decode
    (16, 8, 5, 16),         # max_model_len below the block size
])
def test_worst_case_step_is_a_step_the_scheduler_could_build(tokens, seqs, max_len, block):
    step, num_blocks = worst_case_step(tokens, seqs, max_len, block)
    num_seqs = min(seqs, tokens)
    assert len(step.query_lens) == num_seqs  # the sampler's rows
    assert sum(step.query_lens) == len(step.input_ids) == min(tokens, num_seqs * max_len)
    assert max(step.seq_lens) <= max_len and max(step.positions) < max_len
    assert len(set(step.slots)) == len(step.slots)  # no two tokens write one slot
    start = 0
    for table, q_len, seq_len in zip(step.block_tables, step.query_lens, step.seq_lens,
                                     strict=True):
        assert all(0 <= b < num_blocks for b in table)
        slots = step.slots[start:start + q_len]
        assert all(s // block in table for s in slots)
        assert step.positions[start + q_len - 1] == seq_len - 1
        start += q_len
    # The temporary pool holds the step's tokens plus at most one partial block per prompt
    # and per block of packed decodes.
    assert num_blocks <= sum(step.query_lens) // min(block, max_len) + len(step.query_lens)


class KnownFigures:
    """A MemoryProbe reporting fixed allocator figures; counts the runners alive at each reset
    so the test sees the temporary pool go before profiling returns."""

    def __init__(self) -> None:
        self.readings = [MemoryReading(total=8 * GIB, free=7 * GIB, allocated=100 * MIB,
                                       peak=100 * MIB, reserved=100 * MIB),
                         MemoryReading(total=8 * GIB, free=5 * GIB, allocated=150 * MIB,
                                       peak=600 * MIB, reserved=GIB)]
        self.runners_at_reset: list[int] = []

    def reset(self) -> None:
        gc.collect()
        self.runners_at_reset.append(sum(type(o) is ModelRunner for o in gc.get_objects()))

    def read(self) -> MemoryReading:
        return self.readings.pop(0)


ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=96, max_model_len=64,
              kv_cache_memory=4 * MIB, show_progress=False)
MAX_NEW = 16


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    texts = ["a", "The quick brown fox", "one two three four five six seven eight nine ten"]
    return [smol_tokenizer.encode(t) for t in texts]


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    return [hf_greedy(reference, p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_profiling_leaves_the_engine_untouched_and_greedy_output_unchanged(
        tiny_llama_dir, prompts, expected, kv_cache_dtype):
    llm = LLM(tiny_llama_dir, kv_cache_dtype=kv_cache_dtype, **ENGINE)
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    before = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    if kv_cache_dtype == "auto":
        assert before == expected
    weights = {k: v.clone() for k, v in runner.model.state_dict().items()}
    pool = runner.kv_pool.clone()
    free_blocks = engine.kv.allocator.num_free

    probe = KnownFigures()
    encoded = []  # a model that reads images: its largest batch encoded inside the window
    profile = profile_memory(runner.model, runner.layout, runner.device,
                             runner.attention_backend, probe, max_num_batched_tokens=96,
                             max_num_seqs=8, max_model_len=engine.max_model_len,
                             on_logits=sample_worst_case,
                             on_images=lambda: encoded.append(len(probe.readings)))
    assert encoded == [1]  # between the weights' reading and the peak's

    _, num_blocks = worst_case_step(96, 8, engine.max_model_len, 8)
    temporary_pool = num_blocks * runner.layout.bytes_per_block
    assert profile == MemoryProfile(total=8 * GIB, weights=100 * MIB,
                                    peak=600 * MIB - temporary_pool,
                                    non_torch=3 * GIB - GIB)
    assert probe.runners_at_reset[0] == probe.runners_at_reset[-1] >= 1  # the temporary one is gone
    assert all(torch.equal(v, weights[k]) for k, v in runner.model.state_dict().items())
    assert torch.equal(runner.kv_pool, pool)
    assert engine.kv.allocator.num_free == free_blocks and not engine.has_unfinished_requests()

    # The prompts' blocks are in the prefix cache now: a write into the real pool would show.
    after = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    assert after == before


def test_every_rank_logs_its_sizing(tiny_llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="tokenmill.engine.execution.rank"):
        llm = LLM(tiny_llama_dir, **ENGINE)
    record = next(r for r in caplog.records if r.getMessage() == "kv cache sizing")
    assert record.source == "kv_cache_memory" and record.budget_bytes == 4 * MIB
    assert record.blocks == llm.engine.runner.num_blocks == record.rank_blocks


def test_recurrent_states_that_leave_no_block_name_max_num_seqs():
    """A linear-attention model's states for max_num_seqs sequences are in the profile's
    peak: where they take the room a block needs, the refusal says so and names
    max_num_seqs and the 16-bit states; where even without them no block fits, it names
    gpu_memory_utilization as for any model."""
    heavy = MemoryProfile(total=80 * GIB, weights=16 * GIB, peak=71 * GIB, non_torch=GIB)
    with pytest.raises(ConfigError) as err:
        profiled_blocks(heavy, 0.9, BLOCK_8B, state_bytes=38 * GIB)
    assert err.value.option == "max_num_seqs"
    assert "38.00 GiB" in str(err.value) and "mamba_ssm_cache_dtype bfloat16" in str(err.value)
    with pytest.raises(ConfigError) as err:
        profiled_blocks(heavy, 0.9, BLOCK_8B, state_bytes=MIB)
    assert err.value.option == "gpu_memory_utilization"


def test_the_state_pool_size_is_what_the_runner_allocates():
    import transformers

    from tokenmill.engine.contract.model_shape import recurrent_shape_of
    from tokenmill.engine.execution.recurrent_states import RecurrentStates, state_pool_bytes

    config = transformers.Qwen3_5TextConfig(
        hidden_size=64, num_hidden_layers=4, linear_key_head_dim=8, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4)
    shape = recurrent_shape_of(config)
    states = RecurrentStates(shape, 3, 5, torch.bfloat16, torch.device("cpu"), torch.float32)
    assert state_pool_bytes(shape, 3, 5, torch.bfloat16, torch.float32) == states.nbytes
