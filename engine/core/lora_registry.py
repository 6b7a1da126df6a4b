"""The LoRA adapters an engine serves, by the name a request's `model` selects.

Adding one resolves its path as `--model` is resolved (a local directory, or hf:// and s3://
downloaded into --download-dir), then reads and checks it through `check` (rank 0's host
cache) before the name is taken, so a bad adapter never reaches a step. Removing one refuses
new requests at once; sequences already holding it run to the end on their reference.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from tokenmill.engine.contract.lora import LoRAModuleError, check_name
from tokenmill.engine.core.lora_slots import LoRARef, LoRASlotTable
from tokenmill.engine.models.fetch import ModelFetchError, fetch_model
from tokenmill.engine.models.lora_adapter import LoRAAdapterError


class LoRARegistry:
    def __init__(self, max_loras: int, check: Callable[[str, str], object],
                 download_dir: str | None = None):
        self.slots = LoRASlotTable(max_loras)
        self._check = check  # (directory, name): reads and validates, raises LoRAAdapterError
        self._download_dir = download_dir
        self._refs: dict[str, LoRARef] = {}
        # Replaced whole on every change, never mutated: another thread may read it.
        self._paths: dict[str, str] = {}
        self._generations = itertools.count(1)

    def fetch(self, name: str, path: str) -> str:
        """The adapter's local directory, downloaded where `path` is hf:// or s3:// and
        checked; it changes nothing here, so another thread may run it (a download takes as
        long as it takes, and the engine steps meanwhile)."""
        try:
            check_name(name)
        except LoRAModuleError as exc:
            raise LoRAAdapterError(str(exc)) from None
        self._refuse_loaded(name)
        try:
            local = fetch_model(path, self._download_dir)
        except (ModelFetchError, OSError) as exc:
            raise LoRAAdapterError(f"LoRA adapter {name!r}: cannot fetch {path}: {exc}") from None
        directory = os.path.abspath(local or os.path.expanduser(path))
        self._check(directory, name)
        return directory

    def add(self, name: str, path: str, directory: str | None = None) -> LoRARef:
        """Serve the adapter; `directory` is what fetch() returned for it, if it ran."""
        if directory is None:
            directory = self.fetch(name, path)
        self._refuse_loaded(name)
        ref = LoRARef(name, directory, next(self._generations))
        self._refs[name] = ref
        self._paths = {**self._paths, name: path}
        return ref

    def _refuse_loaded(self, name: str) -> None:
        paths = self._paths
        if name in paths:
            raise LoRAAdapterError(f"LoRA adapter {name!r} is already loaded (from "
                                   f"{paths[name]}); remove it first")

    def remove(self, name: str) -> None:
        ref = self._refs.pop(name, None)
        if ref is None:
            raise LoRAAdapterError(f"LoRA adapter {name!r} is not loaded")
        self._paths = {n: p for n, p in self._paths.items() if n != name}
        self.slots.forget(ref)

    def get(self, name: str) -> LoRARef | None:
        return self._refs.get(name)

    def paths(self) -> dict[str, str]:
        """{name: path as given}: a snapshot, safe to read from any thread."""
        return dict(self._paths)
