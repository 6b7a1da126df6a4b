"""The engine's greedy output is the same whether attention runs in torch or in the Triton kernels.

Without a GPU the kernels run in Triton's CPU interpreter, so the model and prompts are tiny.
"""

from __future__ import annotations

import random

import pytest
import torch
from triton_support import DEVICE, KV_CACHE_MEMORY

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.layers.attention import resolve_backend


def _outputs(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_greedy_output_is_unchanged_through_the_triton_kernels(tiny_llama_dir):
    rng = random.Random(7)
    shared = [rng.randrange(100, 40000) for _ in range(20)]  # a prefix-cache hit after the first
    prompts = [shared + [rng.randrange(100, 40000) for _ in range(n)] for n in (3, 17, 30)]
    prompts.append([5, 6, 7])
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 4, 5, 8)]
    # A small token budget chunks the long prompts and mixes chunks with decodes in one step.
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 24,
               "max_num_seqs": 4, "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY}
    reference = LLM(tiny_llama_dir, attention_backend="torch", **options)
    kernels = LLM(tiny_llama_dir, attention_backend="triton", **options)
    assert kernels.engine.runner.attention_backend == "triton"
    expected = _outputs(reference, prompts, params)
    assert _outputs(kernels, prompts, params) == expected
    # Again: the shared prefix now comes from the cache, and prompts extend it.
    assert _outputs(kernels, prompts[1:3], params[1:3]) == expected[1:3]
    kernels.engine.kv.allocator.check_all_free()


def test_sliding_windows_and_soft_caps_run_through_the_kernels(tmp_path, vocab_tokenizer):
    """Gemma 2's layers: every other one slides over 8 positions, every score is soft-capped;
    prompts run past the window in chunks, and their decodes slide too."""
    import transformers
    from model_support import make_random_model

    config = transformers.Gemma2Config(
        vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        sliding_window=8, attn_logit_softcapping=2.0, max_position_embeddings=256)
    directory = make_random_model(str(tmp_path / "gemma2"), config, vocab_tokenizer)
    rng = random.Random(3)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 30)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 16,
               "max_num_seqs": 2,
               "block_size": 8, "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY}
    with LLM(directory, attention_backend="torch", **options) as reference:
        expected = _outputs(reference, prompts, params)
    with LLM(directory, attention_backend="triton", **options) as kernels:
        assert _outputs(kernels, prompts, params) == expected


def test_attention_sinks_run_through_the_kernels(tmp_path, vocab_tokenizer):
    """GPT-OSS's layers: a sink logit per head in every softmax, sliding and full layers
    alternating; prompts run past the window in chunks, and their decodes split the context."""
    from gpt_oss_support import make_gpt_oss

    directory = make_gpt_oss(str(tmp_path / "gpt-oss"), vocab_tokenizer, num_hidden_layers=2)
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 30)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 16,
               "max_num_seqs": 2, "block_size": 8, "device": DEVICE.type,
               "kv_cache_memory": KV_CACHE_MEMORY}
    with LLM(directory, attention_backend="torch", **options) as reference:
        expected = _outputs(reference, prompts, params)
    with LLM(directory, attention_backend="triton", **options) as kernels:
        assert _outputs(kernels, prompts, params) == expected


def test_auto_picks_triton_only_on_cuda():
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_backend("torch", torch.device("cuda")) == "torch"


def test_triton_on_cpu_without_the_interpreter_is_a_config_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="attention_backend.*TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.device("cpu"))
    with pytest.raises(ConfigError, match="attention_backend"):
        LLM("unused", attention_backend="cuda")


@pytest.mark.parametrize("kind", ["deepseek_v3", "deepseek_v32"])
def test_latent_attention_runs_through_the_kernels(tmp_path, vocab_tokenizer, kind):
    """DeepSeek's layers: one cached latent row (a head 40 wide, not a power of two) read by
    every query head as both key and value; prompts in chunks, decodes after. The tokens'
    log-probabilities equal the torch path's, which a slip in the row's layout would move.
    DeepSeek-V3.2's row is 56 wide (the indexer's key past the latent's), its indexer's
    queries and keys turned by the rotary kernel, and the longer context's attention sparse."""
    from deepseek_support import make_deepseek

    directory = make_deepseek(str(tmp_path / "deepseek"), kind, vocab_tokenizer,
                              num_hidden_layers=2)
    rng = random.Random(11)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 30)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 16,
               "max_num_seqs": 2, "block_size": 8, "device": DEVICE.type,
               "kv_cache_memory": KV_CACHE_MEMORY}

    def run(backend: str) -> list[tuple[list[int], list[float]]]:
        with LLM(directory, attention_backend=backend, **options) as llm:
            outs = [o.outputs[0] for o in llm.generate(prompts, params)]
        return [(o.token_ids, [step[t] for step, t in zip(o.logprobs, o.token_ids, strict=True)])
                for o in outs]

    expected, got = run("torch"), run("triton")
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, logprobs), (_, reference) in zip(got, expected, strict=True):
        assert logprobs == pytest.approx(reference, abs=1e-4)


