"""Sleep mode's weights: copied to host memory, their device memory freed, and put back later.

The copy is taken per storage, not per parameter: a storage holds every view of it (a fused
projection and the slices layers read, a tied embedding and LM head), so freeing it by
resizing it to nothing frees all of them, and restoring it restores all of them. The bytes
come back at new device addresses, so CUDA graphs captured over the old ones must be captured
again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn


class HostWeights:
    """Modules' device tensors held in host memory (pinned where the device is a GPU) while
    their device storages are empty; restore() refills those same storages."""

    def __init__(self, modules: Iterable[nn.Module], device: torch.device):
        self._saved: list[tuple[torch.UntypedStorage, torch.Tensor]] = []
        seen: set[int] = set()
        for storage in (s for module in modules for s in _storages(module, device)):
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            host = torch.empty(storage.nbytes(), dtype=torch.uint8,
                               pin_memory=device.type == "cuda")
            host.copy_(_bytes(storage))
            self._saved.append((storage, host))
        for storage, _ in self._saved:
            storage.resize_(0)

    @property
    def nbytes(self) -> int:
        """Bytes held in host memory (and freed on the device)."""
        return sum(host.numel() for _, host in self._saved)

    def restore(self) -> None:
        """Allocate each storage again and copy its bytes back; the host copies are dropped."""
        for storage, host in self._saved:
            storage.resize_(host.numel())
            _bytes(storage).copy_(host)
        self._saved.clear()


class DroppedWeights:
    """Sleep level 2's weights: the storages of the tensors a checkpoint fills, freed with no
    copy kept (the checkpoint holds them, or a trainer brings new ones); restore() allocates
    them again, contents unset, for the checkpoint to be read into. Buffers computed at load
    (rotary tables, ALiBi slopes) stay."""

    def __init__(self, tensors: Iterable[torch.Tensor]):
        self._sizes: dict[int, tuple[torch.UntypedStorage, int]] = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() > 0 and storage.resizable():
                self._sizes.setdefault(storage.data_ptr(), (storage, storage.nbytes()))
        for storage, _ in self._sizes.values():
            storage.resize_(0)

    @property
    def nbytes(self) -> int:
        """Bytes freed."""
        return sum(size for _, size in self._sizes.values())

    def restore(self) -> None:
        for storage, size in self._sizes.values():
            storage.resize_(size)
        self._sizes.clear()


def _storages(model: nn.Module, device: torch.device) -> Iterator[torch.UntypedStorage]:
    """The non-empty storages on `device` of the model's parameters, buffers and the tensors
    its modules keep as plain attributes (prepacked or quantized weights). A storage torch
    cannot resize (a file's pages mapped on the host) is left where it is."""
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
                   *(v for v in vars(module).values() if isinstance(v, torch.Tensor))]
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.device.type == device.type and storage.nbytes() > 0 \
                    and storage.resizable():
                yield storage


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage's bytes as a flat uint8 tensor (a view, not a copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
