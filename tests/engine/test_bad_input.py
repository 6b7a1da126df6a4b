"""Bad input raises a clear error, queues nothing, and the engine keeps serving."""

from __future__ import annotations

import pytest

from tokenmill.engine import LLM, EngineConfig, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.core.sampling_params import SamplingParamsError
from tokenmill.engine.models.source import ModelNotFound


@pytest.mark.parametrize("options,named", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"n": 0}, "n"),
    ({"logprobs": -1}, "logprobs"),
])
def test_invalid_sampling_params_name_the_option(options, named):
    with pytest.raises(SamplingParamsError, match=named):
        SamplingParams(**options)


@pytest.mark.parametrize("options,named", [
    ({"block_size": 10}, "block_size"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "max_num_batched_tokens"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"dtype": "float8"}, "dtype"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"quantization": "awq"}, "quantization"),
    ({"kv_cache_memory": 0}, "kv_cache_memory"),
    ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override: must be a positive number"),
    ({"cuda_graph_sizes": ("8", 1)}, "cuda_graph_sizes: must be positive batch sizes"),
    ({"cuda_graph_sizes": (0,)}, "cuda_graph_sizes: must be positive batch sizes"),
    ({"kv_cache_dtype": "fp8_e3m4"}, "kv_cache_dtype: 'fp8_e3m4' is not one of"),
])
def test_invalid_engine_options_fail_at_construction(options, named):
    with pytest.raises(ConfigError, match=named):
        EngineConfig(**options)


def test_vllms_other_spellings_of_dtypes_are_read_as_ours():
    config = EngineConfig(dtype="half", kv_cache_dtype="fp8_e4m3")
    assert (config.dtype, config.kv_cache_dtype) == ("float16", "fp8")
    assert EngineConfig(dtype="float").dtype == "float32"


def test_unknown_model_path_says_what_to_do(tmp_path):
    with pytest.raises(ModelNotFound, match="Hugging Face model directory"):
        LLM(str(tmp_path / "no-such-model"), show_progress=False)
    with pytest.raises(ModelNotFound, match="config.json"):
        LLM(str(tmp_path), show_progress=False)


def test_prompt_too_long_is_rejected_and_others_still_run(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, show_progress=False, max_model_len=64)
    good = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with pytest.raises(RequestError, match=r"64 tokens.*70 \(62 in the prompt plus 8"):
        llm.generate([[5, 6, 7], [11] * 62], good)
    assert not llm.engine.has_unfinished_requests()  # nothing of the batch was queued
    out = llm.generate([[5, 6, 7]], good)[0].outputs[0]
    assert len(out.token_ids) == 8


def test_a_pool_smaller_than_the_context_lowers_the_default_length(tiny_llama_dir, tiny_llama,
                                                                    caplog):
    """The model's 1,024 tokens do not fit 4 blocks of 8: the context becomes the 32 tokens
    the pool holds (logged), so a request may fill the pool, and one that asks for more is
    refused naming that length."""
    from tokenmill.engine.execution.kv_layout import KVCacheLayout

    engine = tiny_llama.engine
    block = KVCacheLayout.for_model(engine.model_config, 8, engine.dtype).bytes_per_block
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        LLM(tiny_llama_dir, show_progress=False, block_size=8, kv_cache_memory=block - 1)
    with caplog.at_level("WARNING", logger="tokenmill.engine.core.engine"):
        llm = LLM(tiny_llama_dir, show_progress=False, block_size=8, kv_cache_memory=4 * block)
    assert llm.engine.max_model_len == 32
    lowered = [r for r in caplog.records if "lowered to fit the KV-cache pool" in r.message]
    assert [(r.model_context_length, r.max_model_len) for r in lowered] == [(1024, 32)]
    with pytest.raises(RequestError, match=r"maximum context length is 32 tokens.*40 \(30"):
        llm.generate([[7] * 30], SamplingParams(max_tokens=10))
    out = llm.generate([[7] * 20], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 12  # to the end of the context
    llm.engine.kv.allocator.check_all_free()


def test_a_max_model_len_the_pool_cannot_hold_stops_the_start_naming_what_fits(
        tiny_llama_dir, tiny_llama):
    from tokenmill.engine.execution.kv_layout import KVCacheLayout

    engine = tiny_llama.engine
    block = KVCacheLayout.for_model(engine.model_config, 8, engine.dtype).bytes_per_block
    with pytest.raises(ConfigError, match=r"max_model_len: 64 tokens do not fit the KV-cache "
                                          r"pool, which holds 32 \(4 blocks of 8\); lower "
                                          r"--max-model-len to at most 32"):
        LLM(tiny_llama_dir, show_progress=False, block_size=8, kv_cache_memory=4 * block,
            max_model_len=64)
    for fits in (32, -1):  # what the pool holds; -1 is vLLM's auto
        llm = LLM(tiny_llama_dir, show_progress=False, block_size=8,
                  kv_cache_memory_bytes=4 * block, max_model_len=fits)
        assert llm.engine.max_model_len == 32


def test_a_block_count_override_sizes_the_pool_and_preempts_when_it_fills(tiny_llama_dir):
    """vLLM's --num-gpu-blocks-override: 6 blocks of 8 whatever the 1 GiB default; two
    sequences needing 4 blocks each cannot both run, so one is preempted, and both end with
    the tokens they get alone. A length beyond the pool names the flag to raise."""
    with pytest.raises(ConfigError, match="raise --num-gpu-blocks-override"):
        LLM(tiny_llama_dir, show_progress=False, block_size=8, num_gpu_blocks_override=6,
            max_model_len=64)
    llm = LLM(tiny_llama_dir, show_progress=False, block_size=8, num_gpu_blocks_override=6)
    assert (llm.engine.runner.num_blocks, llm.engine.max_model_len) == (6, 48)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = [[5, 6, 7] * 4, [9, 10, 11] * 4]
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    together = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in together] == alone
    assert sum(o.num_preemptions for o in together) >= 1
    llm.engine.kv.allocator.check_all_free()


def test_bad_token_ids_and_empty_prompts_are_rejected(tiny_llama):
    vocab = tiny_llama.engine.model_config.vocab_size
    for prompt in ([], [1, vocab], [-1], ""):
        with pytest.raises(RequestError):
            tiny_llama.generate([prompt], SamplingParams(max_tokens=2))
    assert len(tiny_llama.generate([[1, 2, 3]], SamplingParams(max_tokens=2,
                                                               ignore_eos=True))[0]
               .outputs[0].token_ids) == 2


def test_n_beyond_the_batch_size_is_rejected(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=2)
    with pytest.raises(RequestError, match="n=3 exceeds max_num_seqs=2"):
        llm.generate([[1, 2]], SamplingParams(n=3, max_tokens=2))
    assert len(llm.generate([[1, 2]], SamplingParams(n=2, max_tokens=2))[0].outputs) == 2


def test_duplicate_request_id_is_rejected_without_harming_the_first(tiny_llama):
    engine = tiny_llama.engine
    engine.add_request("same", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request("same", [4, 5], SamplingParams(max_tokens=3))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 3
    engine.kv.allocator.check_all_free()


def test_an_error_mid_run_aborts_the_batch_and_leaks_nothing(tiny_llama, monkeypatch):
    engine = tiny_llama.engine
    real_step = engine.step
    calls = {"n": 0}

    def failing_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    with pytest.raises(KeyboardInterrupt):
        tiny_llama.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=20, ignore_eos=True))
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
    engine.kv.allocator.check_all_free()
