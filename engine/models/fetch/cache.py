"""Where downloads land, one writer per model at a time, and room for them before they start."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator

from filelock import FileLock, Timeout

from tokenmill.engine.models.fetch.errors import ModelFetchError

log = logging.getLogger(__name__)


def default_download_dir() -> str:
    """$XDG_CACHE_HOME/tokenmill (~/.cache/tokenmill): a cache the user can find and clear.
    hf:// models use the hub's own cache instead ($HF_HUB_CACHE, $HF_HOME/hub), so models
    already downloaded by other tools are found there."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tokenmill")


@contextlib.contextmanager
def model_lock(directory: str, model: str) -> Iterator[None]:
    """Hold `DIRECTORY.lock` while writing a model's directory. A second process waits here,
    then finds the files complete and downloads nothing."""
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    lock = FileLock(os.path.abspath(directory) + ".lock")
    try:
        lock.acquire(blocking=False)
    except Timeout:
        log.warning("waiting for another download of this model", extra={"model": model})
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def check_free_space(directory: str, needed: int, model: str) -> None:
    """Refuse up front, naming the size needed, rather than fill the volume half way."""
    os.makedirs(directory, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise ModelFetchError(model, f"needs {_size(needed)} free in {directory}, which has "
                                     f"{_size(free)}; give the download dir more room")


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)"