@pytest.mark.parametrize("family", ["gemma3", "qwen2_vl"])
def test_images_run_through_the_kernels(tmp_path, vocab_tokenizer, family):
    """Gemma 3's image rows see each other both ways in the prefill kernel, and Qwen2-VL's
    take their 3-D rotary positions in the rotary kernel, as in the torch path, in chunks
    and from the prefix cache."""
    pytest.importorskip("PIL", reason="images need Pillow, which this machine lacks")
    from image_support import HFGemma3, HFQwenVL, drawn_image, make_gemma3, make_qwen_vl

    if family == "gemma3":
        directory = make_gemma3(str(tmp_path / "gemma3"), vocab_tokenizer)
        marker = HFGemma3(directory).placeholder
    else:
        directory = make_qwen_vl(str(tmp_path / "qwen2_vl"), vocab_tokenizer)
        marker = HFQwenVL(directory).placeholder
    words = vocab_tokenizer.encode("tell me what the picture shows")
    prompts = [{"prompt_token_ids": words[:2] + [marker] + words[2:], "multi_modal_data": {
        "image": [drawn_image(seed)]}} for seed in (0, 1)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=0)
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 12,
               "max_num_seqs": 2, "block_size": 8, "device": DEVICE.type,
               "kv_cache_memory": KV_CACHE_MEMORY}
    runs = {}
    for backend in ("torch", "triton"):
        with LLM(directory, attention_backend=backend, **options) as llm:
            runs[backend] = [o.outputs[0] for o in llm.generate(prompts * 2, params)]
    for got, expected in zip(runs["triton"], runs["torch"], strict=True):
        assert got.token_ids == expected.token_ids
        assert [s[t] for s, t in zip(got.logprobs, got.token_ids, strict=True)] == \
            pytest.approx([s[t] for s, t in zip(expected.logprobs, expected.token_ids,
                                                strict=True)], abs=1e-4)


def test_ministral3s_query_scale_runs_through_the_kernels_and_graphs(tmp_path, vocab_tokenizer):
    """Ministral 3's queries scaled by position (past a pretraining context of 4 here) on the
    Triton path, in prompt chunks and in captured decode steps, whose positions change from
    one replay to the next."""
    import transformers
    from model_support import make_random_model

    config = transformers.Ministral3Config(
        vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                         "original_max_position_embeddings": 4, "llama_4_scaling_beta": 0.5})
    directory = make_random_model(str(tmp_path / "ministral3"), config, vocab_tokenizer)
    _graphed_kernels_equal_torch(directory, seed=9)


def test_gemma4s_layers_of_two_head_sizes_run_through_the_kernels_and_graphs(
        tmp_path, vocab_tokenizer):
    """Gemma 4's full-attention layers read narrower views of the pool's rows (one KV head
    of 32 where the sliding layers' rows hold two of 16): the kernels follow their strides, in
    prompt chunks, sliding windows and captured decode steps, as the torch path does; with
    E2B's per-layer inputs, and two last layers reading earlier layers' KV."""
    from gemma4_support import LAYERS, gemma4_config
    from model_support import make_random_model

    changes = dict(num_hidden_layers=6, layer_types=LAYERS + LAYERS[:2],
                   hidden_size_per_layer_input=8, vocab_size_per_layer_input=len(vocab_tokenizer),
                   num_kv_shared_layers=2)
    directory = make_random_model(str(tmp_path / "gemma4"),
                                  gemma4_config(len(vocab_tokenizer), **changes),
                                  vocab_tokenizer, draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=11)


def test_gemma3ns_streams_run_through_the_kernels_and_graphs(tmp_path, vocab_tokenizer):
    """Gemma 3n's layers over AltUp's streams: their norms through the norm kernel, attention
    through the kernels in prompt chunks, sliding windows and captured decode steps."""
    from gemma3n_support import gemma3n_config
    from model_support import make_random_model

    directory = make_random_model(str(tmp_path / "gemma3n"), gemma3n_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=12)


def test_qwen3_5s_linear_attention_runs_beside_the_kernels_and_graphs(tmp_path,
                                                                    vocab_tokenizer):
    """Qwen3.5's gated delta nets (torch ops, reading and writing each sequence's state slot)
    between gated attention layers on the kernels: captured decode steps gather and scatter
    the states of the slots the buffers name (padding sequences the slot of none)."""
    from model_support import make_random_model
    from qwen3_5_support import qwen3_5_config

    directory = make_random_model(str(tmp_path / "qwen3_5"),
                                  qwen3_5_config(len(vocab_tokenizer)), vocab_tokenizer,
                                  draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=13)


