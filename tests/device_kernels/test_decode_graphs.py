"""Decode graphs: batch-size buckets, padding rows and fixed input buffers.

CUDA graphs themselves need a GPU; on CPU the same path runs with each graph replayed eagerly
over the same fixed buffers (`ReplayedEagerly`) and the Triton kernels in Triton's interpreter,
so what the graphs add (bucketing, padding rows, inputs at fixed addresses, the fixed decode
split) is checked against the eager engine token for token.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from triton_support import DEVICE, KV_CACHE_MEMORY, cuda_only

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.execution import decode_graphs
from tokenmill.engine.execution.decode_graphs import bucket_for, graph_batch_sizes, graphs_wanted
from tokenmill.engine.execution.step_buffers import StepBuffers


def test_batch_sizes_are_vllm_buckets_up_to_max_num_seqs():
    assert graph_batch_sizes(256) == [1, 2, 4, *range(8, 257, 8)]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(4096)[-1] == decode_graphs.MAX_GRAPH_BATCH


def test_chosen_graph_sizes_lower_the_top_or_are_the_buckets():
    """vLLM's --cuda-graph-sizes: one value is the largest bucket, several the buckets
    themselves, those a batch of --max-num-seqs can reach."""
    assert graph_batch_sizes(256, (16,)) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(256, (20,)) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(4, (16,)) == [1, 2, 4]
    assert graph_batch_sizes(8, (1, 2, 64)) == [1, 2]
    assert graph_batch_sizes(8, (64, 128)) == []


def test_the_chosen_sizes_are_what_start_up_captures(tiny_llama_dir, monkeypatch):
    """--cuda-graph-sizes 1 3 through the engine's start-up (graphs wanted on this device
    too): buckets 1 and 3; a batch of 4 runs eagerly, 2 and 3 replay the graph of 3, and the
    tokens are the eager engine's."""
    from tokenmill.engine.execution import rank

    monkeypatch.setattr(rank, "graphs_wanted",
                        lambda device, backend, *rest: backend == "triton")
    options = {"show_progress": False, "dtype": "float32", "max_num_seqs": 4,
               "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY,
               "max_model_len": MAX_MODEL_LEN}
    graphed = LLM(tiny_llama_dir, attention_backend="triton", cuda_graph_sizes=(3, 1),
                  **options)
    runner = graphed.engine.runner
    assert sorted(runner.graphs.graphs) == [1, 3]
    eager = LLM(tiny_llama_dir, attention_backend="torch", **options)
    prompts = _prompts(4, 11)
    params = [SamplingParams(temperature=0.0, max_tokens=2 + i, ignore_eos=True)
              for i in range(4)]
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in graphed.generate(prompts, params)] == expected
    assert runner.graphs.replays > 0


def test_every_view_starts_on_16_bytes_whatever_the_steps_shape():
    """Triton compiles a kernel per alignment class of its pointers: steps of odd and even
    sizes must not each compile their own."""
    buffers = StepBuffers(torch.device("cpu"), max_tokens=8, max_seqs=4, max_blocks=3)
    for tokens, seqs in [(1, 1), (2, 1), (3, 2), (5, 3), (8, 4), (7, 4)]:
        lens = [tokens - seqs + 1] + [1] * (seqs - 1)
        views = buffers.fill(list(range(10, 10 + tokens)), list(range(tokens)),
                             list(range(20, 20 + tokens)), lens, lens,
                             [[s] for s in range(seqs)], list(range(30, 30 + tokens)))
        assert views.positions.tolist() == list(range(tokens))
        assert views.slots.tolist() == list(range(20, 20 + tokens))
        assert views.lora_slots.tolist() == list(range(30, 30 + tokens))
        assert views.seq_lens.tolist() == lens
        assert views.query_start.tolist()[-1] == tokens
        for name in ("input_ids", "positions", "slots", "lora_slots", "seq_lens", "query_start",
                     "block_tables"):
            assert getattr(views, name).data_ptr() % 16 == 0, (tokens, seqs, name)
        assert views.block_tables.stride(0) % 16 == 0


