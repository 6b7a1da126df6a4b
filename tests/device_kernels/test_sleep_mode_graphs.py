"""Sleep mode and decode graphs: the graphs address the weights and the KV pool, which come
back at new addresses, so waking captures them again. On the CPU the graphs replay eagerly
over their fixed buffers (decode_graphs.py) with the kernels in Triton's interpreter; on a GPU
the device memory is also measured."""

from __future__ import annotations

import torch
from triton_support import DEVICE, KV_CACHE_MEMORY, cuda_only

from tokenmill.engine import LLM, SamplingParams

OPTIONS = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 64,
           "max_num_seqs": 4, "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY,
           "max_model_len": 128}
PROMPTS = [[101, 102, 103, 104], [201, 202], [301, 302, 303]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_waking_captures_the_graphs_again_and_they_replay_the_same_tokens(tiny_llama_dir):
    eager = _greedy(LLM(tiny_llama_dir, attention_backend="torch", **OPTIONS))  # equals HF
    llm = LLM(tiny_llama_dir, attention_backend="triton", enable_sleep_mode=True, **OPTIONS)
    runner = llm.engine.runner
    if runner.graphs is None:  # the CPU captures none by itself
        runner.capture_decode_graphs(4, 64, llm.engine.max_model_len)
    assert _greedy(llm) == eager
    llm.sleep()
    assert runner.graphs is None and runner.kv_pool is None
    llm.wake_up(["kv_cache"])
    assert runner.graphs is None or DEVICE.type == "cpu"  # on a GPU the weights are away
    llm.wake_up(["weights"])
    assert sorted(runner.graphs.graphs) == [1, 2, 4]
    replays = runner.graphs.replays
    assert _greedy(llm) == eager
    assert runner.graphs.replays > replays


@cuda_only
def test_asleep_the_weights_and_pool_leave_the_gpu(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, enable_sleep_mode=True, show_progress=False, max_num_seqs=4,
              kv_cache_memory=KV_CACHE_MEMORY)
    before = _greedy(llm)
    runner = llm.engine.runner
    weights = sum(p.nbytes for p in runner.model.parameters())
    pool = runner.num_blocks * runner.layout.bytes_per_block
    awake = torch.cuda.memory_allocated()
    llm.sleep()
    assert runner.host_weights.nbytes >= weights
    assert awake - torch.cuda.memory_allocated() >= weights + pool
    llm.wake_up()
    assert runner.graphs is not None
    assert _greedy(llm) == before
