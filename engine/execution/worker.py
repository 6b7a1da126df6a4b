"""A tensor-parallel worker process, ranks 1..N-1, forked by multiprocessing's fork server.

Rank 0 sends pickled StepInputs through the worker's end of a pipe, one message per step. The
worker runs each step's forward pass (its shard; the collectives join it to the others) and
exits 0 at end of input, which is also what it sees when rank 0 shuts down. Any error exits 1
with the traceback on stderr; rank 0 watches for that and brings the engine down.

The fork server imports PRELOAD once, so a worker starts as a fork of a process that already
holds torch and the model code, not as a fresh interpreter importing them.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection

log = logging.getLogger("tokenmill.engine.execution.worker")

# What every worker imports before its first step: torch and its compiler front end (torch's
# reference ops reach it while a model is built), what transformers imports to read a model's
# config (its activations pull in torch's distributed tensors), safetensors, the rank's runner
# and the model loader.
PRELOAD = ["torch", "torch._dynamo", "transformers", "transformers.activations",
           "safetensors.torch", "tokenmill.engine.execution.rank",
           "tokenmill.engine.models.loader", "tokenmill.engine.distributed.group"]


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    size: int
    store_host: str
    store_port: int
    num_threads: int
    setup: object  # rank.RankSetup; typed loosely so this module imports without torch


@dataclass(frozen=True)
class RunnerCall:
    """A call of one of the runner's own methods (sleep mode's), sent to every rank between
    steps in place of a step."""

    method: str
    args: tuple = ()


def serve(spec: WorkerSpec, steps: Connection) -> None:
    """The worker process's body: it exits 0 at end of input, 1 on any error."""
    # Ctrl-C reaches the whole process group; rank 0 decides how the engine ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    from tokenmill.engine.log import configure_logging

    configure_logging()
    try:
        run(spec, steps)
    except Exception:
        log.exception("tensor-parallel worker failed", extra={"rank": spec.rank})
        sys.exit(1)


def run(spec: WorkerSpec, steps: Connection) -> None:
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
            inputs = pickle.loads(steps.recv_bytes())
        except EOFError:  # rank 0 shut down (or died): leave quietly
            break
        if isinstance(inputs, RunnerCall):
            getattr(runner, inputs.method)(*inputs.args)
        else:
            runner.run(inputs)
    tp.leave()


def _exit_with_parent() -> None:
    """End at once if rank 0 disappears, even mid-step (a collective could wait minutes)."""
    import multiprocessing

    rank_0 = multiprocessing.parent_process()

    def watch() -> None:
        rank_0.join()
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
