"""Accuracy of quantized modes against the unquantized engine, on one fixed text.

Each engine scores the same text, teacher-forced (engine/core/scoring.py: the KV cache is written
and read back as in serving). Against the unquantized engine's distributions: top-1 agreement
(the same most likely next token), the mean KL divergence KL(unquantized || mode) per position,
and the text's perplexity under each, with the relative change.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.engine.bench.quant_modes import MODES, REFERENCE, parse_modes
from tokenmill.engine.contract.config import EngineConfig

if TYPE_CHECKING:  # torch is imported where it runs: the CLI builds this parser for every command
    import torch

DEFAULT_TEXT = Path(__file__).with_name("accuracy_text.md")
DEFAULT_TOKENS = 2048


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"Comma-separated modes to measure (default: all of {list(MODES)}).")
    parser.add_argument("--text", default=str(DEFAULT_TEXT),
                        help="Text file to score (default: a fixed text shipped with tokenmill).")
    parser.add_argument("--max-text-tokens", type=int, default=DEFAULT_TOKENS,
                        help=f"Score the text's first N tokens (default {DEFAULT_TOKENS}).")
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")


def text_tokens(tokenizer: Any, path: str | Path, limit: int) -> list[int]:
    """The text's first `limit` tokens, as the model's tokenizer encodes a document."""
    ids = tokenizer(Path(path).read_text())["input_ids"]
    if len(ids) < limit:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than the {limit} asked for")
    return ids[:limit]


def score(config: EngineConfig, token_ids: list[int]) -> torch.Tensor:
    """[len - 1, vocab] log-probabilities of one engine built from `config`."""
    import torch

    from tokenmill.engine.core.engine import LLMEngine
    from tokenmill.engine.core.scoring import next_token_logprobs

    engine = LLMEngine(config, show_progress=False)
    return torch.cat(list(next_token_logprobs(engine, token_ids)))


def compare(reference: torch.Tensor, candidate: torch.Tensor,
            token_ids: list[int]) -> dict[str, float]:
    """Agreement, mean KL(reference || candidate) in nats, perplexities and their change."""
    import torch

    targets = torch.tensor(token_ids[1:]).unsqueeze(1)
    top1 = (reference.argmax(-1) == candidate.argmax(-1)).float().mean().item()
    kl = (reference.exp() * (reference - candidate)).sum(-1).clamp_min(0).mean().item()
    ppl_ref = math.exp(-reference.gather(1, targets).mean().item())
    ppl = math.exp(-candidate.gather(1, targets).mean().item())
    return {"top1_agreement": top1, "mean_kl": kl, "perplexity_reference": ppl_ref,
            "perplexity": ppl, "perplexity_delta": ppl / ppl_ref - 1}


def measure(config: EngineConfig, token_ids: list[int],
            modes: list[str]) -> dict[str, dict[str, float]]:
    """Every mode against the unquantized engine on the same tokens. A mode changes only
    what it names from the reference: on the default GGUF model an unset quantization would
    keep the file's 4-bit blocks, so `kv-fp8` would measure those weights too."""
    reference = score(config.replace(**REFERENCE), token_ids)
    return {mode: compare(reference, score(config.replace(**{**REFERENCE, **MODES[mode]}),
                                           token_ids), token_ids)
            for mode in modes}


def run(args: argparse.Namespace) -> int:
    from tokenmill.engine.bench import report
    from tokenmill.engine.contract.config import engine_config_from_args
    from tokenmill.engine.models.loader import load_tokenizer
    from tokenmill.engine.models.source import resolve_model

    config = engine_config_from_args(args)
    tokenizer = load_tokenizer(resolve_model(config.model))
    token_ids = text_tokens(tokenizer, args.text, args.max_text_tokens)
    modes = parse_modes(args.modes)
    print(f"scoring {len(token_ids)} tokens of {args.text}: unquantized, then {modes}",
          file=sys.stderr, flush=True)
    results = measure(config, token_ids, modes)
    print(format_table(results))
    if args.json:
        report.write_json(args.json, {
            "benchmark": "accuracy", "command": report.command_line(),
            "engine_config": dataclasses.asdict(config), "text": args.text,
            "text_tokens": len(token_ids), "machine": report.machine_info(config.device),
            "git": report.git_revision(), "results": results,
        })
        print(f"raw results: {args.json}")
    return 0


def format_table(results: dict[str, dict[str, float]]) -> str:
    rows = [f"{'mode':<14} {'top-1 agree':>11} {'mean KL':>9} {'ppl':>8} {'ppl ref':>8} "
            f"{'ppl delta':>9}"]
    for mode, r in results.items():
        rows.append(f"{mode:<14} {r['top1_agreement']:>10.2%} {r['mean_kl']:>9.5f} "
                    f"{r['perplexity']:>8.3f} {r['perplexity_reference']:>8.3f} "
                    f"{r['perplexity_delta']:>+9.2%}")
    return "\n".join(rows)
