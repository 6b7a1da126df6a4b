"""A KV pool on the host takes memory as its blocks fill, not all at start-up: a CPU engine's
default 1 GiB pool for a tiny model used to cost 1 GiB of resident memory per engine."""

from __future__ import annotations

import gc
import os

import torch

from tokenmill.engine.execution.zeroed import zeroed

MIB = 1 << 20


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_zeroed_reads_as_zeros_and_commits_only_what_is_written():
    before = _resident()
    pool = zeroed((4, 2, 4096, 16, 256), torch.bfloat16, torch.device("cpu"))  # 256 MiB
    assert pool.shape == (4, 2, 4096, 16, 256) and pool.dtype == torch.bfloat16
    assert pool.is_contiguous() and pool.nbytes == 256 * MIB
    assert not pool[3, 1, -1].any()
    assert _resident() - before < 32 * MIB
    pool[:2].fill_(1.5)  # half of it
    assert _resident() - before > 100 * MIB
    assert pool[1, 1, 7, 3, 2].item() == 1.5 and not pool[2:].any()
    del pool
    gc.collect()
    assert _resident() - before < 32 * MIB  # the mapping went with the tensor


def test_zeroed_holds_any_pool_dtype_and_an_empty_shape():
    for dtype in (torch.float32, torch.float16, torch.int8, torch.float8_e4m3fn, torch.uint8):
        values = zeroed((3, 5), dtype, torch.device("cpu"))
        assert values.dtype == dtype and values.shape == (3, 5)
        assert torch.equal(values.float(), torch.zeros(3, 5))
    assert zeroed((0, 4), torch.float32, torch.device("cpu")).shape == (0, 4)


def test_an_engine_with_the_default_host_pool_does_not_take_all_of_it(tiny_llama_dir):
    from tokenmill.engine import LLM, SamplingParams

    gc.collect()
    before = _resident()
    llm = LLM(tiny_llama_dir, show_progress=False)
    runner = llm.engine.runner
    assert runner.kv_pool.nbytes >= 900 * MIB  # the 1 GiB default, less a partial block
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4
    assert _resident() - before < 400 * MIB
