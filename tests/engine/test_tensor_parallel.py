"""Tensor parallelism on CPU (gloo): TP=N greedy output equals TP=1 token for token, every
rank holds only its shard, and a worker that dies takes the engine down with its reason."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch
from model_support import REFERENCE, make_random_model, mixed_prompts
from process_support import alive, children

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench import random_model
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.contract.model_shape import ModelShape
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.execution.workers import WorkerFailed

MAX_NEW = 10  # any 10 positions cross a block boundary: every sequence grows a block in decode
# Small steps so that long prompts are prefilled in chunks, and room for several at once.
ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=48, show_progress=False)


def _config(kind: str, vocab: int):
    import transformers

    # 8 query heads: TP=2 and TP=4 both split them. Llama's 2 KV heads are split at TP=2 and
    # replicated at TP=4; Qwen3's 4 are split at both. A vocabulary of len(tokenizer) + 3
    # divides by neither, so the last rank's embedding and LM head rows are padded.
    common = dict(vocab_size=vocab + 3, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=8, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if kind == "qwen3":
        return transformers.Qwen3Config(num_key_value_heads=4, head_dim=32, **common)
    return transformers.LlamaConfig(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                    **common)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def checkpoint(request, tmp_path_factory, smol_tokenizer):
    directory = str(tmp_path_factory.mktemp(f"tp-{request.param}"))
    return make_random_model(directory, _config(request.param, len(smol_tokenizer)),
                             smol_tokenizer)


def _prompts(tokenizer) -> list[list[int]]:
    """Short and long prompts (chunked at 48 tokens a step), two sharing a long prefix."""
    return mixed_prompts(tokenizer, shared_steps=20, repeats=8)


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def tp1(checkpoint, smol_tokenizer):
    """TP=1's greedy output and weight bytes, computed once per checkpoint for every size."""
    with LLM(checkpoint, **ENGINE) as single:
        return _greedy(single, _prompts(smol_tokenizer)), single.engine.memory_report()[
            "weights_bytes"]


@pytest.mark.parametrize("size", [2, 4])
def test_tp_greedy_equals_tp1_batched_chunked_prefix_cached(checkpoint, tp1, size,
                                                            smol_tokenizer):
    if size == 4 and "qwen3" in checkpoint:
        pytest.skip("four ranks matter where they replicate KV heads (Llama's two); Qwen3's "
                    "four split as at two ranks")
    prompts = _prompts(smol_tokenizer)
    expected, whole = tp1
    with LLM(checkpoint, tensor_parallel_size=size, **ENGINE) as llm:
        assert len(llm.engine.workers.pids) == size - 1
        # Rank 0 holds its shard: 1/size of the weights, plus replicated norms and padding.
        assert llm.engine.memory_report()["weights_bytes"] < whole / size * 1.02
        batched = _greedy(llm, prompts)
        hits_before = llm.engine.kv.prefix_hits
        again = _greedy(llm, prompts)  # the prompts' blocks are cached now
        assert llm.engine.kv.prefix_hits > hits_before
        alone = [_greedy(llm, [p])[0] for p in prompts[:2]]
    assert batched == expected
    assert again == expected
    assert alone == expected[:2]


def test_smollm2_tp3_equals_tp1(smol_llm, smol_tokenizer, smollm2_dir):
    """SmolLM2 has 9 heads and 3 KV heads: TP=3 gives each rank 3 and 1 (each rank reads only
    its rows of the safetensors checkpoint)."""
    prompts = [smol_tokenizer.encode(t) for t in
               ["The capital of France is", "def fibonacci(n):", "Once upon a time"]]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    expected = [o.outputs[0].token_ids for o in smol_llm.generate(prompts, params)]
    with LLM(str(smollm2_dir), tensor_parallel_size=3, show_progress=False,
             **REFERENCE) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == expected


def test_a_size_that_does_not_divide_the_heads_is_refused_before_any_worker(tiny_llama_dir):
    before = set(children(os.getpid()))
    with pytest.raises(ConfigError, match="tensor_parallel_size: 3 does not divide this "
                                          "model's 4 attention heads"):
        LLM(tiny_llama_dir, tensor_parallel_size=3, show_progress=False)
    assert set(children(os.getpid())) == before


