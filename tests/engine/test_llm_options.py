"""vLLM's LLM() as a vLLM script calls it: generate and chat given no SamplingParams sample as
the model's generation_config.json recommends (get_default_sampling_params; generation_config
and override_generation_config change that), get_tokenizer is the model's tokenizer, vLLM's
options that change nothing here are taken, task picks the runner, and a value that cannot be
honoured or an unknown option is refused naming it."""

from __future__ import annotations

import json
import shutil

import pytest

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.frontend.llm_options import split_options

PROMPTS = [[1, 450, 7314, 310, 3444], [1, 9038, 2501, 263]]


@pytest.fixture(scope="module")
def recommending(tmp_path_factory, tiny_llama_dir):
    """The tiny model with a generation config that recommends top_k 1 (so a sampled reply
    is the greedy one) and 5 new tokens."""
    directory = tmp_path_factory.mktemp("recommending") / "model"
    shutil.copytree(tiny_llama_dir, directory)
    config = json.loads((directory / "generation_config.json").read_text())
    config.update(top_k=1, temperature=0.7, max_new_tokens=5)
    (directory / "generation_config.json").write_text(json.dumps(config))
    llm = LLM(str(directory), show_progress=False)
    yield llm
    llm.shutdown()


def test_no_params_sample_as_the_model_recommends(recommending, tiny_llama):
    defaults = recommending.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature, defaults.max_tokens) == (1, 0.7, 5)
    assert (defaults.top_p, defaults.min_p, defaults.repetition_penalty) == (1.0, 0.0, 1.0)
    greedy = tiny_llama.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=5,
                                                         ignore_eos=True))
    for out, want in zip(recommending.generate(PROMPTS), greedy, strict=True):
        assert out.outputs[0].token_ids == want.outputs[0].token_ids[:len(out.outputs[0].token_ids)]
        assert len(out.outputs[0].token_ids) == 5 or out.outputs[0].finish_reason == "stop"
    # Given params win whole: vLLM's defaults apply only where none are given.
    given = recommending.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=2))
    assert len(given[0].outputs[0].token_ids) <= 2


def test_a_model_that_recommends_nothing_gets_the_api_defaults(tiny_llama):
    assert tiny_llama.get_default_sampling_params() == SamplingParams()
    assert tiny_llama.get_tokenizer() is tiny_llama.tokenizer
    assert tiny_llama.llm_engine is tiny_llama.engine


def test_cumulative_logprob_sums_the_tokens_logprobs(tiny_llama):
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=6, logprobs=2)
    out = tiny_llama.generate(PROMPTS[:1], params)[0].outputs[0]
    assert out.cumulative_logprob == pytest.approx(
        sum(entry[t] for t, entry in zip(out.token_ids, out.logprobs, strict=True)))
    assert out.cumulative_logprob < 0
    plain = tiny_llama.generate(PROMPTS[:1], SamplingParams(max_tokens=2))[0].outputs[0]
    assert plain.cumulative_logprob is None


def test_generation_config_vllm_and_overrides_set_the_defaults(recommending, tiny_llama_dir):
    directory = recommending.engine.config.model
    with LLM(directory, show_progress=False, generation_config="vllm") as plain:
        assert plain.get_default_sampling_params() == SamplingParams()
    with LLM(tiny_llama_dir, show_progress=False, generation_config=directory) as elsewhere:
        defaults = elsewhere.get_default_sampling_params()  # the other directory's settings
        assert (defaults.top_k, defaults.temperature, defaults.max_tokens) == (1, 0.7, 5)
    with LLM(directory, show_progress=False,
             override_generation_config={"temperature": 0.0, "max_new_tokens": 3}) as over:
        defaults = over.get_default_sampling_params()
        assert (defaults.top_k, defaults.temperature, defaults.max_tokens) == (1, 0.0, 3)
        assert len(over.generate(PROMPTS[:1])[0].outputs[0].token_ids) <= 3


def test_vllms_options_that_change_nothing_are_taken(tiny_llama_dir):
    with LLM(tiny_llama_dir, show_progress=False, disable_log_stats=True, swap_space=4,
             tokenizer_mode="auto", load_format="auto", max_seq_len_to_capture=8192,
             distributed_executor_backend="mp", compilation_config={"level": 0},
             pipeline_parallel_size=1, cpu_offload_gb=0, task="generate",
             fully_sharded_loras=True) as llm:
        assert llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))[0].outputs[0].token_ids


@pytest.mark.parametrize("options,implied", [
    ({"compilation_config": {"cudagraph_mode": "NONE"}}, {"enforce_eager": True}),
    ({"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}},
     {"cuda_graph_sizes": (1, 2, 4)}),
    ({"compilation_config": {"max_cudagraph_capture_size": 8, "level": 3}},
     {"cuda_graph_sizes": (8,)}),
    ({"compilation_config": 0}, {"enforce_eager": True}),
    ({"compilation_config": 3}, {}),
    ({"optimization_level": 0}, {"enforce_eager": True}),
    ({"optimization_level": 2}, {}),
])
def test_vllms_compilation_settings_set_eager_steps_and_graph_sizes(options, implied):
    engine_options, _ = split_options({"model": "m", **options})
    assert engine_options == {"model": "m", **implied}


def test_kv_cache_memory_bytes_is_vllms_name_of_kv_cache_memory():
    assert split_options({"kv_cache_memory_bytes": 1 << 20})[0] == {"kv_cache_memory": 1 << 20}


def test_override_pooler_config_is_vllms_older_name_of_pooler_config():
    assert split_options({"override_pooler_config": {"pooling_type": "MEAN"}})[0] == {
        "pooler_config": {"pooling_type": "MEAN"}}


def test_task_embed_is_the_pooling_runner(tiny_llama_dir):
    with LLM(tiny_llama_dir, show_progress=False, task="embed") as llm:
        assert llm.engine.config.runner == "pooling"
        assert len(llm.embed(["hello there"])[0].outputs.embedding) == 64


@pytest.mark.parametrize("options,error,message", [
    ({"cpu_offload_gb": 4}, ValueError, "cpu_offload_gb=4 is not supported; this engine "
                                        "takes 0"),
    ({"tokenizer_mode": "custom"}, ValueError, "tokenizer_mode='custom' is not supported"),
    ({"pipeline_parallel_size": 2}, ValueError, "pipeline_parallel_size=2"),
    ({"task": "transcription"}, ValueError, "task='transcription' is not one of"),
    ({"generation_config": "/models/x"}, ValueError, "generation_config: '/models/x' is "
                                                     "neither auto, vllm nor a directory"),
    ({"override_generation_config": {"beams": 2}}, ValueError,
     "override_generation_config: 'beams' is not one of"),
    ({"max_num_sequences": 8}, TypeError, "unexpected option 'max_num_sequences'"),
])
def test_what_cannot_be_honoured_is_refused_naming_it(tiny_llama_dir, options, error, message):
    with pytest.raises(error, match=message):
        LLM(tiny_llama_dir, show_progress=False, **options)
