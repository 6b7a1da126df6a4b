"""Rank 0's side of tensor parallelism: start ranks 1..N-1, send them each step, watch them,
and end them.

Workers are processes forked by multiprocessing's fork server (which has imported torch and the
model code once: worker.PRELOAD), each fed through a pipe. A worker that exits while the engine
runs is a failure: it is logged with its rank, pid and exit status, the other workers are
stopped, and `failure` says why; the engine raises WorkerFailed from then on, and the server
exits non-zero. Rank 0's own death closes the pipes, which ends every worker.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.execution import worker
from tokenmill.engine.execution.rank import RankSetup

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
        self.procs: list[BaseProcess] = []
        self._pipes: list[Connection] = []  # rank 0's ends, in the order of procs
        atexit.register(self.shutdown)
        context = _fork_server()
        for rank in range(1, size):
            spec = worker.WorkerSpec(rank, size, "127.0.0.1", port, num_threads, setup)
            steps, pipe = context.Pipe(duplex=False)
            proc = context.Process(target=worker.serve, args=(spec, steps), daemon=True,
                                   name=f"tp-worker-{rank}")
            with _main_module_left_alone():
                proc.start()
            steps.close()  # the worker holds its own copy: end of input is rank 0's close
            self.procs.append(proc)
            self._pipes.append(pipe)
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
        for pipe in self._pipes:
            self._send(pipe, data)

    def call(self, method: str, *args: Any) -> None:
        """Have every worker call its runner's `method` (RunnerCall) with `args`, in order
        with steps."""
        self.send_step(worker.RunnerCall(method, args))

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
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.close()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join()

    def _send(self, pipe: Connection, data: bytes) -> None:
        try:
            pipe.send_bytes(data)
        except (OSError, ValueError):  # the worker's end is gone, or rank 0 closed its own
            self.raise_if_failed(wait_s=STOP_GRACE_S)
            raise

    def _watch(self, rank: int, proc: BaseProcess) -> None:
        proc.join()
        code = proc.exitcode
        if self._stopping or self.failure is not None:
            return
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        message = f"tensor-parallel worker rank {rank} (pid {proc.pid}) {how}"
        if self.failure is None:
            self.failure = message
            log.error(message + "; stopping the engine")
            for other in self.procs:
                if other.exitcode is None:
                    other.kill()
            self._failed.set()
            if self._on_failure is not None:
                self._on_failure(message)


def _fork_server() -> multiprocessing.context.BaseContext:
    """multiprocessing's fork server, started once per process with the worker's imports done.

    It runs as `python -c ...` in the working directory; PYTHONSAFEPATH keeps that directory off
    its path, where a package named like a standard module (the repository's `operator`) would
    shadow it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(worker.PRELOAD)
    with _environment("PYTHONSAFEPATH", "1"):
        multiprocessing.forkserver.ensure_running()
    return context


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def _main_module_left_alone() -> Iterator[None]:
    """A child of the fork server runs the parent's main script or module again (for functions
    defined there), which a worker never needs, and which would start the engine over in a
    script that builds an LLM at its top level: with the main module's name and file out of
    sight while the worker starts, multiprocessing leaves it alone."""
    main = sys.modules["__main__"]
    saved = {key: main.__dict__.pop(key) for key in ("__file__", "__spec__")
             if key in main.__dict__}
    main.__spec__ = None
    try:
        yield
    finally:
        del main.__spec__
        main.__dict__.update(saved)
