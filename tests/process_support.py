"""Processes the tests start and watch: the `tokenmill serve` and `tokenmill download` command
lines, a free loopback
port, and which processes exist, read from /proc (to check that no worker outlives its
engine)."""

from __future__ import annotations

import os
import socket
import sys
import time


def serve_command(*args: str) -> list[str]:
    """`tokenmill serve ARGS` from this Python. `-P` keeps the working directory off sys.path:
    from the repository root, its operator/ would shadow Python's operator module."""
    return [sys.executable, "-P", "-m", "tokenmill.engine.cli", "serve", *args]


def download_command(*args: str) -> list[str]:
    """`tokenmill download ARGS` from this Python (as serve_command)."""
    return [sys.executable, "-P", "-m", "tokenmill.engine.cli", "download", *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at the moment: bound, read and released."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