def test_granite_4_hs_mamba_layers_run_beside_the_kernels_and_graphs(tmp_path, vocab_tokenizer):
    """Granite 4.0-H's Mamba-2 layers (torch ops over each sequence's state slot, gathered and
    scattered in captured decode steps) between attention on the kernels."""
    from granite_hybrid_support import granite_hybrid_config
    from model_support import make_random_model

    config = granite_hybrid_config(len(vocab_tokenizer), num_local_experts=0)
    directory = make_random_model(str(tmp_path / "granite"), config, vocab_tokenizer,
                                  draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=19)


def test_nemotron_hs_blocks_run_beside_the_kernels_and_graphs(tmp_path, vocab_tokenizer):
    """Nemotron-H's one-mixer blocks (Mamba-2 layers, MLPs, attention on the kernels, which
    alone holds keys and values) in captured decode steps."""
    from model_support import make_random_model
    from nemotron_h_support import LAYERS, nemotron_h_config

    config = nemotron_h_config(len(vocab_tokenizer), layers_block_type=[
        "mlp" if kind == "moe" else kind for kind in LAYERS])
    directory = make_random_model(str(tmp_path / "nemotron_h"), config, vocab_tokenizer,
                                  draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=23)


def test_lfm2s_convolutions_run_beside_the_kernels_and_graphs(tmp_path, vocab_tokenizer):
    """LFM2's short convolutions (torch ops over each sequence's state slot) between
    attention layers on the kernels, in captured decode steps."""
    from lfm2_support import lfm2_config
    from model_support import make_random_model

    directory = make_random_model(str(tmp_path / "lfm2"), lfm2_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=29)


@pytest.mark.parametrize("family", ["jamba", "falcon_mamba", "falcon_h1"])
def test_mamba_layers_run_beside_the_kernels_and_graphs(tmp_path, vocab_tokenizer, family):
    """Mamba-1 layers whose prompt chunks scan on the selective-scan kernel, beside Jamba's
    attention and experts, and alone (Falcon Mamba: no attention, no KV); Falcon-H1's
    attention and Mamba-2 side by side in every layer; all in captured decode steps."""
    from falcon_h1_support import falcon_h1_config
    from jamba_support import jamba_config
    from mamba1_support import mamba1_config
    from model_support import make_random_model

    vocab = len(vocab_tokenizer)
    config = {"jamba": lambda: jamba_config(vocab),
              "falcon_mamba": lambda: mamba1_config(vocab, falcon=True),
              "falcon_h1": lambda: falcon_h1_config(vocab)}[family]()
    directory = make_random_model(str(tmp_path / family), config, vocab_tokenizer,
                                  draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=37)


def test_llama4s_chunked_attention_runs_through_the_kernels_and_graphs(tmp_path,
                                                                     vocab_tokenizer):
    """Llama 4's rotating layers attend within chunks of 8 positions (prompt chunks and
    captured decode steps cross them), its other layers over the whole context."""
    from llama4_support import llama4_config
    from model_support import make_random_model

    directory = make_random_model(str(tmp_path / "llama4"), llama4_config(len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=17)


def test_alibi_runs_through_the_kernels_and_graphs(tmp_path, vocab_tokenizer):
    """BLOOM's ALiBi slopes (six heads: past the largest power of two) bias the kernels'
    scores in prompt chunks and in captured decode steps."""
    import transformers
    from model_support import make_random_model

    config = transformers.BloomConfig(vocab_size=len(vocab_tokenizer), hidden_size=96,
                                      n_layer=2, n_head=6, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0)
    directory = make_random_model(str(tmp_path / "bloom"), config, vocab_tokenizer,
                                  draw_norms=True)
    _graphed_kernels_equal_torch(directory, seed=41)


def _graphed_kernels_equal_torch(directory: str, seed: int) -> None:
    """Greedy output through the Triton kernels with decode graphs captured equals the torch
    path's, for a short prompt and one of several chunks (16-token steps, 8-token blocks)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (3, 26)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 16,
               "max_num_seqs": 2, "block_size": 8, "device": DEVICE.type,
               "kv_cache_memory": KV_CACHE_MEMORY, "max_model_len": 64}
    with LLM(directory, attention_backend="torch", **options) as reference:
        expected = _outputs(reference, prompts, params)
    with LLM(directory, attention_backend="triton", **options) as kernels:
        runner = kernels.engine.runner
        runner.capture_decode_graphs(2, 16, kernels.engine.max_model_len)
        assert _outputs(kernels, prompts, params) == expected
        assert runner.graphs.replays > 0