def test_a_batch_takes_the_smallest_bucket_that_holds_it():
    sizes = graph_batch_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 64)] == [1, 2, 4, 8, 8, 16, 24,
                                                                         64]
    assert bucket_for(65, sizes) is None


def test_graphs_only_on_cuda_with_triton_and_not_when_eager_is_enforced():
    assert graphs_wanted("cuda", "triton", enforce_eager=False)
    assert not graphs_wanted("cuda", "triton", enforce_eager=True)
    assert not graphs_wanted("cuda", "torch", enforce_eager=False)
    assert not graphs_wanted("cpu", "triton", enforce_eager=False)


def test_step_buffers_keep_their_addresses_and_hold_ragged_tables():
    buffers = StepBuffers(torch.device("cpu"), max_tokens=8, max_seqs=4, max_blocks=4)
    first = buffers.fill([5, 6, 7], [0, 1, 9], [16, 17, 40], [2, 10], [2, 1], [[1], [2, 3]])
    assert first.input_ids.tolist() == [5, 6, 7] and first.positions.tolist() == [0, 1, 9]
    assert first.slots.tolist() == [16, 17, 40] and first.seq_lens.tolist() == [2, 10]
    assert first.query_start.tolist() == [0, 2, 3]
    assert first.block_tables[:, :2].tolist() == [[1, 0], [2, 3]]
    second = buffers.fill([8, 9, 4], [2, 10, 0], [18, 41, 7], [3, 11], [1, 2], [[1], [2, 3]])
    assert second.input_ids.data_ptr() == first.input_ids.data_ptr()
    assert second.block_tables.data_ptr() == first.block_tables.data_ptr()
    assert second.query_start.tolist() == [0, 1, 3]
    buffers.fill([1] * 12, [0] * 12, [0] * 12, [12], [12], [[0] * 6])  # grows while not frozen
    assert (buffers.max_tokens, buffers.max_blocks) == (12, 16)  # rows 16 wide: one stride
    buffers.frozen = True
    with pytest.raises(RuntimeError, match="exceeds the captured input buffers"):
        buffers.fill([1] * 13, [0] * 13, [0] * 13, [13], [13], [[0]])


def test_table_rows_written_once_read_as_if_written_every_step():
    """A row is written again only when its blocks change; every step's tables must still
    read as a fresh buffer's would: rows that grow, shrink, move to another sequence, or
    leave the step and come back."""
    rng = random.Random(3)
    buffers = StepBuffers(torch.device("cpu"), max_tokens=16, max_seqs=6, max_blocks=8)
    tables = [[rng.randrange(1, 99) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
    for _ in range(60):
        for table in tables:
            change = rng.random()
            if change < 0.2:
                table.append(rng.randrange(1, 99))
            elif change < 0.3:
                del table[1:]
            elif change < 0.35:
                table[-1] = rng.randrange(1, 99)  # copy on write: the same length
        rng.shuffle(tables)
        step = [list(t) for t in tables[:rng.randrange(1, 7)]]
        n = len(step)
        args = ([0] * n, [0] * n, [0] * n, [len(t) * 16 for t in step], [1] * n, step)
        width = max(len(t) for t in step)
        fresh = StepBuffers(torch.device("cpu"), max_tokens=16, max_seqs=6, max_blocks=8)
        want = fresh.fill(*args).block_tables[:, :width].tolist()
        assert buffers.fill(*args).block_tables[:, :width].tolist() == want


# Every context below stays under GRAPH_SPLIT_TOKENS, so at twice that model length a graph's
# decode kernel has one split holding the context and one left empty: the cases a longer model
# length (more empty splits, each interpreted on the CPU) only repeats.
MAX_MODEL_LEN = 2 * decode_graphs.GRAPH_SPLIT_TOKENS


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 40))] for _ in range(count)]


