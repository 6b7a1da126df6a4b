"""A tensor-parallel worker process, ranks 1..N-1 (`-m tokenmill.engine.execution.worker`).

Rank 0 writes pickled objects to its stdin: first a WorkerSpec, then one StepInputs per step.
The worker runs each step's forward pass (its shard; the collectives join it to the others)
and exits 0 at end of input, which is also what it sees when rank 0 dies. Any error exits 1
with the traceback on stderr; rank 0 watches for that and brings the engine down.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("tokenmill.engine.execution.worker")


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    size: int
    store_host: str
    store_port: int
    parent_pid: int
    num_threads: int
    setup: object  # rank.RankSetup; typed loosely so this module imports without torch


def main() -> int:
    # Ctrl-C reaches the whole process group; rank 0 decides how the engine ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    sys.stdin = open(os.devnull)  # noqa: SIM115 - nothing else may read the command pipe
    try:
        spec: WorkerSpec = pickle.load(stdin)
    except EOFError:
        return 0
    _exit_with_parent(spec.parent_pid)
    from tokenmill.engine.log import configure_logging

    configure_logging()
    try:
        run(spec, stdin)
    except Exception:
        log.exception("tensor-parallel worker failed", extra={"rank": spec.rank})
        return 1
    return 0


def run(spec: WorkerSpec, stdin) -> None:
    import torch

    from tokenmill.engine.distributed.group import TPGroup
    from tokenmill.engine.execution.rank import build_runner, rank_device
    from tokenmill.engine.models.loader import load_config

    setup = spec.setup
    device = rank_device(setup.device_type, spec.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(spec.num_threads)
    tp = TPGroup.join(spec.rank, spec.size, spec.store_host, spec.store_port, device)
    runner = build_runner(setup, load_config(setup.source), device, tp, show_progress=False)
    log.info("tensor-parallel worker ready", extra={"rank": spec.rank, "device": str(device)})
    while True:
        try:
            inputs = pickle.load(stdin)
        except EOFError:  # rank 0 shut down (or died): leave quietly
            break
        runner.run(inputs)
    tp.leave()


def _exit_with_parent(parent_pid: int) -> None:
    """End at once if rank 0 disappears, even mid-step (a collective could wait minutes)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
