"""Multi-LoRA serving: one batch mixing the base model and several PEFT adapters equals, request
by request, Hugging Face + peft run with that adapter alone; also with fewer device slots than
adapters (evicted and reloaded), under tensor parallelism and over int8 weights."""

from __future__ import annotations

import pytest
import torch
from lora_support import ADAPTERS, make_adapter, peft_greedy, peft_logprobs
from model_support import make_random_model

from tokenmill.engine import LLM, LoRARequest, SamplingParams
from tokenmill.engine.bench import accuracy
from tokenmill.engine.core.scoring import next_token_logprobs
from tokenmill.engine.layers.lora import lora_apply

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=64,
              enable_lora=True, max_lora_rank=8)
# docs/quantization.md: a random-weight Llama with int8 weights (tests/engine/
# test_quant_accuracy.py RANDOM_BOUNDS): top-1 agreement, mean KL, |perplexity change|.
INT8_BOUNDS = (0.93, 0.0005, 0.005)


def test_each_token_row_reads_the_adapter_in_its_own_slot():
    """The reference delta (the Triton kernel's contract): y[t] += B[s] A[s] x[t] for slot
    s = token_slots[t] >= 0, rows of slot -1 unchanged."""
    torch.manual_seed(0)
    x, y = torch.randn(7, 16), torch.randn(7, 24)
    a_pool, b_pool = torch.randn(3, 8, 16), torch.randn(3, 24, 8)
    slots = torch.tensor([2, -1, 0, 2, 1, -1, 0])
    want = y.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want[t] += b_pool[slot] @ (a_pool[slot] @ x[t])
    lora_apply(x, y, a_pool, b_pool, slots, "torch")
    torch.testing.assert_close(y, want)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def base_dir(request, tmp_path_factory, vocab_tokenizer):
    if request.param == "llama":
        return request.getfixturevalue("tiny_llama_dir")
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2)
    return make_random_model(str(tmp_path_factory.mktemp("lora-qwen3")), config,
                             vocab_tokenizer)


@pytest.fixture(scope="module")
def adapter_dirs(base_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {a.name: make_adapter(base_dir, str(root / a.name), a) for a in ADAPTERS}


@pytest.fixture(scope="module")
def prompts(vocab_tokenizer) -> list[list[int]]:
    texts = ["The quick brown fox", "SELECT name FROM users WHERE", "hello",
             "one two three four five six seven eight nine ten eleven twelve"]
    return [vocab_tokenizer.encode(t) for t in texts]


@pytest.fixture(scope="module")
def expected(base_dir, adapter_dirs, prompts) -> dict[str | None, list[list[int]]]:
    """HF + peft's greedy continuation of every prompt, per adapter (None: the base)."""
    runs = {None: peft_greedy(base_dir, None, prompts, MAX_NEW)}
    for name, directory in adapter_dirs.items():
        runs[name] = peft_greedy(base_dir, directory, prompts, MAX_NEW)
    return runs


def _modules(adapter_dirs: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"{name}={path}" for name, path in adapter_dirs.items())


def _mixed(prompts: list[list[int]], names: list[str | None]):
    """Every prompt under every adapter and the base, interleaved in one batch."""
    batch = [(p, name) for name in names for p in prompts]
    return [p for p, _ in batch], [name for _, name in batch]


def _run(llm: LLM, prompts, loras) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora=loras)]


def _want(expected, originals, batch, loras) -> list[list[int]]:
    """The reference continuation of each (prompt, adapter) of a batch."""
    return [expected[name][originals.index(p)] for p, name in zip(batch, loras, strict=True)]


def test_a_batch_mixing_base_and_three_adapters_equals_each_alone(base_dir, adapter_dirs,
                                                                    prompts, expected):
    # The adapters change the output, so equality says something.
    assert all(expected[a.name] != expected[None] for a in ADAPTERS)
    batch, loras = _mixed(prompts, [None, *adapter_dirs])
    with LLM(base_dir, max_loras=4, lora_modules=_modules(adapter_dirs), **ENGINE) as llm:
        assert _run(llm, batch, loras) == _want(expected, prompts, batch, loras)
        assert llm.engine.runner.lora.loads == 3  # each loaded once: all fit
        llm.engine.kv.allocator.check_all_free()


