"""Greedy output equals Hugging Face transformers token for token in float32, on the device the
kernels run on: CUDA on a GPU machine, the CPU elsewhere (where it stays a few seconds).

Random-weight Llama and Qwen3 go through what a GPU run turns on: decode CUDA graphs (on by
default there; asserted captured and replayed), ragged prompts in one batch, prefill in
chunks, async scheduling, a prefix-cache hit, n-gram speculation (its verify steps graphed),
and tensor parallelism over two GPUs where two are visible (on the CPU,
tests/engine/test_tensor_parallel.py covers it). A random Qwen3.5 (a gated delta net beside
gated attention) and a random Nemotron-H (Mamba-2 beside attention) run ragged, chunked and
async with their per-sequence states inside the decode graphs. HF runs on the same device in
float32; its reference is computed once per model.
"""

from __future__ import annotations

import random

import pytest
import torch
from model_support import hf_greedy, make_random_model
from triton_support import DEVICE, KV_CACHE_MEMORY

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer

VOCAB = 301  # odd: at TP=2 the last rank's embedding and LM-head rows are padded
MAX_NEW = 12
CHUNK = 16  # a step's token budget in the chunked runs: the longest prompt takes 3 steps
ENGINE = dict(dtype="float32", device=DEVICE.type, kv_cache_memory=KV_CACHE_MEMORY,
              max_num_seqs=8, show_progress=False)


def _prompts() -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Ragged prompts (1 to 45 tokens), two that share a 40-token prefix (two full blocks of
    16), and three that repeat a motif (n-gram lookups propose from them)."""
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    shared = ids(40)
    repeating = [ids(n) * times for n, times in ((3, 6), (5, 4), (8, 3))]
    return [ids(n) for n in (1, 6, 19, 45)], [shared + ids(5), shared + ids(9)], repeating


RAGGED, SHARING, REPEATING = _prompts()


def _config(kind: str):
    import transformers

    # 8 query heads split at TP=2; Llama's 2 KV heads split to one a rank, Qwen3's 4 to two.
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=8, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=2, tie_word_embeddings=False)
    if kind == "qwen3":
        return transformers.Qwen3Config(num_key_value_heads=4, head_dim=32, **common)
    return transformers.LlamaConfig(
        num_key_value_heads=2, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **common)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tmp_path_factory) -> tuple[str, dict[tuple[int, ...], list[int]]]:
    """A random-weight checkpoint and HF's greedy continuation of every prompt."""
    from transformers import AutoModelForCausalLM

    directory = make_random_model(str(tmp_path_factory.mktemp(request.param)),
                                  _config(request.param), word_level_tokenizer(VOCAB))
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(DEVICE).eval()
    expected = {tuple(p): hf_greedy(hf, p, MAX_NEW) for p in RAGGED + SHARING + REPEATING}
    del hf
    return directory, expected


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


def _expected(model, prompts: list[list[int]]) -> list[list[int]]:
    return [model[1][tuple(p)] for p in prompts]


def _check_graphs(llm: LLM, replays_before: int) -> None:
    """On CUDA the decode steps ran as captured graphs; elsewhere there are none."""
    graphs = llm.engine.runner.graphs
    if DEVICE.type != "cuda":
        assert graphs is None
        return
    assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4, 8]
    assert graphs.replays > replays_before


def _replays(llm: LLM) -> int:
    graphs = llm.engine.runner.graphs
    return 0 if graphs is None else graphs.replays


def test_ragged_batch_equals_hf_with_decode_graphs(model):
    with LLM(model[0], **ENGINE) as llm:
        assert _greedy(llm, RAGGED) == _expected(model, RAGGED)
        _check_graphs(llm, 0)
        alone = _replays(llm)
        assert _greedy(llm, RAGGED[3:]) == _expected(model, RAGGED[3:])
        _check_graphs(llm, alone)


def test_chunked_prefill_equals_hf(model):
    assert max(len(p) for p in RAGGED) > 2 * CHUNK
    with LLM(model[0], max_num_batched_tokens=CHUNK, **ENGINE) as llm:
        assert _greedy(llm, RAGGED) == _expected(model, RAGGED)
        _check_graphs(llm, 0)


