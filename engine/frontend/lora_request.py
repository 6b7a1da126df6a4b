"""vLLM's LoRARequest for the offline API: `llm.generate(..., lora_request=LoRARequest("sql", 1,
"/adapters/sql"))` serves an adapter without naming it at start-up; LLM loads it on first use
(engine.add_lora) and selects it by name after that."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoRARequest:
    """vLLM's fields: the adapter's name, an integer id (vLLM's key; here the name is), and its
    PEFT directory (a path, hf:// or s3://)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""


def adapter_names(engine: Any, requests: LoRARequest | Sequence[LoRARequest | None],
                  count: int) -> list[str | None]:
    """Each prompt's adapter name (None: the base model), every named adapter loaded first.
    ValueError for a list of another length than the prompts, or a name already serving
    another path."""
    each = [requests] * count if isinstance(requests, LoRARequest) else list(requests)
    if len(each) != count:
        raise ValueError(f"got {len(each)} LoRA requests for {count} prompts")
    for request in {r for r in each if r is not None}:
        loaded = engine.lora_adapters().get(request.lora_name)
        if loaded is None:
            engine.add_lora(request.lora_name, request.lora_path)
        elif request.lora_path and loaded != request.lora_path:
            raise ValueError(f"LoRA adapter {request.lora_name!r} is loaded from {loaded}; "
                             f"this request names {request.lora_path}")
    return [None if r is None else r.lora_name for r in each]
