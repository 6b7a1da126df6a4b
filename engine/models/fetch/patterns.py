"""--ignore-patterns: which files of a download are left out. The hub client's own matching
(shell-style patterns, `*` crossing directories, a trailing `/` meaning the whole directory)
serves s3:// too, so one pattern means the same on either store."""

from __future__ import annotations

from collections.abc import Iterable

# A LoRA adapter's repository holds this; an adapter is downloaded whole whatever the
# patterns, which are meant for the model (`tokenmill download` fetches both in one call).
ADAPTER_CONFIG = "adapter_config.json"


def unwanted(names: Iterable[str], ignore_patterns: tuple[str, ...]) -> list[str]:
    """Of a repository's file paths, those the patterns leave out (none of an adapter's)."""
    from huggingface_hub.utils import filter_repo_objects

    names = list(names)
    if not ignore_patterns or ADAPTER_CONFIG in names:
        return []
    return list(filter_repo_objects(names, allow_patterns=list(ignore_patterns)))