def test_greedy_output_is_unchanged_with_decode_graphs(tiny_llama_dir, monkeypatch):
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 64,
               "max_num_seqs": 8, "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY,
               "max_model_len": MAX_MODEL_LEN}
    eager = LLM(tiny_llama_dir, attention_backend="torch", **options)  # equals HF
    graphed = LLM(tiny_llama_dir, attention_backend="triton", **options)
    runner = graphed.engine.runner
    runner.capture_decode_graphs(8, 64, graphed.engine.max_model_len)
    assert sorted(runner.graphs.graphs) == [1, 2, 4, 8]
    ids = runner.buffers.views(8, 8).input_ids.data_ptr()
    # Batches of 1, 3 (padded to 4) and 6 (to 8); each sequence stops one step after the one
    # before it, so the batch shrinks through every bucket (6 and 5 padded to 8, 3 to 4).
    for count, seed in ((1, 1), (3, 2), (6, 3)):
        prompts = _prompts(count, seed)
        params = [SamplingParams(temperature=0.0, max_tokens=2 + i, ignore_eos=True)
                  for i in range(count)]
        expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
        before = runner.graphs.replays
        got = [o.outputs[0].token_ids for o in graphed.generate(prompts, params)]
        assert got == expected
        assert runner.graphs.replays > before
    assert runner.buffers.views(8, 8).input_ids.data_ptr() == ids
    graphed.engine.kv.allocator.check_all_free()


def test_graphed_decode_splits_shrink_as_the_batch_grows():
    """A graph's splits cover the model length; a large batch fills the GPU without splitting
    (each empty split costs a program and a partial output), a small one splits its context."""
    splits = decode_graphs.graph_decode_splits
    assert splits(256, 8, 8192) == 1
    assert splits(1, 8, 8192) == 8192 // decode_graphs.GRAPH_SPLIT_TOKENS
    assert splits(1, 8, 131072) == decode_graphs.GRAPH_TARGET_PROGRAMS // 8
    assert splits(16, 8, 131072) == 8
    assert splits(1, 8, 100) == 1


def test_graphs_of_one_split_per_sequence_keep_greedy_output(tiny_llama_dir, monkeypatch):
    """Each sequence's whole context in one program of the decode kernel, as large batches
    take it, splits of any length serving any context up to the model length."""
    monkeypatch.setattr(decode_graphs, "GRAPH_TARGET_PROGRAMS", 1)
    runner = _graphed_equals_eager(tiny_llama_dir, _prompts(3, 7), max_tokens=4)
    assert runner.graphs.replays > 0


