"""Draft-model speculation against plain decoding at batch 1: acceptance and output tokens/s.

No smaller model of SmolLM2's family can be downloaded here, so the drafts are layer-truncated
copies of the target (truncated_model.py): same tokenizer, much worse guesses than a trained
small model. Each prompt goes through every mode in turn (greedy, so all modes must emit the
same tokens); the modes' order alternates per repeat.

  python -m tokenmill.engine.bench.draft_ab --draft-layers 8 15 -k 3 --output out.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

from tokenmill.engine.bench.report import command_line, git_revision, machine_info, write_json
from tokenmill.engine.bench.truncated_model import save_truncated

PROMPTS = ["What is the capital of France?",
           "Write a short paragraph about why the sky is blue."]


def _run(llm: Any, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    from tokenmill.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([prompt_ids], params)[0].outputs[0].token_ids
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--draft-layers", type=int, nargs="+", default=[8])
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output")
    args = parser.parse_args()

    from tokenmill.engine import LLM

    k = args.num_speculative_tokens
    modes: dict[str, Any] = {"plain": LLM(args.model, show_progress=False)}
    tokenizer = modes["plain"].tokenizer
    with tempfile.TemporaryDirectory() as scratch:
        for layers in args.draft_layers:
            draft = save_truncated(args.model, f"{scratch}/draft-{layers}", layers)
            spec = json.dumps({"model": draft, "num_speculative_tokens": k})
            modes[f"draft-{layers}-layers"] = LLM(args.model, show_progress=False,
                                                  speculative_config=spec)
        prompts = [tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False) for p in PROMPTS]
        for llm in modes.values():
            _run(llm, prompts[0], 8)  # warm-up
        seconds = {mode: 0.0 for mode in modes}
        tokens = {mode: 0 for mode in modes}
        outputs: dict[str, list[list[int]]] = {mode: [] for mode in modes}
        names = list(modes)
        for repeat in range(args.repeats):
            for prompt in prompts:
                for mode in names if repeat % 2 == 0 else names[::-1]:
                    out, took = _run(modes[mode], prompt, args.max_tokens)
                    seconds[mode] += took
                    tokens[mode] += len(out)
                    outputs[mode].append(out)
    summary = {}
    for mode, llm in modes.items():
        stats = llm.engine.speculation_stats
        summary[mode] = {
            "output_tokens_per_s": round(tokens[mode] / seconds[mode], 2),
            "speedup": round(seconds["plain"] / seconds[mode], 3),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "mean_accepted_length": round(stats.mean_accepted_length, 3),
            "num_drafts": stats.num_drafts,
            "same_tokens_as_plain": outputs[mode] == outputs["plain"],
        }
    payload = {"command": command_line(), "git": git_revision(), "machine": machine_info("cpu"),
               "model": args.model, "num_speculative_tokens": k, "max_tokens": args.max_tokens,
               "repeats": args.repeats, "prompts": PROMPTS, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.output:
        write_json(args.output, payload)


if __name__ == "__main__":
    main()
