"""Download progress a person or a log reader can follow: a bar on a terminal, otherwise a
logfmt line every few seconds (`download model=... bytes=... total=... mb_per_s=...`)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from tqdm import tqdm

log = logging.getLogger(__name__)
# Progress is what a download is for: shown at the default level (warning) too.
if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)
INTERVAL_S = 5.0


def on_terminal() -> bool:
    return sys.stderr.isatty()


class Progress:
    """Thread-safe byte counter for one model's download. `initial` bytes were already on
    disk (a resumed download); MB/s counts only the bytes moved by this process."""

    def __init__(self, model: str, total: int, initial: int = 0,
                 interval_s: float = INTERVAL_S):
        self.model, self.total, self.initial = model, total, initial
        self.done = initial
        self._lock = threading.Lock()
        self._start = self._last = time.monotonic()
        self._interval = interval_s
        self._bar = (tqdm(total=total, initial=initial, unit="B", unit_scale=True,
                          desc=f"Downloading {model}") if on_terminal() else None)

    def update(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
            elif time.monotonic() - self._last >= self._interval:
                self._last = time.monotonic()
                self._log("download")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._log("download done")

    def _log(self, msg: str) -> None:
        seconds = max(time.monotonic() - self._start, 1e-9)
        log.info(msg, extra={"model": self.model, "bytes": self.done, "total": self.total,
                             "resumed_bytes": self.initial,
                             "mb_per_s": round((self.done - self.initial) / seconds / 1e6, 1)})


class LogfmtTqdm(tqdm):
    """What the hub client draws its byte bars with off a terminal: no bar, a logfmt line
    every few seconds for each bar counted in bytes."""

    model = ""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["disable"] = False
        kwargs["file"] = _Discard()
        super().__init__(*args, **kwargs)
        self._logged = time.monotonic()

    def update(self, n: float | None = 1) -> bool | None:
        shown = super().update(n)
        if self.unit == "B" and time.monotonic() - self._logged >= INTERVAL_S:
            self._logged = time.monotonic()
            rate = self.format_dict.get("rate") or 0.0
            log.info("download", extra={"model": self.model, "bytes": int(self.n),
                                        "total": int(self.total or 0),
                                        "mb_per_s": round(rate / 1e6, 1)})
        return shown


class _Discard:
    def write(self, _: str) -> None:
        pass

    def flush(self) -> None:
        pass


def hub_progress_class(model: str) -> type[tqdm]:
    """The tqdm class to hand the hub client for `model`."""
    if on_terminal():
        return tqdm
    return type("ModelTqdm", (LogfmtTqdm,), {"model": model})
