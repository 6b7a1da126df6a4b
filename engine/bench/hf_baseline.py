"""The baseline: Hugging Face transformers `generate` over static, left-padded batches.

This is how one serves a model without an engine: cut the requests into fixed batches in
arrival order, pad every prompt on the left to the longest, and decode until the batch's
longest output is done. Only each request's own output length counts as useful tokens; the
padding and the extra tokens of shorter requests are the cost a static batch pays.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from tokenmill.engine.bench.workload import BenchRequest
from tokenmill.engine.models.gguf_weights import fast_gguf_parsing
from tokenmill.engine.models.source import resolve_model


@dataclass
class HFRun:
    batch_size: int
    elapsed_s: float
    output_tokens: int
    batch_times_s: list[float]

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s


def load_hf_model(model: str, dtype: torch.dtype = torch.float32) -> Any:
    """The same weights tokenmill serves: a built-in name or GGUF through its file, else a dir."""
    from transformers import AutoModelForCausalLM

    source = resolve_model(model)
    # Only a GGUF file needs gguf, which the GPU machine lacks.
    with fast_gguf_parsing() if source.gguf_file else contextlib.nullcontext():
        return AutoModelForCausalLM.from_pretrained(
            source.directory, gguf_file=source.gguf_file, dtype=dtype
        ).eval()


def pad_id_of(model: Any) -> int:
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.config.pad_token_id
    if isinstance(pad, list):
        pad = pad[0]
    return 0 if pad is None else int(pad)


def generate_batch(model: Any, batch: list[BenchRequest], pad_id: int) -> None:
    """One static batch, left padded, greedy, EOS off, `max(output_len)` new tokens for all."""
    longest = max(r.input_len for r in batch)
    rows = [[pad_id] * (longest - r.input_len) + r.prompt_token_ids for r in batch]
    mask = [[0] * (longest - r.input_len) + [1] * r.input_len for r in batch]
    input_ids = torch.tensor(rows, dtype=torch.long, device=model.device)
    new_tokens = max(r.output_len for r in batch)
    with torch.inference_mode():
        out = model.generate(
            input_ids, attention_mask=torch.tensor(mask, dtype=torch.long, device=model.device),
            max_new_tokens=new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=pad_id,
        )
    generated = out.shape[1] - longest
    if generated != new_tokens:
        raise AssertionError(f"HF generated {generated} tokens, asked for {new_tokens} "
                             "(EOS should be disabled)")


def warm_up(model: Any, vocab_token: int) -> None:
    generate_batch(model, [BenchRequest([vocab_token] * 8, 4), BenchRequest([vocab_token] * 3, 4)],
                   pad_id_of(model))


def run_hf(model: Any, workload: list[BenchRequest], batch_size: int,
           show_progress: bool = True) -> HFRun:
    """Every batch in request order, timed as a whole with perf_counter."""
    pad_id = pad_id_of(model)
    batches = [workload[i:i + batch_size] for i in range(0, len(workload), batch_size)]
    times = []
    bar = tqdm(total=len(workload), desc=f"HF batch {batch_size}", unit="req",
               disable=not show_progress)
    start = time.perf_counter()
    for batch in batches:
        t = time.perf_counter()
        generate_batch(model, batch, pad_id)
        times.append(time.perf_counter() - t)
        bar.update(len(batch))
    elapsed = time.perf_counter() - start
    bar.close()
    return HFRun(batch_size, elapsed, sum(r.output_len for r in workload), times)