def test_decode_batches_larger_than_the_largest_graph_run_eagerly(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(decode_graphs, "MAX_GRAPH_BATCH", 2)
    runner = _graphed_equals_eager(tiny_llama_dir, _prompts(4, 5), max_tokens=3)
    assert sorted(runner.graphs.graphs) == [1, 2]
    assert runner.graphs.replays == 0  # four decodes at every step: no bucket holds them


def _graphed_equals_eager(model_dir: str, prompts: list[list[int]], max_tokens: int):
    """Greedy output with graphs (buckets up to 4 sequences) equals the torch attention's;
    returns the graphed engine's runner."""
    options = {"show_progress": False, "dtype": "float32", "max_num_seqs": 4,
               "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY,
               "max_model_len": MAX_MODEL_LEN}
    eager = LLM(model_dir, attention_backend="torch", **options)
    graphed = LLM(model_dir, attention_backend="triton", **options)
    runner = graphed.engine.runner
    runner.capture_decode_graphs(4, 2048, graphed.engine.max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in graphed.generate(prompts, params)] == expected
    return runner


def _repeating_prompts(count: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a motif, so n-gram lookups propose (and greedy continuations of a
    random model repeat often enough to accept some), with one that does not repeat."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        motif = [rng.randrange(100, 3000) for _ in range(rng.randrange(3, 8))]
        prompts.append(motif * (2 + i % 3) if i % 4 != 3 else _prompts(1, seed + i)[0])
    return prompts


def test_speculative_verify_steps_replay_their_graphs(tiny_llama_dir, monkeypatch):
    """Verify steps (up to K+1 tokens per sequence, fewer where a lookup found fewer
    proposals) replay the verify graphs; padding rows that no sequence owns change nothing."""
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 64,
               "max_num_seqs": 8, "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY,
               "max_model_len": MAX_MODEL_LEN}
    eager = LLM(tiny_llama_dir, attention_backend="torch", **options)  # equals HF
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    graphed = LLM(tiny_llama_dir, attention_backend="triton", speculative_config=spec,
                  **options)
    runner = graphed.engine.runner
    runner.capture_decode_graphs(4, 64, graphed.engine.max_model_len, verify_query_len=4,
                                 verify_max_seqs=4)
    assert sorted(runner.verify_graphs.graphs) == [1, 2, 4]
    replayed: list[int] = []
    for size, graph in runner.verify_graphs.graphs.items():
        monkeypatch.setattr(graph, "replay", lambda r=graph.replay, size=size: (
            replayed.append(size), r()))
    for count, seed in ((1, 11), (3, 13)):  # 3: a bucket of 4, padded
        prompts = _repeating_prompts(count, seed)
        params = [SamplingParams(temperature=0.0, max_tokens=8 + 2 * i, ignore_eos=True)
                  for i in range(count)]
        expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
        got = [o.outputs[0].token_ids for o in graphed.generate(prompts, params)]
        assert got == expected
    assert runner.verify_graphs.replays == len(replayed)
    assert max(replayed) > 1  # batches padded with sequences that own no rows
    stats = graphed.engine.speculation_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    graphed.engine.kv.allocator.check_all_free()


def test_verify_graphs_cover_the_batches_that_speculate():
    from tokenmill.engine.contract.config import EngineConfig
    from tokenmill.engine.execution.rank import verify_graph_shape

    def shape(spec: str | None, max_num_seqs: int = 64) -> tuple[int, int]:
        return verify_graph_shape(EngineConfig(model="m", speculative_config=spec,
                                               max_num_seqs=max_num_seqs))

    ngram = '{"method": "ngram", "num_speculative_tokens": 4'
    assert shape(None) == (0, 0)
    assert shape(ngram + ', "disable_by_batch_size": 0}') == (5, 64)
    assert shape(ngram + ', "disable_by_batch_size": 9}') == (5, 8)
    assert shape(ngram + ', "disable_by_batch_size": 1}') == (0, 0)
    assert shape(ngram + ', "disable_by_batch_size": 100}', max_num_seqs=16) == (5, 16)


@cuda_only
def test_a_graphed_decode_step_waits_for_the_gpu_once(tiny_llama_dir):
    """The step's only synchronization is the sampled tokens' copy to the host."""
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8)
    assert llm.engine.runner.graphs is not None
    engine = llm.engine
    for i, prompt in enumerate(_prompts(3, 6)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=8,
                                                           ignore_eos=True))
    engine.step()  # the prompts
    engine.step()  # a first decode step, so lazy state is built
    replays = engine.runner.graphs.replays
    with pytest.warns(UserWarning) as caught:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert engine.runner.graphs.replays == replays + 1
    # Only the synchronizations themselves: torch also warns, once, that the debug mode is a
    # prototype ("... does not yet detect all synchronizing operations").
    syncs = [f"{w.filename}:{w.lineno}" for w in caught
             if "called a synchronizing" in str(w.message)]
    assert len(syncs) == 1, syncs


@cuda_only
def test_an_async_scheduled_graphed_step_never_synchronizes_in_an_op(tiny_llama_dir):
    """Under async scheduling the host waits only on an event for the previous step's
    tokens, which are long computed: no torch op of the step synchronizes."""
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8, async_scheduling=True)
    engine = llm.engine
    for i, prompt in enumerate(_prompts(3, 6)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=8,
                                                           ignore_eos=True))
    for _ in range(3):  # the prompts, then decode steps until lazy state is built
        engine.step()
    replays = engine.runner.graphs.replays
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outputs = engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.runner.graphs.replays == replays + 1
    assert len(outputs) == 3 and all(t >= 0 for o in outputs for t in o.outputs[0].token_ids)
    syncs = [f"{w.filename}:{w.lineno}" for w in caught
             if "called a synchronizing" in str(w.message)]
    assert syncs == []


