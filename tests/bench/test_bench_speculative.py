"""`tokenmill bench speculative`: plain decoding against n-gram speculation on grounded and free
prompts of real text, side by side in one process."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine.bench.speculative_workload import TASKS, free_prompts, grounded_prompts
from tokenmill.engine.cli import build_parser

SPECULATION_KEYS = {"num_drafts", "num_draft_tokens", "num_accepted_tokens",
                    "accepted_per_position", "acceptance_rate", "mean_accepted_length"}


def test_grounded_prompts_ask_for_answers_that_repeat_them():
    grounded = grounded_prompts()
    assert len({p.text for p in grounded}) == len(grounded) == 16
    assert [p.task for p in grounded[:4]] == list(TASKS)  # a batch of 4 holds every task
    for prompt in grounded:
        assert prompt.workload == "grounded"
        assert len(prompt.source) > 200 and prompt.source in prompt.text
    for task in TASKS:  # every task on four different sources
        assert len({p.source for p in grounded if p.task == task}) == 4
    typos = [p for p in grounded if p.task == "fix-typos"]
    repeats = {p.source for p in grounded if p.task == "repeat"}
    assert all(p.source not in repeats for p in typos)  # the passages, misspelt
    free = free_prompts()
    assert len({p.text for p in free}) == len(free) == 16
    assert all(p.workload == "free" and not p.source for p in free)


def test_benchmark_runs_both_modes_on_the_same_requests(tiny_llama_dir, tmp_path):
    out = tmp_path / "speculative.json"
    args = build_parser().parse_args([
        "bench", "speculative", "--model", tiny_llama_dir, "--batch-sizes", "1,2",
        "--requests", "2", "--max-tokens", "12", "--repeats", "2",
        "--kv-cache-memory", str(32 << 20), "--no-progress", "--json", str(out),
    ])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "speculative"
    assert report["speculative_config"]["method"] == "ngram"
    assert (report["speculative_config"]["num_speculative_tokens"],
            report["speculative_config"]["prompt_lookup_max"],
            report["speculative_config"]["prompt_lookup_min"]) == (4, 4, 1)
    assert report["engine_config"]["speculative_config"] is None  # the plain engine's
    assert {"commit", "dirty"} <= set(report["git"])
    assert "load_average_before" in report["machine"]
    cells = report["cells"]
    assert [(c["workload"], c["batch_size"]) for c in cells] == [
        ("grounded", 1), ("grounded", 2), ("free", 1), ("free", 2)]
    for cell in cells:
        assert cell["identical"] is True and cell["requests"] == 2
        off, on = cell["off"], cell["on"]
        assert off["output_tokens"] == on["output_tokens"] > 0
        assert on["output_tokens_per_s"] > 0 and off["output_tokens_per_s"] > 0
        assert cell["ratio"] == pytest.approx(on["output_tokens_per_s"]
                                              / off["output_tokens_per_s"])
        assert len(cell["rounds"]) == 2
        assert set(on["speculation"]) == SPECULATION_KEYS
        assert off["speculation"]["num_drafts"] == off["speculative_steps"] == 0
        assert on["steps"] <= off["steps"]
    records = report["requests"]
    assert len(records) == 2 * 2 * 2 * 2  # workloads x batch sizes x requests x rounds
    assert all(r["identical"] and r["output_tokens"] > 0 for r in records)
    assert {r["task"] for r in records if r["workload"] == "grounded"} == set(TASKS[:2])


def test_batch_sizes_must_fit_the_engine(tiny_llama_dir, capsys):
    args = build_parser().parse_args([
        "bench", "speculative", "--model", tiny_llama_dir, "--batch-sizes", "4",
        "--max-num-seqs", "2", "--no-progress",
    ])
    assert args.func(args) == 2
    assert "--max-num-seqs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "speculative", "--batch-sizes", "1,0"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "speculative", "--workloads", "grounded,poems"])


class _FakeEngine:
    """Emits `per_step` tokens per request at each step until each has `length`; logs steps."""

    def __init__(self, name: str, per_step: int, length: int, log: list[tuple[str, int]]):
        from types import SimpleNamespace

        from tokenmill.engine.core.speculative.proposer import SpeculationStats

        self.name, self.per_step, self.length, self.log = name, per_step, length, log
        self.speculation_stats = SpeculationStats()
        self.kv = SimpleNamespace(allocator=SimpleNamespace(check_all_free=lambda: None))
        self.requests: dict[str, list[int]] = {}

    def add_request(self, request_id, prompt, params):
        self.requests[request_id] = []

    def has_unfinished_requests(self):
        return any(len(t) < self.length for t in self.requests.values())

    def step(self):
        from types import SimpleNamespace

        outputs = []
        for request_id, tokens in self.requests.items():
            tokens += [7] * min(self.per_step, self.length - len(tokens))
            completion = SimpleNamespace(token_ids=list(tokens), text="", finish_reason=None)
            outputs.append(SimpleNamespace(request_id=request_id, outputs=[completion],
                                           finished=len(tokens) == self.length))
        self.log.append((self.name, sum(len(t) for t in self.requests.values())))
        return outputs


def test_the_engine_behind_in_output_steps_next():
    from tokenmill.engine.bench.speculative import run_paired

    log: list[tuple[str, int]] = []
    engines = {"off": _FakeEngine("off", 1, 6, log), "on": _FakeEngine("on", 3, 6, log)}
    runs = run_paired(engines, [[1], [2]], None, "t")
    assert log == [("off", 2), ("on", 6), ("off", 4), ("off", 6), ("on", 12), ("off", 8),
                   ("off", 10), ("off", 12)]
    assert (runs["off"].steps, runs["on"].steps) == (6, 2)
    assert [len(o.token_ids) for o in runs["on"].outputs] == [6, 6]
