"""The host tier of the KV cache never changes an output: prefixes evicted from a small device
pool come back from host memory by copy and decode exactly as when recomputed (and as Hugging
Face does), under chunked prefill, n > 1 and an int8 KV cache, and no block leaks in either
tier after aborts and preemptions."""

from __future__ import annotations

import random

import pytest
import torch
from kv_offload_support import random_transfers
from model_support import hf_greedy

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.execution.kv_layout import KVCacheLayout
from tokenmill.engine.execution.kv_offload import KVOffload

MAX_NEW = 10
DEVICE_BLOCKS = 8   # of 16 tokens: two 50-token conversations at a time
HOST_BLOCKS = 64


def _conversations() -> list[list[int]]:
    """Four 50-token prompts, then each one's next turn (its prompt plus 20 more tokens)."""
    rng = random.Random(3)
    first = [[rng.randrange(100, 30000) for _ in range(50)] for _ in range(4)]
    return first + [p + [rng.randrange(100, 30000) for _ in range(20)] for p in first]


def _engine(directory: str, offload: bool, **options) -> LLM:
    """DEVICE_BLOCKS in the device pool and HOST_BLOCKS in the host tier, on every rank."""
    tp = options.get("tensor_parallel_size", 1)
    layout = KVCacheLayout.for_model(_config(directory), 16, torch.float32,
                                     options.get("kv_cache_dtype", "auto"), tp)
    return LLM(directory, show_progress=False, kv_cache_memory=DEVICE_BLOCKS
               * layout.bytes_per_block, max_num_seqs=4,
               kv_offloading_size=tp * HOST_BLOCKS * layout.bytes_per_block / (1 << 30)
               if offload else 0.0, **options)


def _config(directory: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory)


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def _one_at_a_time(llm: LLM, prompts: list[list[int]],
                   params: SamplingParams | None = None) -> list[list[list[int]]]:
    return [[c.token_ids for c in llm.generate([p], params or _greedy())[0].outputs]
            for p in prompts]


def _check_no_leaks(llm: LLM) -> None:
    kv = llm.engine.kv
    kv.allocator.check_all_free()
    if kv.host is not None:
        kv.host.check_consistent()
        assert kv.host.num_used <= kv.host.num_blocks


@pytest.fixture(scope="module")
def hf_reference(tiny_llama_dir) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return [hf_greedy(model, p, MAX_NEW) for p in _conversations()]


def _off_and_on(directory: str, run, **options) -> dict[bool, object]:
    """run(llm) with the host tier off, then on; each engine leaks nothing, and with the tier
    some prefix came back from it."""
    results = {}
    for offload in (False, True):
        llm = _engine(directory, offload, **options)
        results[offload] = run(llm)
        assert (llm.engine.kv.host_prefix_hits > 0) is offload
        _check_no_leaks(llm)
    return results


@pytest.mark.parametrize("budget", [16, 2048])
def test_prefixes_brought_back_from_host_equal_recompute_and_hf(tiny_llama_dir, hf_reference,
                                                                budget):
    def run(llm: LLM) -> list[list[int]]:
        outputs = [o[0] for o in _one_at_a_time(llm, _conversations())]
        host = llm.engine.kv.host
        if host is not None:
            # Each second turn found its first turn's 3 cached blocks in the host tier.
            assert llm.engine.kv.host_prefix_hits >= 4 * 48 and host.blocks_loaded >= 12
        return outputs

    outputs = _off_and_on(tiny_llama_dir, run, max_num_batched_tokens=budget)
    assert outputs[True] == outputs[False] == hf_reference


def test_batched_turns_with_preemption_keep_outputs_and_leak_nothing(tiny_llama_dir,
                                                                      hf_reference):
    prompts = _conversations()
    # 24 new tokens: two first turns fill the pool at admission and then need a fifth block.
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def run(llm: LLM) -> list[list[int]]:
        outputs = [o.outputs[0].token_ids for turns in (prompts[:4], prompts[4:])
                   for o in llm.generate(turns, params)]
        assert llm.engine.scheduler.num_preemptions > 0
        return outputs

    outputs = _off_and_on(tiny_llama_dir, run, max_num_batched_tokens=32)
    assert outputs[True] == outputs[False]
    assert [o[:MAX_NEW] for o in outputs[True]] == hf_reference


