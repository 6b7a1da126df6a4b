"""Qwen3.5's text model (`Qwen3_5ForCausalLM`, and on text the language model of
`Qwen3_5ForConditionalGeneration`), its mixtures of experts and Qwen3-Next: gated delta nets
(linear attention, a state per sequence in place of keys and values) and gated full
attention. Greedy output and log-probabilities equal transformers batched, chunked (a chunk
past the delta rule's own chunk of 64 too), alone, when sequences reuse each other's state
slots, when they are preempted, forked (n > 1), under async scheduling and over two
tensor-parallel ranks; prefix caching is off; speculative decoding is refused by its option."""

from __future__ import annotations

import pytest
import torch
from model_support import (
    greedy_with_hf_logprobs,
    hf_greedy,
    hf_logprobs,
    hf_reference,
    make_random_model,
)
from qwen3_5_support import qwen3_5_config, qwen3_5_moe_config, qwen3_next_config
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.layers.gated_delta import delta_prompts, delta_step, l2_normalized

MAX_NEW = 8
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              dtype="float32")


def _make(directory: str, config, tokenizer, auto_class: str = "AutoModelForCausalLM") -> str:
    """Norms drawn (transformers starts Qwen3.5's at zero: 1 + weight), and A_log and
    dt_bias too, so that each head decays and writes at its own rate."""
    make_random_model(directory, config, tokenizer, draw_norms=True, auto_class=auto_class)
    path = f"{directory}/model.safetensors"
    tensors = load_file(path)
    for name in tensors:
        if name.endswith(("A_log", "dt_bias")):
            tensors[name] = torch.rand(tensors[name].shape) * 2 - 1
    tensors["mtp.fc.weight"] = torch.zeros(4, 4)  # a draft head the engine does not read
    save_file(tensors, path, metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory, vocab_tokenizer) -> str:
    return _make(str(tmp_path_factory.mktemp("qwen3_5")), qwen3_5_config(len(vocab_tokenizer)),
                 vocab_tokenizer)


@pytest.fixture(scope="module")
def reference(qwen3_5_dir):
    return hf_reference(qwen3_5_dir)


@pytest.fixture(scope="module")
def expected(reference, prompts) -> list[list[int]]:
    return [hf_greedy(reference, p, MAX_NEW) for p in prompts]


def _greedy(llm: LLM, prompts: list[list[int]], n: int = 1) -> list[list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, n=n)
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def _all_released(llm: LLM) -> None:
    kv = llm.engine.kv
    kv.allocator.check_all_free()
    assert kv.states.num_free == kv.states.num_slots


