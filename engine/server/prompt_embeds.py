"""vLLM's `prompt_embeds` on /v1/completions: each a base64 string of a tensor saved by
torch.save, read back by torch's weights-only unpickler (tensors and plain containers, never
code), on the host; the engine checks the rows against the model (prepare_prompt_embeds)."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import torch

from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.server.errors import APIError

FIELD = "prompt_embeds"


def decode_prompt_embeds(values: str | list[str], engine: Any, keep: int | None) -> list[Any]:
    """Each base64 value's rows as `engine` prepares them (LLMEngine.prepare_prompt_embeds:
    its last `keep` rows where truncate_prompt_tokens asks); a 400 naming the field (and
    which of a list) for a value that is not a tensor torch.save wrote, or that the engine
    refuses."""
    many = isinstance(values, list)
    prepared = []
    for i, value in enumerate(values if many else [values]):
        name = f"{FIELD}[{i}]" if many else FIELD
        try:
            prepared.append(engine.prepare_prompt_embeds(_tensor(value, name), keep))
        except RequestError as exc:
            raise APIError(400, f"{name}: {exc}", param=FIELD) from exc
    return prepared


def _tensor(value: str, name: str) -> torch.Tensor:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise APIError(400, f"{name}: not base64 ({exc})", param=FIELD) from exc
    try:
        # A sparse tensor's indices are checked as it is rebuilt, not trusted.
        with torch.sparse.check_sparse_tensor_invariants():
            tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever the unpickler raises for bytes it cannot read
        raise APIError(400, f"{name}: not a tensor saved by torch.save "
                            f"({type(exc).__name__})", param=FIELD) from exc
    if not isinstance(tensor, torch.Tensor):
        raise APIError(400, f"{name}: holds a {type(tensor).__name__}, not a tensor",
                       param=FIELD)
    return tensor