def test_preempted_sequences_resume_from_the_host_tier_instead_of_recomputing(tiny_llama_dir):
    """A preempted sequence's full blocks stay cached; evicted from the device they are copied
    to the host tier, and at readmission they come back by copy: only its last, partial block
    is computed again. Without the tier the same preemptions recompute."""
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 30000) for _ in range(40)] for _ in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    resumed = {}
    outputs = {}
    for offload in (False, True):
        llm = _engine(tiny_llama_dir, offload, max_num_batched_tokens=32)
        outputs[offload] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        scheduler = llm.engine.scheduler
        assert scheduler.num_preemptions > 0
        resumed[offload] = scheduler.resumed_tokens
        _check_no_leaks(llm)
    assert outputs[True] == outputs[False]
    with_tier, without = resumed[True], resumed[False]
    assert with_tier.host > 0
    # Each readmission computes at most one block again (its partial last block).
    assert with_tier.recomputed <= with_tier.readmissions * 16
    assert without.host == 0 and without.recomputed > with_tier.recomputed


def test_n_samples_over_a_prefix_from_the_host_tier(tiny_llama_dir):
    prompts = _conversations()
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)

    def run(llm: LLM) -> list[list[list[int]]]:
        _one_at_a_time(llm, prompts[:4])  # the first turns, evicted by one another
        return _one_at_a_time(llm, prompts[4:], params)

    outputs = _off_and_on(tiny_llama_dir, run)
    assert outputs[True] == outputs[False]


def test_int8_kv_is_offloaded_as_stored(tiny_llama_dir):
    outputs = _off_and_on(tiny_llama_dir, lambda llm: _one_at_a_time(llm, _conversations()),
                          kv_cache_dtype="int8", max_num_batched_tokens=24)
    assert outputs[True] == outputs[False]


def test_tp2_ranks_offload_their_own_shards(tiny_llama_dir, hf_reference):
    llm = _engine(tiny_llama_dir, True, tensor_parallel_size=2, max_num_batched_tokens=24)
    with llm:
        assert llm.engine.runner.num_host_blocks == HOST_BLOCKS
        outputs = [o[0] for o in _one_at_a_time(llm, _conversations())]
        assert llm.engine.kv.host.blocks_loaded >= 12
        _check_no_leaks(llm)
    assert outputs == hf_reference


def test_aborts_mid_prefill_and_decode_leak_no_block_in_either_tier(tiny_llama_dir):
    prompts = _conversations()
    llm = _engine(tiny_llama_dir, True, max_num_batched_tokens=16)
    _one_at_a_time(llm, prompts[:4])
    engine = llm.engine
    for i, prompt in enumerate(prompts[4:]):
        engine.add_request(f"r{i}", prompt, _greedy())
    for _ in range(6):  # some prefilling in chunks, some copied back, some decoding
        engine.step()
    assert engine.kv.host_prefix_hits > 0
    for i in range(4):
        engine.abort_request(f"r{i}")
    assert not engine.has_unfinished_requests()
    _check_no_leaks(llm)
    host = engine.kv.host
    assert engine.kv.stats().host_used_blocks == host.num_used > 0
    # What stayed cached in both tiers still serves correct prefixes.
    again = _one_at_a_time(llm, prompts[4:])
    fresh = _one_at_a_time(_engine(tiny_llama_dir, False), prompts[4:])
    assert again == fresh
    _check_no_leaks(llm)


def test_a_quantized_block_round_trips_through_host_with_its_scales():
    torch.manual_seed(0)
    values = torch.randint(-127, 128, (2, 2, 6, 4, 2, 8), dtype=torch.int8)
    scales = torch.rand(2, 2, 6, 4, 2)
    original = (values.clone(), scales.clone())
    offload = KVOffload([values.view(torch.uint8), scales], num_blocks=3,
                        device=torch.device("cpu"))
    offload.run(to_host=[(1, 2), (4, 0)], to_device=[])
    values.zero_()
    scales.zero_()
    offload.run(to_host=[], to_device=[(5, 2), (0, 0)])
    assert torch.equal(values[:, :, 5], original[0][:, :, 1])
    assert torch.equal(values[:, :, 0], original[0][:, :, 4])
    assert torch.equal(scales[:, :, [5, 0]], original[1][:, :, [1, 4]])
    assert offload.nbytes == 3 * (2 * 2 * 4 * 2 * 8 + 4 * 2 * 2 * 4 * 2)


