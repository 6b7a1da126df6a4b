"""Processes the tests start and watch: the `tokenmill serve` and `tokenmill download` command
lines, a free loopback port, and which processes exist, read from /proc (to check that no worker
outlives its engine)."""

from __future__ import annotations

import functools
import itertools
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def serve_command(*args: str) -> list[str]:
    """`tokenmill serve ARGS` from this Python. `-P` keeps the working directory off sys.path:
    from the repository root, its operator/ would shadow Python's operator module."""
    return [sys.executable, "-P", "-m", "tokenmill.engine.cli", "serve", *args]


def download_command(*args: str) -> list[str]:
    """`tokenmill download ARGS` from this Python (as serve_command)."""
    return [sys.executable, "-P", "-m", "tokenmill.engine.cli", "download", *args]


def run_directory(tmp_path_factory) -> Path:
    """The directory every pytest-xdist worker of this run shares (each worker's own base
    directory lies in it), or the base directory itself without xdist: where what is made
    once per run goes, each maker holding a FileLock on it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port nothing listens on, that no other process will be handed meanwhile.

    A port the kernel picks (a bind to port 0) is back in its ephemeral pool once released:
    until the server meant for it binds it, any other process's bind to 0 (another test's
    server, an emulated API server) can be given it, and a health check then reaches the wrong
    server. Ports come from outside the ephemeral range instead, from a slice of their own per
    xdist worker, each handed out once per process."""
    while True:
        port = next(_ports())
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:  # in use by something else on this machine
                continue
            return port


@functools.cache
def _ports() -> Iterator[int]:
    """This process's ports, in turn (the kernel's pick where the ephemeral range leaves too
    few outside it)."""
    lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    pool = max(range(10000, lo), range(hi + 1, 65536), key=len)
    if len(pool) < 1000:
        return _kernel_picks()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = pool[worker * len(pool) // workers:(worker + 1) * len(pool) // workers]
    start = os.getpid() % len(share)  # two runs at once start apart
    return itertools.cycle([*share[start:], *share[:start]])


def _kernel_picks() -> Iterator[int]:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            yield sock.getsockname()[1]


def children(pid: int) -> list[int]:
    """Live or zombie processes whose parent is `pid`."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def alive(pid: int) -> bool:
    """Running (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone(pids: list[int], within_s: float) -> bool:
    """Whether every pid has ended within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
