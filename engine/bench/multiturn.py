"""Multi-turn chat with a shared system prompt: prefix cache on against off, in one run; or,
with --kv-offloading-size, the prefix cache without against with its host tier.

Each conversation sends its next turn as soon as its previous answer is complete, resending
the whole history (system prompt, every user turn, every answer) as chat clients do. Reported
per mode: prefix-cache hit rate (prompt tokens served from the cache) in all and by tier
(device pool, host tier), TTFT mean/P50/P99 of every turn and of the later turns (those with
a history to reuse), output tokens/s; plus the TTFT ratios between the modes.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from typing import Any

from tqdm import tqdm

from tokenmill.engine.bench.report import (
    command_line,
    distribution,
    git_revision,
    machine_info,
    write_json,
)
from tokenmill.engine.contract.server_flags import seconds_argument
from tokenmill.engine.core.sampling_params import SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-len", type=int, default=1000,
                        help="Tokens of the system prompt every conversation shares.")
    parser.add_argument("--user-len", type=int, default=48, help="Tokens of each user turn.")
    parser.add_argument("--answer-len", type=int, default=32, help="Tokens of each answer.")
    parser.add_argument("--think-time", type=seconds_argument, default=0.0,
                        help="Mean seconds a user waits before each turn, the first included "
                             "(exponential, seeded, the same in both modes); 0 sends every turn "
                             "the moment the previous answer is complete (default).")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="Write the raw results here.")


def make_conversations(args: argparse.Namespace, vocab_size: int) -> tuple[list[int],
                                                                           list[list[list[int]]]]:
    """The shared system prompt and, per conversation, its user turns (random token ids)."""
    rng = random.Random(args.workload_seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, vocab_size) for _ in range(n)]

    system = tokens(args.system_len)
    return system, [[tokens(args.user_len) for _ in range(args.turns)]
                    for _ in range(args.conversations)]


def make_think_times(args: argparse.Namespace) -> list[list[float]]:
    """Seconds before each turn of each conversation: exponential with mean --think-time."""
    rng = random.Random(args.workload_seed + 1)
    mean = args.think_time
    return [[rng.expovariate(1 / mean) if mean > 0 else 0.0 for _ in range(args.turns)]
            for _ in range(args.conversations)]


def run_conversations(engine: Any, system: list[int], users: list[list[list[int]]],
                      answer_len: int, label: str,
                      think_times: list[list[float]] | None = None) -> dict[str, Any]:
    """Drive every conversation to its last turn; return per-turn records and totals.

    A turn is sent think_times[c][turn] seconds after the previous answer completed (after
    the start, for the first turn); TTFT counts from the moment it is sent.
    """
    params = SamplingParams(temperature=0.0, max_tokens=answer_len, ignore_eos=True)
    think = think_times or [[0.0] * len(u) for u in users]
    history = [list(system) for _ in users]
    turn = [0] * len(users)
    records: list[dict[str, Any]] = []
    kv = engine.kv
    queries0, hits0, host_hits0 = kv.prefix_queries, kv.prefix_hits, kv.host_prefix_hits
    due: dict[int, float] = {}  # conversation -> when its next turn is sent

    def send(c: int) -> None:
        history[c] += users[c][turn[c]]
        engine.add_request(f"{label}-{c}-{turn[c]}", list(history[c]), params)

    bar = tqdm(total=sum(len(u) for u in users), desc=label, unit="turn")
    start = time.perf_counter()
    for c in range(len(users)):
        due[c] = start + think[c][0]
    while due or engine.has_unfinished_requests():
        now = time.perf_counter()
        for c in [c for c, at in due.items() if at <= now]:
            del due[c]
            send(c)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(due.values()) - time.perf_counter()))
            continue
        for out in engine.step():
            if not out.finished:
                continue
            _, c_text, t_text = out.request_id.rsplit("-", 2)
            c = int(c_text)
            records.append({"conversation": c, "turn": int(t_text),
                            "prompt_tokens": len(out.prompt_token_ids),
                            "output_tokens": len(out.outputs[0].token_ids),
                            "ttft_s": out.timings.time_to_first_token,
                            "e2e_s": out.timings.e2e_latency})
            history[c] += out.outputs[0].token_ids
            turn[c] += 1
            bar.update(1)
            if turn[c] < len(users[c]):
                due[c] = time.perf_counter() + think[c][turn[c]]
    elapsed = time.perf_counter() - start
    bar.close()
    queries = kv.prefix_queries - queries0
    hits = kv.prefix_hits - hits0
    host_hits = kv.host_prefix_hits - host_hits0
    output_tokens = sum(r["output_tokens"] for r in records)
    later = [r["ttft_s"] for r in records if r["turn"] > 0]  # a history to reuse
    return {
        "elapsed_s": elapsed,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "device_hit_rate": (hits - host_hits) / queries if queries else 0.0,
        "host_hit_rate": host_hits / queries if queries else 0.0,
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "ttft_s": distribution([r["ttft_s"] for r in records]),
        "later_turn_ttft_s": distribution(later) if later else {},
        "output_tokens_per_s": output_tokens / elapsed,
        "records": records,
    }


def run(args: argparse.Namespace) -> int:
    summary, payload = benchmark(args)
    print(format_summary(summary, [m for m in summary if isinstance(summary[m], dict)]))
    if args.json:
        write_json(args.json, payload)
    return 0


def benchmark(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both modes over the same conversations; returns (summary, JSON payload)."""
    from tokenmill.engine.contract.config import engine_config_from_args
    from tokenmill.engine.frontend.llm import LLM

    config = engine_config_from_args(args)
    results: dict[str, Any] = {}
    system = users = None
    modes = compared_modes(config)
    for label, mode_config in modes.items():
        llm = LLM(**dataclasses.asdict(mode_config))
        if system is None:
            system, users = make_conversations(args, llm.engine.model_config.vocab_size)
        llm.generate([[1000] * 8], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
        results[label] = run_conversations(llm.engine, system, users, args.answer_len, label,
                                           make_think_times(args))
        llm.engine.kv.allocator.check_all_free()
        if llm.engine.kv.host is not None:
            llm.engine.kv.host.check_consistent()
        del llm
    off, on = (results[label] for label in modes)
    summary = {
        mode: {k: v for k, v in r.items() if k != "records"} for mode, r in results.items()
    }
    summary["mean_ttft_speedup"] = off["ttft_s"]["mean"] / on["ttft_s"]["mean"]
    summary["p99_ttft_speedup"] = off["ttft_s"]["p99"] / on["ttft_s"]["p99"]
    if on["later_turn_ttft_s"]:
        summary["later_turn_mean_ttft_speedup"] = (off["later_turn_ttft_s"]["mean"]
                                                   / on["later_turn_ttft_s"]["mean"])
    return summary, {
        "command": command_line(), "machine": machine_info(str(config.device)),
        "git": git_revision(), "workload": {k: getattr(args, k) for k in (
            "conversations", "turns", "system_len", "user_len", "answer_len",
            "think_time", "workload_seed")},
        "engine_config": dataclasses.asdict(config), "summary": summary,
        "requests": {mode: r["records"] for mode, r in results.items()},
    }


def compared_modes(config: Any) -> dict[str, Any]:
    """The two engine configurations a run compares: the prefix cache off and on, or, when
    a host tier is asked for, the prefix cache without and with it (the same device pool)."""
    if config.kv_offloading_size:
        return {"offload-off": config.replace(enable_prefix_caching=True, kv_offloading_size=0.0),
                "offload-on": config.replace(enable_prefix_caching=True)}
    return {"cache-off": config.replace(enable_prefix_caching=False),
            "cache-on": config.replace(enable_prefix_caching=True)}


def format_summary(summary: dict[str, Any], modes: list[str]) -> str:
    lines = [f"{'mode':<12} {'hit rate':>9} {'device':>7} {'host':>7} {'TTFT mean':>10} "
             f"{'TTFT p50':>9} {'TTFT p99':>9} {'later mean':>11} {'out tok/s':>10}"]
    for mode in modes:
        s = summary[mode]
        t = s["ttft_s"]
        later = s["later_turn_ttft_s"].get("mean") or 0.0
        lines.append(f"{mode:<12} {s['prefix_hit_rate']:>9.1%} {s['device_hit_rate']:>7.1%} "
                     f"{s['host_hit_rate']:>7.1%} {t['mean']:>9.3f}s {t['p50']:>8.3f}s "
                     f"{t['p99']:>8.3f}s {later:>10.3f}s {s['output_tokens_per_s']:>10.1f}")
    lines.append(f"TTFT speed-up of {modes[1]}: mean {summary['mean_ttft_speedup']:.1f}x, "
                 f"P99 {summary['p99_ttft_speedup']:.1f}x, later turns' mean "
                 f"{summary.get('later_turn_mean_ttft_speedup', float('nan')):.1f}x")
    return "\n".join(lines)