def test_a_host_tier_larger_than_host_memory_fails_naming_the_flag_and_figures():
    from tokenmill.engine.contract.config import EngineConfig
    from tokenmill.engine.execution.kv_sizing import check_host_memory

    config = EngineConfig(kv_offloading_size=64)
    with pytest.raises(ConfigError, match=r"kv_offloading_size: 64 GiB asked .* only 8\.00 GiB"):
        check_host_memory(config, available=8 << 30)
    check_host_memory(config, available=65 << 30)
    with pytest.raises(ConfigError, match="kv_offloading_size: must be a number of GiB >= 0"):
        EngineConfig(kv_offloading_size=-1)
    with pytest.raises(ConfigError, match="kv_offloading_size: .*needs enable_prefix_caching"):
        EngineConfig(kv_offloading_size=1, enable_prefix_caching=False)


def test_the_engine_refuses_more_than_the_host_has(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"kv_offloading_size: 100000 GiB asked for the host "
                                          r"tier, but only [\d.]+ GiB"):
        LLM(tiny_llama_dir, show_progress=False, kv_offloading_size=100000)


def _pinned_bytes(chunks: list[int], block_bytes: int) -> int:
    """What torch's pinned allocator takes for these chunks: each rounded up to a power of 2."""
    return sum(1 << (n * block_bytes - 1).bit_length() for n in chunks)


@pytest.mark.parametrize("block_bytes", [917_504, 2 << 20, 24_576, 1_000_003])
def test_pinned_chunks_hold_every_block_and_pin_at_most_one_block_more_per_chunk(block_bytes):
    from tokenmill.engine.execution.kv_offload import pinned_chunks

    for num_blocks in (1, 2, 3, 7, 64, 1000, 23_405, (20 << 30) // block_bytes):
        chunks = pinned_chunks(num_blocks, block_bytes)
        assert sum(chunks) == num_blocks and min(chunks) >= 1
        assert len(chunks) <= (num_blocks * block_bytes).bit_length()
        assert _pinned_bytes(chunks, block_bytes) <= (num_blocks + len(chunks)) * block_bytes
    assert pinned_chunks(1 << 13, 2 << 20) == [1 << 13]  # 16 GiB of 2 MiB blocks: as it is


def test_a_20_gib_tier_pins_20_gib_not_32():
    from tokenmill.engine.execution.kv_offload import pinned_chunks

    block = 917_504  # a 28-layer model with 4 KV heads of 128, bf16, 16 tokens a block
    blocks = (20 << 30) // block
    assert _pinned_bytes([blocks], block) == 32 << 30  # one tensor
    chunks = pinned_chunks(blocks, block)
    assert _pinned_bytes(chunks, block) <= (20 << 30) + len(chunks) * block
    assert len(chunks) <= 4


@pytest.mark.parametrize("staged_blocks", [1, 2, 64])
def test_copies_block_by_block_over_chunks_equal_the_vectorized_copies(staged_blocks):
    """What the CUDA path runs (one block at a time, over a tier in several tensors, staged
    through the device a few blocks at a time), here on CPU tensors, against the CPU path over
    one tensor: the same pool and the same host blocks after random steps, a block offloaded
    and brought back in one step among them."""
    from tokenmill.engine.execution.kv_offload import copy_block_by_block, pinned_chunks

    rng = random.Random(0)
    torch.manual_seed(0)
    num_blocks, host_blocks = 16, 24
    pool = torch.randn(3, 2, num_blocks, 4, 2, 8)
    reference = KVOffload([pool.clone()], host_blocks, torch.device("cpu"))
    block_bytes = pool[:, :, 0].nbytes
    sizes = pinned_chunks(host_blocks, block_bytes)
    assert len(sizes) > 1
    chunks = [torch.zeros((n, 3, 2, 4, 2, 8)) for n in sizes]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for _ in range(100):
        to_host, to_device = random_transfers(rng, num_blocks, host_blocks, 6)
        reference.run(to_host, to_device)
        copy_block_by_block(pool, chunks, starts, to_host, to_device,
                            staging_bytes=staged_blocks * block_bytes)
        written = rng.sample(range(num_blocks), 3)  # the step's forward writes some blocks
        noise = torch.randn(3, 2, 3, 4, 2, 8)
        pool[:, :, written] = noise
        reference.pairs[0][0][:, :, written] = noise
    (ref_pool, (ref_host,)), = reference.pairs
    assert torch.equal(pool, ref_pool)
    assert torch.equal(torch.cat(chunks), ref_host)
