"""vLLM's `prompt_embeds` on /v1/completions: each a base64 string of a tensor saved by
torch.save, read back by torch's weights-only unpickler (tensors and plain containers, never
code), on the host."""

from __future__ import annotations

import base64
import binascii
import io

import torch

from tokenmill.engine.server.errors import APIError

FIELD = "prompt_embeds"


def decode_prompt_embeds(values: str | list[str], enabled: bool,
                         keep: int | None) -> list[torch.Tensor]:
    """Each base64 value's tensor of rows [tokens, hidden] ([1, tokens, hidden] taken as its
    one batch entry), its last `keep` rows where truncate_prompt_tokens asks; a 400 naming
    the field (and which of a list) where the server takes none, or a value is not a tensor
    torch.save wrote. The engine checks the rows against the model."""
    if not enabled:
        raise APIError(400, "prompt_embeds: this server takes prompts given as embeddings "
                            "only when started with --enable-prompt-embeds", param=FIELD)
    many = isinstance(values, list)
    rows = [_rows(value, f"{FIELD}[{i}]" if many else FIELD)
            for i, value in enumerate(values if many else [values])]
    return rows if keep is None else [r[-keep:] for r in rows]


def _rows(value: str, name: str) -> torch.Tensor:
    tensor = _tensor(value, name)
    if tensor.layout != torch.strided:
        raise APIError(400, f"{name}: must be a dense tensor, got layout {tensor.layout}",
                       param=FIELD)
    if tensor.dim() == 3 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if tensor.dim() != 2:
        raise APIError(400, f"{name}: must have shape [tokens, hidden size], got "
                            f"{list(tensor.shape)}", param=FIELD)
    return tensor


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