def test_each_rank_holds_only_its_shard(smol_tokenizer):
    """Rank shards put back together are the checkpoint: column-parallel rows, row-parallel
    columns, replicated KV heads where there are fewer than ranks, padded vocabulary rows, and
    a row-parallel bias held once."""
    config = _config("llama", len(smol_tokenizer))
    torch.manual_seed(0)
    hd = 16
    full = {"q_proj": torch.randn(8 * hd, 128), "k_proj": torch.randn(2 * hd, 128),
            "o_proj": torch.randn(128, 8 * hd), "embed_tokens": torch.randn(config.vocab_size, 4),
            "down_bias": torch.randn(128)}
    for size in (2, 4):
        plans = [ShardPlan.for_model(config, rank, size) for rank in range(size)]
        q = [p.shard("model.layers.0.self_attn.q_proj.weight", full["q_proj"]) for p in plans]
        assert torch.equal(torch.cat(q), full["q_proj"])
        o = [p.shard("model.layers.0.self_attn.o_proj.weight", full["o_proj"]) for p in plans]
        assert torch.equal(torch.cat(o, dim=1), full["o_proj"])
        k = [p.shard("model.layers.0.self_attn.k_proj.weight", full["k_proj"]) for p in plans]
        for rank, part in enumerate(k):
            kv_head = rank * 2 // size  # query heads 4r/size.. read KV head (8r/size) // 4
            assert torch.equal(part, full["k_proj"][kv_head * hd:(kv_head + 1) * hd])
        emb = [p.shard("model.embed_tokens.weight", full["embed_tokens"]) for p in plans]
        assert {tuple(e.shape) for e in emb} == {(-(-config.vocab_size // size), 4)}
        assert torch.equal(torch.cat(emb)[:config.vocab_size], full["embed_tokens"])
        assert not torch.cat(emb)[config.vocab_size:].any()
        bias = [p.shard("model.layers.0.mlp.down_proj.bias", full["down_bias"]) for p in plans]
        assert torch.equal(sum(bias), full["down_bias"])


def test_a_gguf_ranks_weights_are_its_slices_of_the_dequantized_file(smol_source, smol_llm):
    """Under tensor parallelism a GGUF file is dequantized a tensor at a time and each rank
    keeps its part: rank 1 of 3 of SmolLM2's GGUF holds exactly its slices of the whole
    model's weights (3 query heads and 1 KV head of each layer, a third of every MLP)."""
    from tokenmill.engine.distributed.group import TPGroup
    from tokenmill.engine.models.loader import build_model, checkpoint_tensors, load_config

    config = load_config(smol_source)
    rank = build_model(config, smol_source, 64, torch.float32, torch.device("cpu"),
                       show_progress=False, quantization="none", tp=TPGroup(1, 3))
    whole = checkpoint_tensors(smol_llm.engine.runner.model)
    plan = ShardPlan.for_model(config, 1, 3)
    held = checkpoint_tensors(rank)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.29.self_attn.o_proj.weight", "model.layers.29.mlp.down_proj.weight",
                 "model.layers.3.mlp.up_proj.weight", "model.embed_tokens.weight"):
        assert torch.equal(held[name], plan.shard(name, whole[name])), name
    assert held["model.layers.0.self_attn.k_proj.weight"].shape[0] == config.hidden_size // 9


def test_a_dead_worker_fails_the_next_step_with_its_rank(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, **ENGINE)
    try:
        assert _greedy(llm, [[5, 6, 7]])
        (pid,) = llm.engine.workers.pids
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerFailed, match=rf"rank 1 \(pid {pid}\) was killed by SIGKILL"):
            _greedy(llm, [[5, 6, 7]])
        assert time.monotonic() - start < 15
    finally:
        llm.shutdown()
    assert not alive(pid)


def test_shutdown_ends_every_worker(tiny_llama_dir):
    with LLM(tiny_llama_dir, tensor_parallel_size=2, **ENGINE) as llm:
        pids = llm.engine.workers.pids
        assert all(alive(p) for p in pids)
    assert not any(alive(p) for p in pids)
    assert torch.get_num_threads() == llm.engine._threads  # rank 0 gave its cores back



@pytest.mark.parametrize("shape", sorted(random_model.SHAPES))
def test_benchmark_shapes_shard_at_every_crd_size(shape):
    config = random_model.shape_config(shape, 49152)
    for size in (1, 2, 4, 8):
        plan = ShardPlan.for_model(config, size - 1, size)
        assert plan.num_heads * size == config.num_attention_heads
        assert plan.expert_size * size == ModelShape.of(config).expert_intermediate_size


def test_make_model_writes_a_checkpoint_the_engine_serves_at_tp2(tmp_path, monkeypatch):
    monkeypatch.setitem(random_model.SHAPES, "tiny", ("Qwen3Config", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256)))
    directory = random_model.make_model("tiny", str(tmp_path / "tiny"), "float32")
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert llm.engine.model_config.model_type == "qwen3"
        assert len(_greedy(llm, [[5, 6, 7]])[0]) == MAX_NEW


def test_workers_never_run_the_parents_main_script(tmp_path, tiny_llama_dir, monkeypatch):
    """Workers start from multiprocessing's fork server, whose children would otherwise run the
    parent's main script again: a script that builds the engine at its top level (without
    `if __name__ == "__main__":`) would build it again in every worker."""
    ran = tmp_path / "ran"
    script = tmp_path / "offline.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__file__", str(script), raising=False)
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    with LLM(tiny_llama_dir, tensor_parallel_size=2, **ENGINE) as llm:
        assert _greedy(llm, [[5, 6, 7]])
    assert not ran.exists()
