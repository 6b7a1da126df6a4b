"""One file downloaded in ranges, safe to kill at any moment.

Bytes go to NAME.partial at their offsets; NAME.partial.done lists the byte ranges written
(after their bytes), headed by the object's size and ETag. A restart reads the journal and fetches
only the missing ranges; a changed object (other size or ETag) starts over. NAME appears only
by a rename once every range is written and the size (and, for a single-part ETag, the MD5)
checks out, so a file under its own name is always whole."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass

from tokenmill.engine.models.fetch.errors import ModelFetchError

CHUNK_BYTES = 16 << 20
_MD5 = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class RemoteFile:
    name: str  # relative to the model's directory
    size: int
    etag: str | None

    @property
    def md5(self) -> str | None:
        """A single-part upload's ETag is the MD5 of its bytes. A multipart ETag
        (`md5-of-part-md5s-N`) depends on part sizes the store does not report: those files
        are checked by size only."""
        etag = (self.etag or "").strip('"').lower()
        return etag if _MD5.match(etag) else None


class PartialFile:
    def __init__(self, path: str, remote: RemoteFile, chunk_bytes: int = CHUNK_BYTES):
        self.path, self.remote, self.chunk_bytes = path, remote, chunk_bytes
        self.partial = path + ".partial"
        self.journal = path + ".partial.done"
        self._header = f"{remote.size} {remote.etag}\n"
        self._fd: int | None = None
        self._lock = threading.Lock()

    def complete(self) -> bool:
        return os.path.isfile(self.path) and os.path.getsize(self.path) == self.remote.size

    def written(self) -> list[tuple[int, int]]:
        """The byte ranges already in NAME.partial, merged and sorted (none to resume when the
        journal is missing or was written for another version of the object)."""
        try:
            with open(self.journal) as f:
                lines = f.readlines()
        except FileNotFoundError:
            return []
        if not lines or lines[0] != self._header or not os.path.isfile(self.partial):
            return []
        ranges = sorted(tuple(map(int, line.split())) for line in lines[1:]
                        if len(line.split()) == 2)
        merged: list[tuple[int, int]] = []
        for start, end in ranges:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def written_bytes(self) -> int:
        return sum(end - start for start, end in self.written())

    def missing(self, written: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The gaps between the written ranges, cut into chunks of at most chunk_bytes."""
        gaps, at = [], 0
        for start, end in [*written, (self.remote.size, self.remote.size)]:
            if start > at:
                gaps.append((at, start))
            at = max(at, end)
        return [(s, min(s + self.chunk_bytes, end)) for start, end in gaps
                for s in range(start, end, self.chunk_bytes)]

    def pending(self) -> list[tuple[int, int]]:
        """Open NAME.partial for writing (resumed, or new) and return the ranges to fetch."""
        done = self.written()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if not done:
            with open(self.journal, "w") as f:
                f.write(self._header)
            fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            fd = os.open(self.partial, os.O_WRONLY)
        os.ftruncate(fd, self.remote.size)
        self._fd = fd
        return self.missing(done)

    def write(self, start: int, data: memoryview) -> None:
        offset, written = start, data
        while data:
            n = os.pwrite(self._fd, data, offset)
            data, offset = data[n:], offset + n
        with self._lock, open(self.journal, "a") as f:
            f.write(f"{start} {start + len(written)}\n")

    def finish(self, model: str) -> None:
        """Check NAME.partial and rename it to NAME; a bad file is removed, never renamed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        missing = self.missing(self.written())
        size = os.path.getsize(self.partial)
        problem = (f"{len(missing)} ranges were never written" if missing else
                   f"{size} bytes on disk, {self.remote.size} expected"
                   if size != self.remote.size else None)
        if problem is None and self.remote.md5 is not None:
            digest = _md5(self.partial)
            if digest != self.remote.md5:
                problem = f"MD5 {digest} does not match the ETag {self.remote.md5}"
        if problem is not None:
            self.discard()
            raise ModelFetchError(model, f"{self.remote.name}: {problem}; the partial file "
                                         "was removed, run the download again")
        os.replace(self.partial, self.path)
        os.remove(self.journal)

    def discard(self) -> None:
        for path in (self.partial, self.journal):
            if os.path.exists(path):
                os.remove(path)


def _md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
