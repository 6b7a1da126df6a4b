"""Every error a caller of the engine tells apart, in one place whichever part raises it: the
server maps these to HTTP statuses (400 for a request, 503 for a dead engine) and start-up
failures to one line."""

from __future__ import annotations

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.sampling_params import SamplingParamsError
from tokenmill.engine.core.structured.backend import GrammarError
from tokenmill.engine.core.structured.params import StructuredOutputsError
from tokenmill.engine.execution.workers import WorkerFailed
from tokenmill.engine.models.lora_adapter import LoRAAdapterError
from tokenmill.engine.models.source import ModelLoadError

__all__ = ["ConfigError", "EngineAsleepError", "EngineDeadError", "GrammarError",
           "LoRAAdapterError", "ModelLoadError", "RequestError", "SamplingParamsError",
           "SleepModeError", "StructuredOutputsError", "UnknownAdapterError", "WorkerFailed"]


class RequestError(ValueError):
    """A request the engine can never serve (too long, can't fit the KV pool, bad token ids, a
    constraint that does not compile). `param` names the offending request field, if one."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class UnknownAdapterError(RequestError):
    """A request names a LoRA adapter (its `model`) that is not loaded: a 404 to the server."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an error; no request can be served."""


class EngineAsleepError(RuntimeError):
    """A request came while sleep mode holds the engine (LLMEngine.sleep): wake it up first.
    A 503 to the server."""


class SleepModeError(RuntimeError):
    """Sleep mode cannot be entered now: requests are unfinished. A 409 to the server."""
