"""Speculative decoding (n-gram prompt lookup) against plain decoding, side by side in one run.

Two workloads of real text through the model's chat template (speculative_workload.py):
grounded, whose answers repeat the prompt (repeat a passage, fix its typos, quote its sentences
on a subject, rename a function in code), and free generation (open questions and stories).
Greedy, up to --max-tokens per request, EOS honoured: greedy output is the same with and
without speculation, so both modes emit the same tokens and no ignore_eos is needed. For each
workload and batch size: output tokens/s of each mode, their ratio, the acceptance rate, the
mean accepted length (tokens a verified draft emits), and whether every output is identical.
Speculation is --speculative-config (default: ngram, K=4, lookup 4..1; disable_by_batch_size as
given, else the engine's default cut-off; 0 keeps it on at every batch size).

Method: two engines in one process, plain and speculative, stepped side by side. Lockstep
(ab.py) pairs the modes' steps one for one, which needs both to take the same steps;
speculation takes fewer (a step emits up to K+1 tokens per sequence), and running each mode
alone in turn (ab.per_mode) leaves a burst of load from elsewhere on this shared machine to
whichever mode it meets. So the pairing is by output position instead: a cell's requests go in
groups of the batch size, each group submitted to both engines at once, and the engine that has
emitted fewer tokens steps next. Both modes emit the same tokens (greedy), so at any moment
they are at the same point of the same outputs, and a change in the machine's speed falls on
the same stretch of work in both. Only engine steps are timed. --repeats R runs every cell R
times and reports each mode's median tokens/s.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any

from tokenmill.engine.bench.speculative_workload import Prompt, free_prompts, grounded_prompts

WORKLOADS = {"grounded": grounded_prompts, "free": free_prompts}
MODES = ("off", "on")
DEFAULT_SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                       "prompt_lookup_min": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", type=_workloads, default="grounded,free",
                        help="Comma-separated workloads: grounded, free (default both).")
    parser.add_argument("--batch-sizes", type=_batch_sizes, default="1,8",
                        help="Comma-separated batch sizes, requests running at once "
                             "(default 1,8).")
    parser.add_argument("--requests", type=_positive, default=4,
                        help="Requests per workload and batch size, rounded up to a multiple of "
                             "the batch size (default 4).")
    parser.add_argument("--max-tokens", type=_positive, default=160,
                        help="Most tokens each request generates (default 160).")
    parser.add_argument("--repeats", type=_positive, default=1,
                        help="Runs of every cell; each mode's median tokens/s is reported "
                             "(default 1).")
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="Report each cell as it ends.")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _batch_sizes(text: str) -> list[int]:
    return [_positive(part) for part in text.split(",")]


def _workloads(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workloads {unknown}; known: {list(WORKLOADS)}")
    return names


@dataclasses.dataclass
class GroupRun:
    """One group of requests on one engine: the time its steps took and what they emitted."""

    step_time_s: float
    steps: int
    speculative_steps: int  # steps in which some sequence had proposals verified
    outputs: list[Any]      # CompletionOutput per request, in the group's order
    speculation: Any        # SpeculationStats of this group alone


class _Group:
    """One group of requests on one engine, stepped from outside; only the steps are timed."""

    def __init__(self, engine: Any, prompts: list[list[int]], params: Any, tag: str):
        self.engine = engine
        self.before = copy.deepcopy(engine.speculation_stats)
        self.ids = [f"{tag}-{i}" for i in range(len(prompts))]
        for request_id, prompt in zip(self.ids, prompts, strict=True):
            engine.add_request(request_id, prompt, params)
        self.emitted = dict.fromkeys(self.ids, 0)
        self.done: dict[str, Any] = {}
        self.busy = 0.0
        self.steps = self.speculative = 0

    @property
    def going(self) -> bool:
        return self.engine.has_unfinished_requests()

    @property
    def tokens(self) -> int:
        return sum(self.emitted.values())

    def step(self) -> None:
        drafts = self.engine.speculation_stats.num_drafts
        start = time.perf_counter()
        outputs = self.engine.step()
        self.busy += time.perf_counter() - start
        self.steps += 1
        self.speculative += self.engine.speculation_stats.num_drafts > drafts
        for out in outputs:
            self.emitted[out.request_id] = len(out.outputs[0].token_ids)
            if out.finished:
                self.done[out.request_id] = out

    def result(self) -> GroupRun:
        """What the group did; every KV block must be free (rejected proposals' released)."""
        self.engine.kv.allocator.check_all_free()
        return GroupRun(self.busy, self.steps, self.speculative,
                        [self.done[i].outputs[0] for i in self.ids],
                        combine([self.engine.speculation_stats], minus=self.before))


def run_paired(engines: dict[str, Any], prompts: list[list[int]], params: Any,
               tag: str) -> dict[str, GroupRun]:
    """The same requests on every engine at once, submitted together and stepped until all
    finish: always the engine that has emitted the fewest tokens steps next (on a tie, the
    one that stepped least recently), so the engines go through the same outputs side by
    side."""
    groups = {mode: _Group(engine, prompts, params, tag) for mode, engine in engines.items()}
    last_step = dict.fromkeys(groups, -1)
    turn = 0
    while going := [mode for mode, group in groups.items() if group.going]:
        fewest = min(groups[mode].tokens for mode in going)
        mode = min((m for m in going if groups[m].tokens == fewest), key=last_step.__getitem__)
        groups[mode].step()
        last_step[mode] = turn
        turn += 1
    return {mode: group.result() for mode, group in groups.items()}


def combine(parts: list[Any], minus: Any = None) -> Any:
    """The sum of SpeculationStats, less `minus` (an earlier snapshot of the first)."""
    from tokenmill.engine.core.speculative.proposer import SpeculationStats

    total = SpeculationStats()
    for part, sign in [(p, 1) for p in parts] + ([(minus, -1)] if minus is not None else []):
        total.num_drafts += sign * part.num_drafts
        total.num_draft_tokens += sign * part.num_draft_tokens
        total.num_accepted_tokens += sign * part.num_accepted_tokens
        for i, n in enumerate(part.accepted_per_position):
            if i == len(total.accepted_per_position):
                total.accepted_per_position.append(0)
            total.accepted_per_position[i] += sign * n
    return total


def mode_fields(groups: list[GroupRun]) -> dict[str, Any]:
    """One mode's totals over groups; tokens/s is their tokens over their steps' time."""
    tokens = sum(len(o.token_ids) for g in groups for o in g.outputs)
    busy = sum(g.step_time_s for g in groups)
    stats = combine([g.speculation for g in groups])
    return {"output_tokens": tokens, "step_time_s": busy, "output_tokens_per_s": tokens / busy,
            "steps": sum(g.steps for g in groups),
            "speculative_steps": sum(g.speculative_steps for g in groups),
            "speculation": {
                "num_drafts": stats.num_drafts, "num_draft_tokens": stats.num_draft_tokens,
                "num_accepted_tokens": stats.num_accepted_tokens,
                "accepted_per_position": list(stats.accepted_per_position),
                "acceptance_rate": stats.acceptance_rate,
                "mean_accepted_length": stats.mean_accepted_length}}


def ratio(modes: dict[str, dict[str, Any]]) -> float:
    return modes["on"]["output_tokens_per_s"] / modes["off"]["output_tokens_per_s"]


class Bench:
    """The two engines and the encoded workloads."""

    def __init__(self, engines: dict[str, Any], workloads: dict[str, list[Prompt]],
                 encoded: dict[str, list[list[int]]], params: Any):
        self.engines = engines
        self.workloads = workloads
        self.encoded = encoded
        self.params = params

    def cell(self, workload: str, batch_size: int, num_requests: int,
             round_index: int) -> tuple[dict[str, list[GroupRun]], list[dict[str, Any]]]:
        """One workload at one batch size on both engines, group by group: each mode's
        groups, and a record per request."""
        prompts, encoded = self.workloads[workload], self.encoded[workload]
        runs: dict[str, list[GroupRun]] = {mode: [] for mode in MODES}
        records = []
        for first in range(0, num_requests, batch_size):
            indices = [(first + j) % len(prompts) for j in range(batch_size)]
            paired = run_paired(self.engines, [encoded[i] for i in indices], self.params,
                                f"{workload}-{batch_size}-{round_index}-{first}")
            for mode in MODES:
                runs[mode].append(paired[mode])
            for j, i in enumerate(indices):
                off, on = runs["off"][-1].outputs[j], runs["on"][-1].outputs[j]
                records.append({
                    "workload": workload, "batch_size": batch_size, "round": round_index,
                    "index": i, "task": prompts[i].task, "prompt_tokens": len(encoded[i]),
                    "output_tokens": len(off.token_ids), "finish_reason": off.finish_reason,
                    "identical": off.token_ids == on.token_ids, "output_text": off.text})
        return runs, records


def summarize_cell(workload: str, batch_size: int, num_requests: int,
                   rounds: list[dict[str, list[GroupRun]]],
                   records: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell over its rounds: each mode's median tokens/s over the rounds, and totals."""
    per_round = [{mode: mode_fields(groups[mode]) for mode in MODES} for groups in rounds]
    cell: dict[str, Any] = {"workload": workload, "batch_size": batch_size,
                            "requests": num_requests}
    for mode in MODES:
        cell[mode] = mode_fields([g for groups in rounds for g in groups[mode]])
        cell[mode]["output_tokens_per_s"] = statistics.median(
            r[mode]["output_tokens_per_s"] for r in per_round)
    cell["ratio"] = ratio(cell)
    cell["identical"] = all(r["identical"] for r in records
                            if (r["workload"], r["batch_size"]) == (workload, batch_size))
    cell["rounds"] = [{**r, "ratio": ratio(r)} for r in per_round]
    return cell


def run(args: argparse.Namespace) -> int:
    from tokenmill.engine.bench import report
    from tokenmill.engine.contract.config import engine_config_from_args
    from tokenmill.engine.core.sampling_params import SamplingParams

    config = engine_config_from_args(args)
    speculative = config.speculative_config or json.dumps(DEFAULT_SPECULATIVE)
    configs = {"off": config.replace(speculative_config=None),
               "on": config.replace(speculative_config=speculative)}
    if max(args.batch_sizes) > config.max_num_seqs:
        print(f"tokenmill bench speculative: error: batch size {max(args.batch_sizes)} is "
              f"above --max-num-seqs {config.max_num_seqs}", file=sys.stderr)
        return 2
    load_before = list(os.getloadavg())
    llms = _start(configs)
    engines = {mode: llm.engine for mode, llm in llms.items()}
    workloads = {name: WORKLOADS[name]() for name in args.workloads}
    encoded = {name: [_encode(llms["off"], p) for p in prompts]
               for name, prompts in workloads.items()}
    # A real prompt first, so that no first call of a kernel (the first verify step's) is timed.
    run_paired(engines, [encoded[args.workloads[0]][0]],
               SamplingParams(temperature=0.0, max_tokens=8), "warm-up")
    bench = Bench(engines, workloads, encoded,
                  SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    sizes = {(w, b): -(-args.requests // b) * b for w in args.workloads for b in args.batch_sizes}
    rounds: dict[tuple[str, int], list[dict[str, list[GroupRun]]]] = {c: [] for c in sizes}
    records: list[dict[str, Any]] = []
    for round_index in range(args.repeats):
        for (workload, batch_size), num_requests in sizes.items():
            groups, requests = bench.cell(workload, batch_size, num_requests, round_index)
            rounds[(workload, batch_size)].append(groups)
            records += requests
            if args.progress:
                print(_progress_line(workload, batch_size, round_index, groups),
                      file=sys.stderr, flush=True)
    cells = [summarize_cell(w, b, n, rounds[(w, b)], records) for (w, b), n in sizes.items()]
    print(format_table(cells))
    if args.json:
        report.write_json(args.json, {
            "benchmark": "speculative", "command": report.command_line(),
            "engine_config": dataclasses.asdict(configs["off"]),
            "speculative_config": dataclasses.asdict(configs["on"].speculative()),
            "workload": {"workloads": args.workloads, "batch_sizes": args.batch_sizes,
                         "requests": args.requests, "max_tokens": args.max_tokens,
                         "repeats": args.repeats, "greedy": True, "ignore_eos": False},
            "machine": {**report.machine_info(str(engines["off"].device)),
                        "load_average_before": load_before},
            "git": report.git_revision(), "cells": cells, "requests": records,
        })
        print(f"raw results: {args.json}")
    return 0


def _start(configs: dict[str, Any]) -> dict[str, Any]:
    from tokenmill.engine import LLM

    return {mode: LLM(**dataclasses.asdict(config), show_progress=False)
            for mode, config in configs.items()}


def _encode(llm: Any, prompt: Prompt) -> list[int]:
    """The prompt through the chat template, or as plain text for a tokenizer without one."""
    if getattr(llm.tokenizer, "chat_template", None):
        return llm.apply_chat_template([{"role": "user", "content": prompt.text}])
    return list(llm.tokenizer(prompt.text)["input_ids"])


def _progress_line(workload: str, batch_size: int, round_index: int,
                   groups: dict[str, list[GroupRun]]) -> str:
    off, on = (mode_fields(groups[mode]) for mode in MODES)
    return (f"{workload} batch {batch_size} round {round_index}: off "
            f"{off['output_tokens_per_s']:.1f} tok/s, on {on['output_tokens_per_s']:.1f} tok/s "
            f"({ratio({'off': off, 'on': on}):.2f}x), acceptance "
            f"{on['speculation']['acceptance_rate']:.0%}, load {os.getloadavg()[0]:.1f}")


def format_table(cells: list[dict[str, Any]]) -> str:
    rows = [f"{'workload':<9} {'batch':>5} {'off tok/s':>9} {'on tok/s':>9} {'ratio':>6} "
            f"{'accept':>7} {'mean len':>8} {'spec steps':>10} {'identical':>9}"]
    for c in cells:
        on = c["on"]
        spec = on["speculation"]
        rows.append(f"{c['workload']:<9} {c['batch_size']:>5} "
                    f"{c['off']['output_tokens_per_s']:>9.1f} {on['output_tokens_per_s']:>9.1f} "
                    f"{c['ratio']:>5.2f}x {spec['acceptance_rate']:>7.1%} "
                    f"{spec['mean_accepted_length']:>8.2f} "
                    f"{on['speculative_steps']:>4}/{on['steps']:<5} "
                    f"{'yes' if c['identical'] else 'NO':>9}")
    return "\n".join(rows)
