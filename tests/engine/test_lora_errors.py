"""Bad LoRA input: adapters the engine can't serve, unknown names, removal. Each raises an error
that names the adapter and what is wrong, and the engine keeps serving without leaking."""

from __future__ import annotations

import os
import shutil

import pytest
from lora_support import ALL_TARGETS, Adapter, edit_config, make_adapter, peft_greedy
from model_support import make_random_model
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import LoRAAdapterError, RequestError, UnknownAdapterError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
ENGINE = dict(show_progress=False, enable_lora=True, max_loras=2, max_lora_rank=8)


@pytest.fixture(scope="module")
def good(tiny_llama_dir, tmp_path_factory) -> str:
    return make_adapter(tiny_llama_dir, str(tmp_path_factory.mktemp("good") / "a"),
                        Adapter("good", 4, 8, ALL_TARGETS))


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, good):
    with LLM(tiny_llama_dir, lora_modules=(f"good={good}",), **ENGINE) as llm:
        yield llm


@pytest.fixture
def copy(good, tmp_path):
    """A fresh copy of the good adapter to break."""
    return shutil.copytree(good, str(tmp_path / "copy"))


def _serves(llm: LLM) -> None:
    """A following request (base and adapter) runs, and no block is left behind."""
    outs = llm.generate([[100, 200, 300]] * 2, GREEDY, lora=[None, "good"])
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    llm.engine.kv.allocator.check_all_free()


def _refused(llm: LLM, path: str, *phrases: str, name: str = "bad") -> None:
    with pytest.raises(LoRAAdapterError) as info:
        llm.engine.add_lora(name, path)
    message = str(info.value)
    assert repr(name) in message
    for phrase in phrases:
        assert phrase in message, message
    assert name not in llm.engine.lora_adapters()
    _serves(llm)


def test_missing_files(llm, copy, tmp_path):
    _refused(llm, str(tmp_path / "nowhere"), "nowhere")
    os.remove(os.path.join(copy, "adapter_model.safetensors"))
    _refused(llm, copy, "adapter_model.safetensors is missing")
    os.remove(os.path.join(copy, "adapter_config.json"))
    _refused(llm, copy, "adapter_config.json is missing")


def test_rank_above_max_lora_rank(llm, tiny_llama_dir, tmp_path):
    path = make_adapter(tiny_llama_dir, str(tmp_path / "r16"), Adapter("r16", 16, 16,
                                                                      ["q_proj"]))
    _refused(llm, path, "rank 16", "--max-lora-rank 8")


def test_adapter_of_another_base(llm, tmp_path, vocab_tokenizer):
    from transformers import LlamaConfig

    other = make_random_model(str(tmp_path / "other"), LlamaConfig(
        vocab_size=len(vocab_tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False), vocab_tokenizer)
    path = make_adapter(other, str(tmp_path / "for-other"), Adapter("x", 4, 8, ["q_proj"]))
    _refused(llm, path, "q_proj.lora_A has shape (4, 32), expected (4, 64)")


@pytest.mark.parametrize("changes,phrase", [
    ({"target_modules": ["q_proj", "lm_head"]}, "'lm_head' is not one of"),
    ({"target_modules": ["embed_tokens"]}, "'embed_tokens' is not one of"),
    ({"target_modules": ".*lm_head"}, "matches lm_head"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias 'all'"),
    ({"use_dora": True}, "use_dora"),
])
def test_unsupported_settings(llm, copy, changes, phrase):
    edit_config(copy, **changes)
    _refused(llm, copy, phrase)


def test_a_tensor_of_another_module(llm, copy):
    path = os.path.join(copy, "adapter_model.safetensors")
    tensors = load_file(path)
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors["base_model.model.lm_head.lora_A.weight"] = tensors.pop(key)
    save_file(tensors, path)
    _refused(llm, copy, "'lm_head' is not one of")


def test_a_name_given_twice_or_invalid(llm, good):
    with pytest.raises(LoRAAdapterError, match="'good' is already loaded"):
        llm.engine.add_lora("good", good)
    assert llm.engine.lora_adapters() == {"good": good}
    with pytest.raises(LoRAAdapterError, match="adapter name"):
        llm.engine.add_lora("no spaces", good)


def test_unknown_adapter_in_a_request(llm):
    with pytest.raises(UnknownAdapterError, match="'nope' does not exist") as info:
        llm.engine.add_request("r", [1, 2, 3], GREEDY, lora_name="nope")
    assert isinstance(info.value, RequestError) and info.value.param == "model"
    with pytest.raises(UnknownAdapterError):  # checked before any prompt of the batch runs
        llm.generate([[1, 2], [3, 4]], GREEDY, lora=[None, "nope"])
    assert not llm.engine.has_unfinished_requests()
    _serves(llm)


def test_regex_targets_are_served(llm, tiny_llama_dir, tmp_path):
    path = make_adapter(tiny_llama_dir, str(tmp_path / "rx"),
                        Adapter("rx", 4, 8, r".*\.(q_proj|down_proj)", seed=5))
    llm.engine.add_lora("rx", path)
    try:
        out = llm.generate([[100, 200, 300]], GREEDY, lora="rx")[0].outputs[0].token_ids
        assert [out] == peft_greedy(tiny_llama_dir, path, [[100, 200, 300]], 4)
    finally:
        llm.engine.remove_lora("rx")


def test_remove_lets_running_requests_finish_and_refuses_new_ones(llm, tiny_llama_dir, good):
    engine = llm.engine
    engine.add_lora("temp", good)
    engine.add_request("running", [100, 200, 300], GREEDY, lora_name="temp")
    engine.step()
    engine.remove_lora("temp")
    with pytest.raises(UnknownAdapterError):
        engine.add_request("late", [100, 200, 300], GREEDY, lora_name="temp")
    with pytest.raises(LoRAAdapterError, match="'temp' is not loaded"):
        engine.remove_lora("temp")
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["running"]
    assert finished[0].outputs[0].token_ids == peft_greedy(tiny_llama_dir, good,
                                                          [[100, 200, 300]], 4)[0]
    assert "temp" not in engine.lora_adapters()
    _serves(llm)


def test_bad_startup_adapter_stops_startup_naming_it(tiny_llama_dir, good, tmp_path):
    with pytest.raises(ConfigError, match="lora_modules") as info:
        LLM(tiny_llama_dir, lora_modules=(f"good={good}", f"broken={tmp_path}"), **ENGINE)
    assert info.value.option == "lora_modules" and "'broken'" in str(info.value)


def test_without_enable_lora_adapters_are_refused(tiny_llama):
    with pytest.raises(LoRAAdapterError, match="--enable-lora"):
        tiny_llama.engine.add_lora("x", "/tmp")
    with pytest.raises(UnknownAdapterError):
        tiny_llama.engine.add_request("r", [1, 2], GREEDY, lora_name="x")
    assert tiny_llama.engine.lora_adapters() == {}
