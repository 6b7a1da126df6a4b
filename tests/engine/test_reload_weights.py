"""The weights changed in place (LLMEngine.reload_weights and load_weights, vLLM's sleep
level 2): a trainer's new checkpoint of the same shapes, or its tensors handed over by name,
whole or in part, are served at once, greedy output equal to transformers' on them, on every
tensor-parallel rank, with the prefix cache forgotten; level 2 frees the weights outright and
waking reads them from the latest checkpoint; what cannot be read back is refused before
anything changes."""

from __future__ import annotations

import pytest
import torch
from model_support import hf_greedy, hf_reference, make_random_model

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
from tokenmill.engine.core.errors import ModelLoadError, SleepModeError

VOCAB = 97
ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=32, show_progress=False,
              enable_sleep_mode=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [21, 22, 23]]


def _config(**changes):
    import transformers

    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 tie_word_embeddings=False)
    return transformers.LlamaConfig(**{**shape, **changes})


def _checkpoint(directory: str, seed: int, **changes) -> str:
    """A random Llama of the shared shapes (or changed ones), its weights drawn from `seed`."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(**changes))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(directory)
    word_level_tokenizer(VOCAB).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("reload")
    return {"base": make_random_model(str(root / "base"), _config(), word_level_tokenizer(VOCAB)),
            "trained": _checkpoint(str(root / "trained"), 5)}


@pytest.fixture(scope="module")
def expected(checkpoints) -> dict[str, list[list[int]]]:
    wanted = {name: [hf_greedy(hf_reference(path), p, 8) for p in PROMPTS]
              for name, path in checkpoints.items()}
    assert wanted["base"] != wanted["trained"]  # a change the engine must show
    return wanted


def _greedy(llm: LLM) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("tp", [1, 2])
def test_a_new_checkpoint_is_served_in_place(checkpoints, expected, tp):
    with LLM(checkpoints["base"], dtype="float32", tensor_parallel_size=tp, **ENGINE) as llm:
        assert _greedy(llm) == expected["base"]
        assert llm.engine.kv.stats().cached_blocks > 0
        weight = llm.engine.runner.model.lm_head.weight
        address = weight.data_ptr()
        llm.reload_weights(checkpoints["trained"])
        assert llm.engine.kv.stats().cached_blocks == 0  # the old weights' KV is forgotten
        assert weight.data_ptr() == address  # in place: captured graphs stay valid
        assert _greedy(llm) == expected["trained"]
        llm.sleep(level=2)
        llm.wake_up()  # reads the latest checkpoint, not the one it started from
        assert _greedy(llm) == expected["trained"]
        llm.reload_weights()  # the model's own weights: the latest checkpoint's
        assert _greedy(llm) == expected["trained"]
        llm.reload_weights(checkpoints["base"])
        assert _greedy(llm) == expected["base"]


@pytest.mark.parametrize("tp", [1, 2])
def test_a_trainers_tensors_are_copied_in_by_name(checkpoints, expected, tp):
    """The trained model's named parameters, as a trainer in the same process holds them:
    all of them, then the base model's LM head alone over them."""
    trained = hf_reference(checkpoints["trained"])
    base = hf_reference(checkpoints["base"])
    with LLM(checkpoints["base"], dtype="float32", tensor_parallel_size=tp, **ENGINE) as llm:
        llm.load_weights(trained.named_parameters())
        assert _greedy(llm) == expected["trained"]
        llm.load_weights([("lm_head.weight", base.lm_head.weight)])
        with torch.no_grad():
            trained.lm_head.weight.copy_(base.lm_head.weight)
        assert _greedy(llm) == [hf_greedy(trained, p, 8) for p in PROMPTS]
        with pytest.raises(ModelLoadError, match="'model.nothing.weight' has no place"):
            llm.load_weights([("model.nothing.weight", torch.zeros(3))])


def test_level_2_frees_the_weights_and_waking_reads_them_again(checkpoints):
    """In bfloat16 the CPU's weights are the engine's own memory (not the file's mapped
    pages), so level 2 frees them there too."""
    with LLM(checkpoints["base"], dtype="bfloat16", **ENGINE) as llm:
        before = _greedy(llm)
        llm.sleep(level=2)
        runner = llm.engine.runner
        assert runner.dropped_weights.nbytes > 0
        assert runner.model.model.embed_tokens.weight.untyped_storage().nbytes() == 0
        assert runner.model.lm_head.weight.untyped_storage().nbytes() == 0
        with pytest.raises(SleepModeError, match="wake them up first"):
            llm.reload_weights(checkpoints["trained"])
        llm.wake_up()
        assert runner.dropped_weights is None
        assert _greedy(llm) == before


def test_what_cannot_be_read_back_is_refused_before_anything_changes(checkpoints, expected,
                                                                     tmp_path):
    wider = _checkpoint(str(tmp_path / "wider"), 6, intermediate_size=192)
    with LLM(checkpoints["base"], dtype="float32", **ENGINE) as llm:
        with pytest.raises(ModelLoadError, match="intermediate_size 128 -> 192"):
            llm.reload_weights(wider)
        with pytest.raises(FileNotFoundError, match="not found"):
            llm.reload_weights(str(tmp_path / "nowhere"))
        llm.engine.add_request("busy", PROMPTS[0], GREEDY)
        try:
            with pytest.raises(SleepModeError, match="waits for an idle engine"):
                llm.reload_weights(checkpoints["trained"])
        finally:
            llm.engine.abort_request("busy")
        assert _greedy(llm) == expected["base"]
    for options, reason in (({"quantization": "int8"}, "quantized \\(int8\\)"),
                            ({"enable_lora": True}, "LoRA's slots")):
        with LLM(checkpoints["base"], **options, **ENGINE) as llm:
            for act in (lambda: llm.reload_weights(checkpoints["trained"]),
                        lambda: llm.sleep(level=2)):
                with pytest.raises(ValueError, match=reason):
                    act()
            assert not llm.engine.is_sleeping
