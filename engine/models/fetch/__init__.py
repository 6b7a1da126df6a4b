"""Models from where users keep them: hf://ORG/NAME[@REVISION] and s3://BUCKET/PREFIX,
downloaded once into a cache and loaded from there.

Imports no torch: `tokenmill download`, all an init container runs, needs only this package.
"""

from __future__ import annotations

from tokenmill.engine.models.fetch.cache import default_download_dir
from tokenmill.engine.models.fetch.errors import ModelFetchError
from tokenmill.engine.models.fetch.uri import HubModel, S3Model, parse_model_uri

__all__ = ["ModelFetchError", "default_download_dir", "fetch_model"]


def fetch_model(model: str, download_dir: str | None = None,
                ignore_patterns: tuple[str, ...] = ()) -> str | None:
    """The local directory of a model named by a URI, downloaded if the cache lacks it (but
    the files `ignore_patterns` match, of anything but a LoRA adapter); None for a local path
    or a built-in name (nothing to fetch)."""
    remote = parse_model_uri(model)
    if isinstance(remote, HubModel):
        from tokenmill.engine.models.fetch.hub import fetch_hub

        return fetch_hub(remote, download_dir, ignore_patterns)
    if isinstance(remote, S3Model):
        from tokenmill.engine.models.fetch.s3 import fetch_s3

        return fetch_s3(remote, download_dir or default_download_dir(),
                        ignore_patterns=ignore_patterns)
    return None
