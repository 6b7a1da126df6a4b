"""Teacher-forced scoring: the engine's next-token distribution at every position of a text.

The text is prefilled in chunks of the engine's token budget through its own runner and KV
cache, so every position is computed the way serving computes it: the chunk's keys and values
are stored in the cache (quantized or not) and read back from it. This is what accuracy is
measured on (perplexity, agreement, KL against another engine).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from tokenmill.engine.core.request import RequestTimings, Sequence
from tokenmill.engine.core.sampling_params import SamplingParams
from tokenmill.engine.core.step_builder import build_step_inputs

if TYPE_CHECKING:
    from tokenmill.engine.core.engine import LLMEngine


def next_token_logprobs(engine: LLMEngine, token_ids: list[int],
                        lora_name: str | None = None) -> Iterator[torch.Tensor]:
    """Chunks of float32 log-probabilities, [rows, vocab]: row i of the concatenation scores
    token i+1 given tokens 0..i (len(token_ids) - 1 rows in all), under the LoRA adapter
    `lora_name` if given.

    Offline use: the engine must have nothing in flight. The text must fit the KV pool.
    """
    if engine.has_unfinished_requests():
        raise RuntimeError("scoring needs an idle engine")
    seq = Sequence(-1, "score", 0, list(token_ids), SamplingParams(max_tokens=1), None, None,
                   RequestTimings(), lora=engine.lora_ref(lora_name))
    engine.kv.admit(seq, [])
    slots = engine.scheduler.lora
    if seq.lora is not None:
        seq.lora_slot = slots.acquire(seq.lora)
    try:
        budget = engine.config.max_num_batched_tokens
        total = len(token_ids)
        while seq.num_computed_tokens < total:
            n = min(budget, total - seq.num_computed_tokens)
            engine.kv.grow(seq, n)
            step = build_step_inputs([(seq, n)], engine.config.block_size, all_logits=True,
                                     transfers=engine.kv.take_transfers(),
                                     lora_loads=slots.take_loads() if slots else None)
            logits = engine.runner.execute(step)
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == total:
                logits = logits[:-1]  # the last token predicts past the text
            yield torch.log_softmax(logits.float(), dim=-1)
    finally:
        engine.kv.free(seq)
        if seq.lora_slot >= 0:
            slots.release(seq.lora_slot)
