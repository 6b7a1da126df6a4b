"""LoRA with the rest of serving: the prefix cache never shares KV between adapters (nor with an
adapter re-added under the same name), n > 1 and preemption keep outputs, and AsyncEngine
adds, serves and removes adapters from the event loop."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import tiny_llama_block_bytes
from lora_support import ADAPTERS, make_adapter, peft_greedy

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.core import LLMEngine
from tokenmill.engine.core.errors import LoRAAdapterError, UnknownAdapterError
from tokenmill.engine.frontend.async_engine import AsyncEngine

MAX_NEW = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
ENGINE = dict(show_progress=False, block_size=8, enable_lora=True, max_lora_rank=8)
PROMPT = list(range(1000, 1040))  # five full blocks


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("serving-adapters")
    return {a.name: make_adapter(tiny_llama_dir, str(root / a.name), a) for a in ADAPTERS[:2]}


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, adapters) -> dict[str, list[int]]:
    return {name: peft_greedy(tiny_llama_dir, path, [PROMPT], MAX_NEW)[0]
            for name, path in adapters.items()}


def _one(llm: LLM, lora: str | None) -> list[int]:
    return llm.generate([PROMPT], GREEDY, lora=lora)[0].outputs[0].token_ids


def test_prefix_cache_is_per_adapter(tiny_llama_dir, adapters, expected):
    modules = tuple(f"{n}={p}" for n, p in adapters.items())
    with LLM(tiny_llama_dir, enable_prefix_caching=True, max_loras=2, lora_modules=modules,
             **ENGINE) as llm:
        kv = llm.engine.kv
        assert _one(llm, "sql") == expected["sql"]
        hits = kv.prefix_hits
        assert _one(llm, "chat") == expected["chat"]  # the same prompt, another adapter
        assert kv.prefix_hits == hits
        assert _one(llm, None) != expected["sql"] and kv.prefix_hits == hits  # nor the base
        assert _one(llm, "sql") == expected["sql"]  # the same adapter again: it hits
        assert kv.prefix_hits >= hits + 32
        # Re-added under the same name with other weights: the old KV is not reused.
        llm.engine.remove_lora("sql")
        llm.engine.add_lora("sql", adapters["chat"])
        hits = kv.prefix_hits
        assert _one(llm, "sql") == expected["chat"]
        assert kv.prefix_hits == hits
        kv.allocator.check_all_free()


def test_n_greater_than_one_and_preemption(tiny_llama_dir, tiny_llama, adapters, expected):
    modules = tuple(f"{n}={p}" for n, p in adapters.items())
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, n=2)
    # A pool too small for the batch: sequences are preempted and resumed, one adapter slot.
    with LLM(tiny_llama_dir, max_loras=1, max_num_seqs=6, lora_modules=modules,
             kv_cache_memory=11 * tiny_llama_block_bytes(tiny_llama, 8), **ENGINE) as llm:
        loras = ["sql", "chat", "sql", "chat", None]
        outs = llm.generate([PROMPT] * 5, params, lora=loras)
        for out, name in zip(outs, loras, strict=True):
            want = expected[name] if name else peft_greedy(tiny_llama_dir, None, [PROMPT],
                                                           MAX_NEW)[0]
            assert [c.token_ids for c in out.outputs] == [want, want]
        assert llm.engine.scheduler.num_preemptions > 0
        llm.engine.kv.allocator.check_all_free()


def test_async_engine_adds_serves_and_removes(tiny_llama_dir, adapters, expected):
    config = EngineConfig(model=tiny_llama_dir, block_size=8, enable_lora=True,
                          max_lora_rank=8)
    engine = AsyncEngine(LLMEngine(config, show_progress=False))

    async def scenario() -> None:
        await engine.add_lora("chat", adapters["chat"])
        assert engine.lora_adapters() == {"chat": adapters["chat"]}
        with pytest.raises(LoRAAdapterError, match="'chat' is already loaded"):
            await engine.add_lora("chat", adapters["chat"])
        outs = [o async for o in engine.generate("r1", PROMPT, GREEDY, lora_name="chat")]
        assert outs[-1].outputs[0].token_ids == expected["chat"]
        with pytest.raises(UnknownAdapterError):
            await engine.add_request("r2", PROMPT, GREEDY, lora_name="sql")
        await engine.remove_lora("chat")
        assert engine.lora_adapters() == {}
        with pytest.raises(LoRAAdapterError, match="not loaded"):
            await engine.remove_lora("chat")

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert engine.error is None


def test_a_step_runs_at_most_max_loras_adapters_and_the_base_goes_ahead(tiny_llama_dir,
                                                                         adapters):
    modules = tuple(f"{n}={p}" for n, p in adapters.items())
    with LLM(tiny_llama_dir, max_loras=1, lora_modules=modules, **ENGINE) as llm:
        engine = llm.engine
        for i, name in enumerate(["sql", "chat", None, "sql", None]):
            engine.add_request(f"r{i}", PROMPT[:8 + i], GREEDY, lora_name=name)
        engine.step()
        first = {seq.request_id for seq, _ in engine.last_plan.scheduled}
        assert first == {"r0", "r2", "r3", "r4"}  # chat waits for the slot; others go ahead
        assert engine.lora_batch_info() == (["sql"], ["chat"])
        while engine.has_unfinished_requests():
            engine.step()
            adapters_in_step = {seq.lora for seq, _ in engine.last_plan.scheduled} - {None}
            assert len(adapters_in_step) <= 1
        assert engine.lora_batch_info() == ([], [])
        engine.kv.allocator.check_all_free()


def test_an_adapter_comes_from_s3_like_a_model(tiny_llama_dir, adapters, expected, s3_env,
                                               bucket, tmp_path):
    from store_support import BUCKET, upload_directory

    upload_directory(bucket, BUCKET, "adapters/chat", adapters["chat"])
    uri = f"s3://{BUCKET}/adapters/chat"
    with LLM(tiny_llama_dir, download_dir=str(tmp_path), lora_modules=(f"chat={uri}",),
             **ENGINE) as llm:
        assert llm.engine.lora_adapters() == {"chat": uri}
        assert _one(llm, "chat") == expected["chat"]
        with pytest.raises(LoRAAdapterError, match="'gone'"):
            llm.engine.add_lora("gone", f"s3://{BUCKET}/adapters/nothing-here")
