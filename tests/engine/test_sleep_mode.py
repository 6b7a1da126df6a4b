"""vLLM's sleep mode (--enable-sleep-mode): LLM.sleep() gives the KV pool back and moves the
weights to host memory; requests are refused until wake_up(), after which the engine answers
as before. The weight move is a GPU's; on the CPU it is tested on the model's own tensors."""

from __future__ import annotations

import copy

import pytest
import torch

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import EngineAsleepError, SleepModeError
from tokenmill.engine.execution.weight_offload import HostWeights

ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=48, show_progress=False)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [21, 22, 23]]


def _greedy(llm: LLM) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def sleepy(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, enable_sleep_mode=True, **ENGINE)
    yield llm
    llm.shutdown()


def test_asleep_the_pool_is_freed_and_requests_refused_until_both_parts_wake(sleepy):
    before = _greedy(sleepy)
    engine = sleepy.engine
    assert engine.kv.stats().cached_blocks > 0
    sleepy.sleep()
    assert engine.is_sleeping
    assert engine.runner.kv_pool is None and engine.runner.kv_caches == []
    assert engine.kv.stats().cached_blocks == 0  # its blocks' contents are gone
    with pytest.raises(EngineAsleepError, match="wake it up first"):
        _greedy(sleepy)
    assert not engine.has_unfinished_requests()
    sleepy.sleep()  # asleep already: nothing changes
    sleepy.wake_up(["weights"])
    assert engine.is_sleeping
    with pytest.raises(EngineAsleepError):
        _greedy(sleepy)
    sleepy.wake_up(["kv_cache"])
    assert not engine.is_sleeping
    assert int(engine.runner.kv_pool.count_nonzero()) == 0  # a fresh, zeroed pool
    assert _greedy(sleepy) == before
    sleepy.sleep()
    sleepy.wake_up()  # both by default
    assert _greedy(sleepy) == before
    engine.kv.allocator.check_all_free()


def test_sleep_is_refused_while_busy_at_level_3_and_when_off(sleepy, tiny_llama):
    sleepy.engine.add_request("busy", [5, 6, 7], GREEDY)
    try:
        with pytest.raises(SleepModeError, match=r"1 request\(s\) are unfinished"):
            sleepy.sleep()
    finally:
        sleepy.engine.abort_request("busy")
    assert not sleepy.engine.is_sleeping
    with pytest.raises(ValueError, match="level 3 is not supported"):
        sleepy.sleep(level=3)
    with pytest.raises(ValueError, match="tags: 'cache' is not one of weights, kv_cache"):
        sleepy.wake_up(["cache"])
    with pytest.raises(ConfigError, match="enable_sleep_mode: sleep mode is off"):
        tiny_llama.sleep()


def test_the_weights_leave_the_device_and_come_back_whole(tiny_llama_dir):
    """HostWeights on the model's own tensors (on a GPU they go to pinned host memory): every
    storage, tied and fused views included, is emptied and refilled with its bytes. A CPU
    model's weights are the checkpoint's mapped pages, which torch cannot resize: a copy (in
    memory torch allocated, as a GPU's are) stands in for them."""
    llm = LLM(tiny_llama_dir, **ENGINE)
    before = _greedy(llm)
    model = llm.engine.runner.model = copy.deepcopy(llm.engine.runner.model)
    assert _greedy(llm) == before
    weights = {name: t.clone() for name, t in model.state_dict().items()}
    held = HostWeights([model], torch.device("cpu"))
    assert held.nbytes >= sum(t.nbytes for t in weights.values()) // 2
    assert all(t.untyped_storage().nbytes() == 0 for t in model.parameters())
    held.restore()
    assert all(torch.equal(t, weights[name]) for name, t in model.state_dict().items())
    assert _greedy(llm) == before


def test_tensor_parallel_ranks_sleep_and_wake_together(tiny_llama_dir, sleepy):
    """The worker's runner gets the same calls between steps; its answers stay rank 1's."""
    alone = _greedy(sleepy)
    with LLM(tiny_llama_dir, enable_sleep_mode=True, tensor_parallel_size=2, **ENGINE) as llm:
        assert _greedy(llm) == alone
        llm.sleep()
        llm.wake_up(["kv_cache"])
        llm.wake_up(["weights"])
        assert _greedy(llm) == alone
