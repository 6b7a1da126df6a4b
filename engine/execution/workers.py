"""Rank 0's side of tensor parallelism: start ranks 1..N-1, send them each step, watch them,
and end them.

Workers are `python -P -m tokenmill.engine.execution.worker` processes fed over their stdin
pipe (-P: a working directory never shadows a module). A worker that exits while the engine
runs is a failure: it is logged with its rank, pid and exit status, the other workers are
stopped, and `failure` says why; the engine raises WorkerFailed from then on, and the server
exits non-zero. Rank 0's own death closes the pipes, which ends every worker.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.execution.rank import RankSetup
from tokenmill.engine.execution.worker import WorkerSpec

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class WorkerFailed(RuntimeError):
    """A tensor-parallel worker died; the engine can't run another step."""


class Workers:
    def __init__(self, setup: RankSetup, size: int, num_threads: int,
                 on_failure: Callable[[str], None] | None = None):
        self.size = size
        self.failure: str | None = None
        self._on_failure = on_failure
        self._stopping = False  # shutdown() asked the workers to end: exits are not failures
        self._failed = threading.Event()
        self.store, port = TPGroup.host(size)
        self.procs: list[subprocess.Popen] = []
        atexit.register(self.shutdown)
        for rank in range(1, size):
            spec = WorkerSpec(rank, size, "127.0.0.1", port, os.getpid(), num_threads, setup)
            proc = subprocess.Popen([sys.executable, "-P", "-m",
                                     "tokenmill.engine.execution.worker"],
                                    stdin=subprocess.PIPE)
            self.procs.append(proc)
            self._send(proc, pickle.dumps(spec))
            threading.Thread(target=self._watch, args=(rank, proc), daemon=True,
                             name=f"tp-worker-{rank}-watch").start()
        log.info("tensor-parallel workers started",
                 extra={"size": size, "pids": ",".join(str(p.pid) for p in self.procs)})

    def wait_until_joined(self) -> None:
        """Block until every worker has reached the rendezvous, or raise WorkerFailed if one
        died first (joining the process group itself would wait minutes for it)."""
        keys = [f"joined/{rank}" for rank in range(1, self.size)]
        while not self.store.check(keys):
            self.raise_if_failed()
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send_step(self, inputs: object) -> None:
        """Hand a step to every worker before rank 0 runs its own part of it."""
        self.raise_if_failed()
        data = pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL)
        for proc in self.procs:
            self._send(proc, data)

    def raise_if_failed(self, wait_s: float = 0.0) -> None:
        """WorkerFailed if a worker died (waiting up to wait_s for the watcher to notice:
        a collective can fail a moment before the worker's exit is reaped)."""
        if wait_s:
            self._failed.wait(wait_s)
        if self.failure is not None:
            raise WorkerFailed(self.failure)

    def shutdown(self) -> None:
        """End every worker: close their pipes (they exit at end of input), then kill any
        that is still there after STOP_GRACE_S."""
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self.shutdown)
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _send(self, proc: subprocess.Popen, data: bytes) -> None:
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            self.raise_if_failed(wait_s=STOP_GRACE_S)
            raise

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if self._stopping or self.failure is not None:
            return
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        message = f"tensor-parallel worker rank {rank} (pid {proc.pid}) {how}"
        if self.failure is None:
            self.failure = message
            log.error(message + "; stopping the engine")
            for other in self.procs:
                if other.poll() is None:
                    other.kill()
            self._failed.set()
            if self._on_failure is not None:
                self._on_failure(message)
