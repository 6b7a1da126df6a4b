"""Model names that point at a store: hf://ORG/NAME[@REVISION] and s3://BUCKET/PREFIX."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.models.fetch.errors import ModelFetchError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# A hub repository id as vLLM takes it, bare: ORG/NAME (letters, digits, '.', '_', '-').
_BARE_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
FORMS = ("hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX, a local model directory or .gguf "
         "file, or a built-in name")


@dataclass(frozen=True)
class HubModel:
    uri: str
    repo_id: str
    revision: str | None


@dataclass(frozen=True)
class S3Model:
    uri: str
    bucket: str
    prefix: str  # without a trailing slash; "" is the whole bucket


def parse_model_uri(model: str) -> HubModel | S3Model | None:
    """The store a model name points at, or None for a local path or a built-in name. A bare
    ORG/NAME that is no local path is a hub repository, as in vLLM (`Qwen/Qwen3-0.6B` is
    `hf://Qwen/Qwen3-0.6B`).

    An unknown scheme fails here, before anything is downloaded or loaded."""
    match = _SCHEME.match(model)
    if match is None:
        return _bare_hub_id(model)
    scheme, rest = match.group(1).lower(), model[match.end():]
    if scheme == "hf":
        repo_id, _, revision = rest.partition("@")
        parts = repo_id.strip("/").split("/")
        if not 1 <= len(parts) <= 2 or not all(parts) or "@" in model and not revision:
            raise ModelFetchError(model, "expected hf://ORG/NAME or hf://ORG/NAME@REVISION")
        return HubModel(model, "/".join(parts), revision or None)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ModelFetchError(model, "expected s3://BUCKET/PREFIX")
        return S3Model(model, bucket, prefix.strip("/"))
    raise ModelFetchError(model, f"unknown scheme {scheme}://; use {FORMS}")


def _bare_hub_id(model: str) -> HubModel | None:
    if not _BARE_HUB_ID.fullmatch(model) or os.path.exists(model):
        return None
    return HubModel(f"hf://{model}", model, None)


def pinned(model: str, revision: str, option: str = "revision") -> str:
    """`model` at `revision` (vLLM's --revision, or `option`: --tokenizer-revision): a hub
    model as hf://ORG/NAME@REVISION; ConfigError for any other model, or for one that names
    another revision already."""
    remote = parse_model_uri(model)
    what = "tokenizer" if option == "tokenizer_revision" else "model"
    if not isinstance(remote, HubModel):
        raise ConfigError(option, f"only a hub model (hf://ORG/NAME or ORG/NAME) has "
                                  f"revisions; the {what} is {model!r}")
    if remote.revision not in (None, revision):
        raise ConfigError(option, f"{revision!r}, but the {what} {model!r} names revision "
                                  f"{remote.revision!r}; give one")
    return f"hf://{remote.repo_id}@{revision}"
