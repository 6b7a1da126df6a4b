"""Safetensors checkpoints read with positioned reads (pread) straight into the tensors that
keep the weights.

Memory-mapping the files (what safetensors' own reader does) makes every page of the files
resident in the loading process next to the weights it fills, and a copy per tensor on top:
twice the model in host memory at the peak. Here a tensor's bytes go from the page cache
into their destination once; a staging tensor is used only when they cannot land there as
stored (another dtype, a device tensor, padded vocabulary rows). Reads release the GIL, so
several tensors are read at once by a thread pool.

The format: an 8-byte little-endian header length, a JSON header mapping each name to its
dtype, shape and [start, end) byte offsets in the data that follows the header.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.models.source import ModelLoadError
from tokenmill.engine.models.weight_files import weight_files

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header
IOV_MAX = 1024            # buffers one preadv call takes (Linux)


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are: `offset` is absolute in the file at `path`."""

    path: str
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def row_bytes(self) -> int:
        rows = self.shape[0] if self.shape else 1
        return self.nbytes // rows if rows else 0


def read_header(path: str) -> list[StoredTensor]:
    """The tensors of one file in file order; ModelLoadError naming the file if the header
    is no safetensors header or points outside the file."""
    try:
        return _header(path)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError.reading(f"the weights in {path}", exc) from exc


def _header(path: str) -> list[StoredTensor]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if not 0 < length <= min(MAX_HEADER, size - 8):
            raise ValueError(f"header length {length} does not fit a {size}-byte file")
        header = json.loads(f.read(length))
    base = 8 + length
    tensors = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {name!r} has dtype {meta['dtype']}, which we don't read")
        shape = tuple(int(d) for d in meta["shape"])
        start, end = (int(x) for x in meta["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        if end - start != numel * dtype.itemsize or start < 0 or base + end > size:
            raise ValueError(f"tensor {name!r}: bytes {start}..{end} do not hold shape {shape} "
                             f"of {meta['dtype']} inside a {size}-byte file")
        tensors.append(StoredTensor(path, name, dtype, shape, base + start, end - start))
    return sorted(tensors, key=lambda t: t.offset)


def checkpoint_files(directory: str) -> list[str]:
    files = weight_files(directory)
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {directory}")
    return files


class Checkpoint:
    """The safetensors files of a model directory, open for reads from any thread."""

    def __init__(self, directory: str):
        self.files = checkpoint_files(directory)
        self.tensors = [t for path in self.files for t in read_header(path)]
        self._fds = {path: os.open(path, os.O_RDONLY) for path in self.files}
        self._lock = threading.Lock()
        self.bytes_read = 0

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def slice(self, tensor: StoredTensor, into: torch.Tensor | None = None) -> StoredSlice:
        """`tensor`, not read yet; `into` is where its bytes should land if they can."""
        return StoredSlice(self, tensor, into)

    def _count(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n

    def _read(self, tensor: StoredTensor, buffers: list[memoryview], offset: int) -> None:
        """Fill `buffers` from consecutive bytes of the file at `offset`, all of them."""
        fd = self._fds[tensor.path]
        for start in range(0, len(buffers), IOV_MAX):
            batch = buffers[start:start + IOV_MAX]
            want = sum(b.nbytes for b in batch)
            while want:
                got = os.preadv(fd, batch, offset)
                if got == 0:
                    raise ModelLoadError(f"cannot read the weights in {tensor.path}: the file "
                                         f"ends inside tensor {tensor.name!r}")
                offset, want = offset + got, want - got
                batch = _advance(batch, got)


def _advance(buffers: list[memoryview], n: int) -> list[memoryview]:
    """The part of `buffers` a short read of `n` bytes left unfilled."""
    while n:
        first = buffers[0]
        if first.nbytes > n:
            return [first[n:], *buffers[1:]]
        n -= first.nbytes
        buffers = buffers[1:]
    return buffers


def _bytes(tensor: torch.Tensor) -> memoryview:
    """The writable bytes of a contiguous host tensor."""
    return memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())


class StoredSlice:
    """Indexing it reads rows (`[a:b]`, `[:]`) or columns (`[:, a:b]`) of the stored tensor,
    as a safetensors slice does, and nothing else: the shape of object ShardPlan.shard takes.
    The result is `into` itself when the bytes could land there."""

    def __init__(self, checkpoint: Checkpoint, tensor: StoredTensor, into: torch.Tensor | None):
        self.checkpoint, self.tensor, self.into = checkpoint, tensor, into

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    def __getitem__(self, key: Any) -> torch.Tensor:
        rows, columns = (key if isinstance(key, tuple) else (key, slice(None)))
        if not self.tensor.shape:
            return self._rows(0, 1)
        r0, r1, rstep = rows.indices(self.tensor.shape[0])
        if rstep != 1 or (columns != slice(None) and len(self.tensor.shape) != 2):
            raise IndexError(f"{self.tensor.name}: only row ranges and 2-D column ranges read")
        if columns == slice(None):
            return self._rows(r0, max(r0, r1))
        c0, c1, cstep = columns.indices(self.tensor.shape[1])
        if (r0, r1) != (0, self.tensor.shape[0]) or cstep != 1:
            raise IndexError(f"{self.tensor.name}: a column range reads every row")
        return self._columns(c0, max(c0, c1))

    def _out(self, shape: tuple[int, ...]) -> torch.Tensor:
        into = self.into
        if (into is not None and into.device.type == "cpu" and into.dtype == self.tensor.dtype
                and tuple(into.shape) == shape and into.is_contiguous()):
            return into
        # Pinned staging memory makes the copy to a GPU asynchronous.
        pin = into is not None and into.device.type == "cuda"
        return torch.empty(shape, dtype=self.tensor.dtype, pin_memory=pin)

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        t = self.tensor
        out = self._out((stop - start, *t.shape[1:]) if t.shape else ())
        if out.numel():
            self.checkpoint._read(t, [_bytes(out)], t.offset + start * t.row_bytes)
            self.checkpoint._count(out.numel() * out.element_size())
        return out

    def _columns(self, start: int, stop: int) -> torch.Tensor:
        """Every row's [start, stop) columns straight into their place; the other columns of
        each row are read into one small scratch buffer (a single read call covers many
        rows, where a read per row would cost a call each)."""
        t = self.tensor
        rows, item = t.shape[0], t.dtype.itemsize
        out = self._out((rows, stop - start))
        if not out.numel():
            return out
        dest = _bytes(out)
        width = (stop - start) * item
        before, after = start * item, t.row_bytes - stop * item
        scratch = memoryview(bytearray(max(before, after, 1)))
        buffers = []
        for r in range(rows):
            if before:
                buffers.append(scratch[:before])
            buffers.append(dest[r * width:(r + 1) * width])
            if after:
                buffers.append(scratch[:after])
        self.checkpoint._read(t, buffers, t.offset)
        self.checkpoint._count(out.numel() * out.element_size())
        return out