def test_async_scheduling_equals_hf_with_decode_graphs(model):
    """The host reads a step's tokens back while the device runs the next (their input ids
    read on the device): prompts in chunks beside decodes, then a lone sequence."""
    with LLM(model[0], async_scheduling=True, max_num_batched_tokens=CHUNK, **ENGINE) as llm:
        assert _greedy(llm, RAGGED) == _expected(model, RAGGED)
        _check_graphs(llm, 0)
        alone = _replays(llm)
        assert _greedy(llm, RAGGED[2:3]) == _expected(model, RAGGED[2:3])
        _check_graphs(llm, alone)


def test_prefix_cached_request_equals_hf(model):
    with LLM(model[0], **ENGINE) as llm:
        assert _greedy(llm, SHARING[:1]) == _expected(model, SHARING[:1])
        hits = llm.engine.kv.prefix_hits
        assert _greedy(llm, SHARING[1:]) == _expected(model, SHARING[1:])
        assert llm.engine.kv.prefix_hits - hits >= 32  # the prefix's two full blocks
        _check_graphs(llm, 0)


def test_speculative_decoding_equals_hf_with_verify_graphs(model):
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'
    with LLM(model[0], speculative_config=spec, **ENGINE) as llm:
        prompts = REPEATING + RAGGED[1:3]
        assert _greedy(llm, prompts) == _expected(model, prompts)
        assert llm.engine.speculation_stats.num_drafts > 0
        verify = llm.engine.runner.verify_graphs
        if DEVICE.type == "cuda":
            assert verify is not None and verify.replays > 0
        else:
            assert verify is None


@pytest.mark.skipif(DEVICE.type != "cuda" or torch.cuda.device_count() < 2,
                    reason="tensor parallelism on CUDA needs two visible GPUs (on the CPU, "
                           "test_tensor_parallel.py covers it)")
def test_tensor_parallel_equals_hf(model):
    with LLM(model[0], tensor_parallel_size=2, max_num_batched_tokens=CHUNK, **ENGINE) as llm:
        assert _greedy(llm, RAGGED + SHARING[:1]) == _expected(model, RAGGED + SHARING[:1])
        hits = llm.engine.kv.prefix_hits
        assert _greedy(llm, SHARING[1:]) == _expected(model, SHARING[1:])
        assert llm.engine.kv.prefix_hits > hits
        _check_graphs(llm, 0)


def _hybrid_config(kind: str):
    import transformers

    if kind == "nemotron_h":  # Mamba-2, an MLP, attention, an MLP
        return transformers.NemotronHConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_attention_heads=8,
            num_key_value_heads=4, head_dim=32, mamba_num_heads=8, mamba_head_dim=16,
            n_groups=2, ssm_state_size=16, chunk_size=16, max_position_embeddings=256,
            layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        layer_types=["linear_attention", "full_attention"], linear_key_head_dim=32,
        linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module", params=["qwen3_5", "nemotron_h"])
def hybrid(request, tmp_path_factory) -> tuple[str, dict[tuple[int, ...], list[int]]]:
    """A random-weight Qwen3.5 (a gated delta net, then gated attention) or Nemotron-H
    (Mamba-2 and attention among MLP blocks) and HF's greedy continuation of every ragged
    prompt: its recurrent states in captured decode graphs."""
    from transformers import AutoModelForCausalLM

    directory = make_random_model(str(tmp_path_factory.mktemp(request.param)),
                                  _hybrid_config(request.param), word_level_tokenizer(VOCAB),
                                  draw_norms=True)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(DEVICE).eval()
    expected = {tuple(p): hf_greedy(hf, p, MAX_NEW) for p in RAGGED}
    del hf
    return directory, expected


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": CHUNK},
                                     {"max_num_batched_tokens": CHUNK, "async_scheduling": True}])
def test_linear_attention_equals_hf_with_decode_graphs(hybrid, options):
    """Whole prompts, prompts in chunks beside decodes, and async scheduling: each sequence's
    state slot gathered and scattered inside the captured decode steps; then the prompts
    again, resuming from the prefix cache's checkpoints of their states."""
    with LLM(hybrid[0], **options, **ENGINE) as llm:
        assert _greedy(llm, RAGGED) == _expected(hybrid, RAGGED)
        _check_graphs(llm, 0)
        hits, replays = llm.engine.kv.prefix_hits, _replays(llm)
        assert _greedy(llm, RAGGED) == _expected(hybrid, RAGGED)
        assert llm.engine.kv.prefix_hits > hits
        _check_graphs(llm, replays)
