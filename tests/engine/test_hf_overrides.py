"""--hf-overrides, --rope-scaling and --rope-theta (vLLM's flags): the model config changes
they ask for apply on every rank before the context length is derived, so a checkpoint served
with Qwen's YaRN recipe equals transformers running the same checkpoint with that recipe in
its config.json; what cannot apply is refused in one line naming the flag."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers
from model_support import hf_greedy, make_random_model

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.cli import main
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.layers.rotary import rope_parameters
from tokenmill.engine.models.config_overrides import ConfigOverrideError, apply_config_overrides
from tokenmill.engine.models.source import ModelLoadError

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def _qwen3(**changes) -> transformers.Qwen3Config:
    settings = dict(vocab_size=256, hidden_size=64, intermediate_size=128, head_dim=32,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=32, bos_token_id=1, eos_token_id=2,
                    tie_word_embeddings=False, rope_parameters={"rope_theta": 20000.0})
    return transformers.Qwen3Config(**(settings | changes))


def test_rope_scaling_keeps_the_models_base_and_rope_theta_keeps_its_scaling():
    scaled = apply_config_overrides(_qwen3(), {"rope_scaling": dict(YARN)})
    assert rope_parameters(scaled) == rope_parameters(_qwen3(rope_parameters={
        "rope_theta": 20000.0, **YARN}))
    rebased = apply_config_overrides(scaled, {"rope_theta": 5e5})
    assert rope_parameters(rebased)["rope_theta"] == 5e5
    assert rope_parameters(rebased)["factor"] == 4.0
    old_style = apply_config_overrides(_qwen3(), {"rope_scaling": {"type": "linear",
                                                                   "factor": 2.0}})
    assert rope_parameters(old_style)["rope_type"] == "linear"


def test_other_keys_are_set_and_a_text_config_object_applies_to_the_text_model():
    config = _qwen3()
    changed = apply_config_overrides(config, {"max_position_embeddings": 77,
                                              "text_config": {"rms_norm_eps": 1e-3}})
    assert (changed.max_position_embeddings, changed.rms_norm_eps) == (77, 1e-3)
    assert config.max_position_embeddings == 32  # the original is left as it was


def test_rope_of_a_model_with_rope_per_kind_of_layer_is_refused_by_name():
    gemma3 = transformers.Gemma3TextConfig(hidden_size=64, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=32)
    with pytest.raises(ConfigOverrideError, match="rotary settings per kind of layer"):
        apply_config_overrides(gemma3, {"rope_theta": 1e6})


@pytest.mark.parametrize(("options", "error"), [
    ({"hf_overrides": "[1]"}, "hf_overrides: must be a JSON object, got list"),
    ({"hf_overrides": "{max_position_embeddings: 2}"}, "hf_overrides: not valid JSON"),
    ({"hf_overrides": '{"rope_scaling": 4}'}, "hf_overrides: rope_scaling must be a JSON "
                                              "object"),
    ({"rope_scaling": "yarn"}, "rope_scaling: not valid JSON"),
    ({"rope_theta": 0.0}, "rope_theta: must be positive, got 0.0"),
])
def test_overrides_that_cannot_apply_are_refused_naming_the_flag(options, error):
    with pytest.raises(ConfigError, match=error):
        EngineConfig(**options)


@pytest.fixture(scope="module")
def plain_and_yarn(tmp_path_factory, smol_tokenizer) -> tuple[str, str]:
    """One random checkpoint (a 32-token context), and the same weights with Qwen's YaRN
    recipe written into config.json."""
    root = tmp_path_factory.mktemp("overrides")
    plain = make_random_model(str(root / "plain"),
                              _qwen3(vocab_size=len(smol_tokenizer)), smol_tokenizer)
    yarn = shutil.copytree(plain, root / "yarn")
    config = json.loads((yarn / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 20000.0, **YARN}
    (yarn / "config.json").write_text(json.dumps(config))
    return plain, str(yarn)


def test_rope_scaling_serves_past_the_checkpoints_context_as_transformers_does(
        plain_and_yarn, smol_tokenizer):
    """Under tensor parallelism, so the worker rank applies the override too."""
    plain, yarn = plain_and_yarn
    reference = transformers.AutoModelForCausalLM.from_pretrained(yarn).eval()
    prompt = smol_tokenizer.encode("one two three four five six seven eight nine " * 6)
    assert 32 < len(prompt) < 128 - 16
    expected = hf_greedy(reference, prompt, 16)
    with LLM(plain, show_progress=False, block_size=8, tensor_parallel_size=2,
             rope_scaling=json.dumps(YARN)) as llm:
        assert llm.engine.max_model_len == 4 * 32
        got = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16))
    assert got[0].outputs[0].token_ids == expected


def test_hf_overrides_equal_the_rope_flags(plain_and_yarn):
    from tokenmill.engine.models.loader import load_config
    from tokenmill.engine.models.source import ModelSource

    plain, _ = plain_and_yarn
    configs = [load_config(ModelSource(plain, config_overrides=json.dumps(
        EngineConfig(model=plain, **options).config_overrides())))
        for options in ({"hf_overrides": json.dumps({"rope_scaling": YARN})},
                        {"rope_scaling": json.dumps(YARN)})]
    assert rope_parameters(configs[0]) == rope_parameters(configs[1])
    assert rope_parameters(configs[0])["rope_type"] == "yarn"


def test_a_rope_override_the_engine_cannot_run_ends_the_command_in_one_line(plain_and_yarn,
                                                                            capsys):
    plain, _ = plain_and_yarn
    argv = ["generate", "--model", plain, "--hf-overrides",
            '{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}']
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "rope scaling type 'dynamic' is not supported" in err
    with pytest.raises(ModelLoadError, match="--hf-overrides: rope_scaling and rope_theta"):
        LLM(str(Path(plain)), show_progress=False, hf_overrides=json.dumps(
            {"rope_theta": 1.0, "rope_parameters": {"full_attention": {"rope_theta": 1.0}}}))