def test_fewer_slots_than_adapters_evicts_and_reloads(base_dir, adapter_dirs, prompts,
                                                     expected):
    batch, loras = _mixed(prompts, [None, *adapter_dirs])
    with LLM(base_dir, max_loras=2, max_cpu_loras=2, lora_modules=_modules(adapter_dirs),
             **ENGINE) as llm:
        assert _run(llm, batch, loras) == _want(expected, prompts, batch, loras)
        # The third adapter waited for the first's slot; the second round, in reverse order,
        # brings the evicted first one back (from disk too: the host cache holds two).
        assert llm.engine.runner.lora.loads == 3
        again = list(reversed(batch)), list(reversed(loras))
        assert _run(llm, *again) == _want(expected, prompts, *again)
        assert llm.engine.runner.lora.loads == 4
        llm.engine.kv.allocator.check_all_free()


def test_vllms_lora_request_loads_an_adapter_on_first_use(base_dir, adapter_dirs, prompts,
                                                         expected):
    """vLLM's offline pattern: no adapter named at start-up; each LoRARequest (one for every
    prompt, or one for all) is loaded the first time it is used."""
    with LLM(base_dir, max_loras=4, **ENGINE) as llm:
        assert llm.engine.lora_adapters() == {}
        sql, chat = (LoRARequest(name, i, adapter_dirs[name])
                     for i, name in enumerate(("sql", "chat"), start=1))
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        outs = llm.generate(prompts[:2] * 3, params,
                            lora_request=[sql, sql, chat, chat, None, None])
        want = expected["sql"][:2] + expected["chat"][:2] + expected[None][:2]
        assert [o.outputs[0].token_ids for o in outs] == want
        assert set(llm.engine.lora_adapters()) == {"sql", "chat"}
        again = llm.generate(prompts[:1], params, lora_request=sql)  # loaded: used as it is
        assert again[0].outputs[0].token_ids == expected["sql"][0]
        with pytest.raises(ValueError, match="'sql' is loaded from .*; this request names"):
            llm.generate(prompts[:1], params,
                         lora_request=LoRARequest("sql", 1, adapter_dirs["part"]))


def test_async_scheduling_with_adapters_evicted_and_reloaded(base_dir, adapter_dirs, prompts,
                                                             expected):
    """A sequence that finishes frees its adapter's slot while its last step may still be on
    the device; the adapter loaded into that slot next is copied after that step."""
    batch, loras = _mixed(prompts, [None, *adapter_dirs])
    with LLM(base_dir, max_loras=2, max_cpu_loras=2, lora_modules=_modules(adapter_dirs),
             async_scheduling=True, **ENGINE) as llm:
        assert _run(llm, batch, loras) == _want(expected, prompts, batch, loras)
        assert llm.engine.runner.lora.loads == 3
        llm.engine.kv.allocator.check_all_free()


def test_tensor_parallel_two_ranks_equal(base_dir, adapter_dirs, prompts, expected):
    batch, loras = _mixed(prompts[:2], [None, *adapter_dirs])
    with LLM(base_dir, tensor_parallel_size=2, max_loras=4,
             lora_modules=_modules(adapter_dirs), **ENGINE) as llm:
        assert _run(llm, batch, loras) == _want(expected, prompts, batch, loras)


def test_int8_base_within_the_stated_bounds(base_dir, adapter_dirs, vocab_tokenizer):
    ids = accuracy.text_tokens(vocab_tokenizer, accuracy.DEFAULT_TEXT, 256)
    min_top1, max_kl, max_delta = INT8_BOUNDS
    with LLM(base_dir, quantization="int8", max_loras=1, lora_modules=_modules(adapter_dirs),
             **ENGINE) as llm:
        for name in ("sql", "chat"):
            reference = peft_logprobs(base_dir, adapter_dirs[name], ids)
            ours = next_token_logprobs(llm.engine, ids, lora_name=name)
            result = accuracy.compare(reference, torch.cat(list(ours)), ids)
            assert result["top1_agreement"] >= min_top1, result
            assert result["mean_kl"] <= max_kl, result
            assert abs(result["perplexity_delta"]) <= max_delta, result