def test_greedy_and_logprobs_equal_transformers(qwen3_5_dir, reference, prompts, expected):
    with LLM(qwen3_5_dir, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        again = [out[0] for out in _greedy(llm, prompts)]
        alone = [_greedy(llm, [p])[0][0] for p in prompts[-2:]]
        _all_released(llm)
    assert again == expected
    assert alone == expected[-2:]


def test_slots_reused_preempted_and_forked_equal_transformers(qwen3_5_dir, prompts,
                                                              expected):
    """Two slots for five prompts (each new owner starts from zero), a pool too small for
    all of them at once (preemption recomputes a state from the tokens), and n = 3 (each
    fork gets a copy of its parent's state after the prompt)."""
    with LLM(qwen3_5_dir, **dict(ENGINE, max_num_seqs=2)) as llm:
        assert [out[0] for out in _greedy(llm, prompts)] == expected
        _all_released(llm)
    with LLM(qwen3_5_dir, **dict(ENGINE, num_gpu_blocks_override=14)) as llm:
        assert [out[0] for out in _greedy(llm, prompts)] == expected
        assert llm.engine.scheduler.num_preemptions > 0
        _all_released(llm)
    with LLM(qwen3_5_dir, **ENGINE) as llm:
        assert _greedy(llm, prompts[:2], n=3) == [[e] * 3 for e in expected[:2]]
        _all_released(llm)


def test_async_scheduling_equals_transformers(qwen3_5_dir, prompts, expected):
    with LLM(qwen3_5_dir, async_scheduling=True, **ENGINE) as llm:
        assert [out[0] for out in _greedy(llm, prompts)] == expected


def test_states_kept_in_bfloat16_stay_close(qwen3_5_dir, reference, prompts):
    """--mamba-ssm-cache-dtype bfloat16: half the memory per slot; each token the engine
    picks has, under the reference model, a log-probability within 0.05 of the engine's."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    with LLM(qwen3_5_dir, mamba_ssm_cache_dtype="bfloat16", **ENGINE) as llm:
        assert llm.engine.runner.states.ssm.dtype == torch.bfloat16
        outputs = [o.outputs[0] for o in llm.generate(prompts[-2:], params)]
    for prompt, out in zip(prompts[-2:], outputs, strict=True):
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(hf_logprobs(reference, prompt, out.token_ids), abs=0.05)
    with pytest.raises(ConfigError, match="mamba_ssm_cache_dtype"):
        LLM(qwen3_5_dir, mamba_ssm_cache_dtype="int8", **ENGINE)


def test_a_prompt_longer_than_the_rules_chunk(qwen3_5_dir, reference, vocab_tokenizer):
    """A prompt of more than 64 tokens in one step: the delta rule solves it in two chunks."""
    prompt = vocab_tokenizer.encode("the river runs past the mill and on to the sea " * 9)
    assert len(prompt) > 64
    with LLM(qwen3_5_dir, **dict(ENGINE, max_num_batched_tokens=256)) as llm:
        assert _greedy(llm, [prompt])[0][0] == hf_greedy(reference, prompt, MAX_NEW)


def test_the_kv_pool_holds_the_attention_layers_only(qwen3_5_dir):
    with LLM(qwen3_5_dir, **ENGINE) as llm:
        runner = llm.engine.runner
        assert runner.kv_pool.shape[0] == 1  # one full-attention layer of four
        # 3 layers, 8 sequences' slots, 2 checkpoints' and padding's
        assert runner.states.ssm.shape == (3, 11, 4, 8, 16)
        assert runner.states.conv.shape == (3, 11, 2 * 2 * 8 + 4 * 16, 3)
        assert runner.kv_caches[2].k.data_ptr() == runner.kv_pool[0, 0].data_ptr()


def test_the_profiled_step_runs_and_leaves_the_states_untouched(qwen3_5_dir, prompts,
                                                                expected):
    """The profile of the KV pool runs the largest step over a temporary runner holding
    states for max_num_seqs sequences of its own; the engine's states are not written."""
    from tokenmill.engine.execution.profile_run import MemoryReading, profile_memory

    class Probe:
        def reset(self) -> None:
            pass

        def read(self) -> MemoryReading:
            return MemoryReading(8 << 30, 4 << 30, 0, 0, 0)

    with LLM(qwen3_5_dir, **ENGINE) as llm:
        runner = llm.engine.runner
        states = (runner.states.conv.clone(), runner.states.ssm.clone())
        profile_memory(runner.model, runner.layout, runner.device, runner.attention_backend,
                       Probe(), max_num_batched_tokens=32, max_num_seqs=8,
                       max_model_len=llm.engine.max_model_len)
        assert torch.equal(runner.states.conv, states[0])
        assert torch.equal(runner.states.ssm, states[1])
        assert llm.engine.memory_report()["recurrent_state_bytes"] == \
            sum(t.numel() * t.element_size() for t in states)
        assert [out[0] for out in _greedy(llm, prompts)] == expected


@pytest.mark.parametrize("kind", ["qwen3_5_moe", "qwen3_5_moe_stacked", "qwen3_next"])
def test_the_mixtures_of_experts_equal_transformers(tmp_path, vocab_tokenizer, prompts, kind):
    """Qwen3.5-MoE (its experts as transformers writes them, one tensor per expert's part,
    and as it holds them, two stacked tensors per layer) and Qwen3-Next (a gated delta net's
    projections fused per key head, a dense layer among the sparse ones)."""
    vocab = len(vocab_tokenizer)
    config = qwen3_next_config(vocab) if kind == "qwen3_next" else qwen3_5_moe_config(vocab)
    directory = _make(str(tmp_path), config, vocab_tokenizer)
    reference = hf_reference(directory)
    if kind == "qwen3_5_moe_stacked":
        tensors = {k: v.contiguous() for k, v in reference.state_dict().items()}
        assert "model.layers.0.mlp.experts.gate_up_proj" in tensors
        save_file(tensors, f"{directory}/model.safetensors", metadata={"format": "pt"})
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected
        assert [out[0] for out in _greedy(llm, prompts)] == expected
        _all_released(llm)


def test_the_language_model_of_the_multimodal_checkpoint(tmp_path, vocab_tokenizer, prompts):
    import transformers

    vocab = len(vocab_tokenizer)
    config = transformers.Qwen3_5Config(
        text_config=qwen3_5_config(vocab).to_dict(),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64),
        image_token_id=vocab - 1, video_token_id=vocab - 2, vision_start_token_id=vocab - 3)
    directory = _make(str(tmp_path), config, vocab_tokenizer,
                      auto_class="AutoModelForImageTextToText")
    model = hf_reference(directory, "AutoModelForImageTextToText")
    expected = [hf_greedy(model, p, MAX_NEW) for p in prompts]
    with LLM(directory, **ENGINE) as llm:
        assert [out[0] for out in _greedy(llm, prompts)] == expected