@cuda_only
def test_an_async_step_with_a_prompt_chunk_and_drawn_rows_never_synchronizes_in_an_op(
        tiny_llama_dir):
    """A step that mixes decodes with a chunk that does not finish its prompt (its logit rows
    picked by index) and rows drawn at a temperature with top-k, top-p, penalties, a logit
    bias and a seed: the host still waits for nothing the device has queued."""
    llm = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8, max_num_batched_tokens=32,
              async_scheduling=True)
    engine = llm.engine
    drawn = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=40,
                            ignore_eos=True),
             SamplingParams(temperature=1.0, seed=3, presence_penalty=0.5,
                            frequency_penalty=0.2, repetition_penalty=1.1,
                            logit_bias={5: 2.0}, max_tokens=40, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)]
    for i, (prompt, params) in enumerate(zip(_prompts(3, 8), drawn, strict=True)):
        engine.add_request(f"r{i}", prompt, params)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_request("warm", _prompts(1, 9)[0] * 4 + [7] * 100, greedy)
    while engine.has_unfinished_requests() and "warm" in engine._requests:
        engine.step()  # chunked prompt steps of each kind, so lazy state is built
    engine.add_request("long", [11] * 100, greedy)
    engine.step()  # the long prompt's first chunk
    long = engine._requests["long"].seqs[0]
    replays = engine.runner.graphs.replays
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.runner.graphs.replays == replays  # an eager step, a chunk beside decodes
    assert 0 < long.num_computed_tokens < long.num_tokens
    syncs = [f"{w.filename}:{w.lineno}" for w in caught
             if "called a synchronizing" in str(w.message)]
    assert syncs == []


def test_enforce_eager_is_a_serve_flag():
    import argparse

    from tokenmill.engine.contract.config import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--enforce-eager"])).enforce_eager
    assert not engine_config_from_args(parser.parse_args([])).enforce_eager


@cuda_only
def test_graphs_are_captured_on_cuda_unless_eager_is_enforced(tiny_llama_dir):
    graphed = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8,
                  kv_cache_memory=KV_CACHE_MEMORY)
    assert sorted(graphed.engine.runner.graphs.graphs) == [1, 2, 4, 8]
    eager = LLM(tiny_llama_dir, show_progress=False, max_num_seqs=8, enforce_eager=True,
                kv_cache_memory=KV_CACHE_MEMORY)
    assert eager.engine.runner.graphs is None
    prompts = _prompts(3, 7)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert ([o.outputs[0].token_ids for o in graphed.generate(prompts, params)]
            == [o.outputs[0].token_ids for o in eager.generate(prompts, params)])


def test_decode_graphs_serve_a_mix_of_lora_adapters(tiny_llama_dir, tmp_path):
    """Each token row's adapter slot is a graph input: one graph serves any mix of adapters
    and the base, padding rows none, as the eager engine does."""
    from lora_support import ADAPTERS, make_adapter

    modules = tuple(f"{a.name}={make_adapter(tiny_llama_dir, str(tmp_path / a.name), a)}"
                    for a in ADAPTERS[:2])
    options = {"show_progress": False, "dtype": "float32", "max_num_batched_tokens": 64,
               "max_num_seqs": 8, "device": DEVICE.type, "kv_cache_memory": KV_CACHE_MEMORY,
               "max_model_len": MAX_MODEL_LEN, "enable_lora": True, "max_loras": 2,
               "max_lora_rank": 8, "lora_modules": modules}
    eager = LLM(tiny_llama_dir, attention_backend="torch", **options)
    graphed = LLM(tiny_llama_dir, attention_backend="triton", **options)
    runner = graphed.engine.runner
    runner.capture_decode_graphs(4, 64, graphed.engine.max_model_len)
    prompts = _prompts(3, 7)  # three sequences padded to a bucket of four
    loras = ["sql", None, "chat"]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params, lora=loras)]
    got = [o.outputs[0].token_ids for o in graphed.generate(prompts, params, lora=loras)]
    assert got == expected
    assert runner.graphs.replays > 0
    graphed.engine.kv.allocator.check_all_free()
