"""Prompt sources for the serving benchmark: the seeded random workload, or a ShareGPT file.

Random prompts are token-id lists (the completions API takes a list of ints as `prompt`), built
by the same generator as the offline benchmark so both measure the same workload. Without a
tokenizer the vocabulary is a guess: ids below LOW_IDS_AVOIDED are skipped, since that is where
most tokenizers keep their control tokens, and the default vocabulary size fits every common
model (SmolLM2, Llama, Qwen, Mistral).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from tokenmill.engine.bench.workload import make_workload

DEFAULT_VOCAB_SIZE = 32000
LOW_IDS_AVOIDED = 1000
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ServePrompt:
    """One request to send: text or token ids, and the max_tokens to ask for."""

    prompt: str | list[int]
    output_len: int

    @property
    def input_len(self) -> int | None:
        """Exact for token ids; unknown for text (the server's usage chunk says)."""
        return len(self.prompt) if isinstance(self.prompt, list) else None


def random_prompts(num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                   seed: int, vocab_size: int | None = None,
                   special_token_ids: set[int] | None = None) -> list[ServePrompt]:
    """The offline benchmark's seeded workload; without a tokenizer, low ids are avoided."""
    if special_token_ids is None:
        special_token_ids = set(range(LOW_IDS_AVOIDED))
    workload = make_workload(num_prompts, input_len, output_len, seed,
                             vocab_size or DEFAULT_VOCAB_SIZE, special_token_ids)
    return [ServePrompt(r.prompt_token_ids, r.output_len) for r in workload]


def sharegpt_prompts(path: str, num_prompts: int, output_len: tuple[int, int],
                     seed: int) -> list[ServePrompt]:
    """First human turn as the prompt; the gpt reply's length/4, clipped, as max_tokens.

    N entries are drawn without replacement when the file has enough, else with replacement.
    """
    with open(path) as f:
        data = json.load(f)
    pairs = [pair for entry in data if (pair := _first_exchange(entry)) is not None]
    if not pairs:
        raise ValueError(f"{path}: no entry has a human turn followed by a gpt turn")
    rng = random.Random(seed)
    chosen = (rng.sample(pairs, num_prompts) if num_prompts <= len(pairs)
              else rng.choices(pairs, k=num_prompts))
    low, high = output_len
    return [ServePrompt(prompt, min(max(len(reply) // CHARS_PER_TOKEN, low), high))
            for prompt, reply in chosen]


def _first_exchange(entry: Any) -> tuple[str, str] | None:
    """(first human text, the gpt reply after it), or None if the entry has no such pair."""
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    turns = [t if isinstance(t, dict) else {} for t in turns]
    for i, turn in enumerate(turns[:-1]):
        if turn.get("from") == "human":
            reply = turns[i + 1]
            if reply.get("from") == "gpt" and turn.get("value") and reply.get("value"):
                return turn["value"], reply["value"]
            return None
    return None