def test_tensor_parallel_equals_transformers(qwen3_5_dir, reference, prompts, expected):
    """Two ranks: each holds one key head of the gated delta nets with the two value heads
    it serves (their rows of in_proj_qkv and of the convolution taken from each kind's
    block) and its states, and half the attention heads, each with its gate."""
    with LLM(qwen3_5_dir, tensor_parallel_size=2, **ENGINE) as llm:
        layer = llm.engine.runner.model.model.layers[0].linear_attn
        assert (layer.shape.num_k_heads, layer.shape.num_v_heads) == (1, 2)
        assert llm.engine.runner.states.ssm.shape[2] == 2
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_tensor_parallel_splits_the_experts_and_qwen3_nexts_fused_projections(
        tmp_path, vocab_tokenizer, prompts):
    directory = _make(str(tmp_path), qwen3_next_config(len(vocab_tokenizer)), vocab_tokenizer)
    reference = hf_reference(directory)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert greedy_with_hf_logprobs(llm, reference, prompts, MAX_NEW) == expected


def test_tp_needs_whole_key_heads_and_speculation_is_refused(qwen3_5_dir):
    with pytest.raises(ConfigError, match="tensor_parallel_size.*2 linear-attention key heads"):
        LLM(qwen3_5_dir, tensor_parallel_size=4, **ENGINE)
    with pytest.raises(ConfigError, match="speculative_config.*linear-attention"):
        LLM(qwen3_5_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 2},
            **ENGINE)


def test_the_chunked_rule_equals_the_rule_token_by_token():
    """Two prompt chunks of 150 tokens (three chunks of the rule) and 70, padded together,
    from states already holding something, against the recurrence one token at a time: the
    same outputs and the same final states; padding neither decays nor writes, and the
    other slots are untouched."""
    torch.manual_seed(0)
    heads, key_dim, value_dim, lengths = 3, 8, 5, [150, 70]
    longest = max(lengths)
    q = l2_normalized(torch.randn(2, longest, heads, key_dim)) * key_dim ** -0.5
    k = l2_normalized(torch.randn(2, longest, heads, key_dim))
    v = torch.randn(2, longest, heads, value_dim)
    g, beta = -torch.rand(2, longest, heads) * 2, torch.rand(2, longest, heads)
    own = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None])[..., None]
    start = torch.randn(4, heads, key_dim, value_dim)
    chunked, slots = start.clone(), torch.tensor([2, 0])
    out = delta_prompts(q, k, v, g * own, beta * own, chunked, slots)
    for i, length in enumerate(lengths):
        states = start.clone()
        slot = slots[i:i + 1]
        steps = torch.cat([delta_step(q[i, t:t + 1], k[i, t:t + 1], v[i, t:t + 1],
                                      g[i, t:t + 1], beta[i, t:t + 1], states, slot)
                           for t in range(length)])
        assert torch.allclose(out[i, :length], steps, atol=1e-5)
        assert torch.allclose(chunked[slot], states[slot], atol=1e-5)
    assert torch.equal(chunked[[1, 3]], start[[1, 3]])


def test_a_lora_adapter_equals_peft(qwen3_5_dir, tmp_path, prompts):
    """An adapter on every projection PEFT finds: the gated q_proj (its rows twice as many
    as the queries'), k, v, o and the MLPs of every layer."""
    from lora_support import ALL_TARGETS, Adapter, make_adapter, peft_greedy

    from tokenmill.engine import LoRARequest

    adapter = make_adapter(qwen3_5_dir, str(tmp_path / "adapter"),
                           Adapter("gated", 4, 8, ALL_TARGETS))
    expected = peft_greedy(qwen3_5_dir, adapter, prompts[:3], MAX_NEW)
    assert expected != peft_greedy(qwen3_5_dir, None, prompts[:3], MAX_NEW)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(qwen3_5_dir, enable_lora=True, max_lora_rank=8, **ENGINE) as llm:
        outputs = llm.generate(prompts[:3], params, lora_request=LoRARequest("gated", 1, adapter))
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_a_hybrid_of_other_recurrent_layers_is_refused_by_name(tmp_path, vocab_tokenizer):
    """Zamba2 names its Mamba layers "linear_attention" too: not a gated delta net, so the
    model is refused as unsupported, not read as one."""
    import transformers

    from tokenmill.engine.contract.model_shape import recurrent_shape_of
    from tokenmill.engine.models.source import ModelLoadError

    config = transformers.Zamba2Config(
        vocab_size=len(vocab_tokenizer), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, layers_block_type=["mamba", "hybrid"],
        architectures=["Zamba2ForCausalLM"])
    assert "linear_attention" in config.layer_types and recurrent_shape_of(config) is None
    config.save_pretrained(tmp_path)
    vocab_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="Zamba2ForCausalLM.*not supported"):
        LLM(str(tmp_path), **ENGINE)
