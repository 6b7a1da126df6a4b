"""What the HTTP layer shares: the engine (once loaded), its tokenizer, limits, drain state."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import logging
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.contract.pooling import Classifier
from tokenmill.engine.core import LLMEngine, generation_config
from tokenmill.engine.core.errors import ConfigError, ModelLoadError, WorkerFailed
from tokenmill.engine.frontend.async_engine import AsyncEngine
from tokenmill.engine.frontend.content_format import detect_content_format
from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.metrics import EngineMetrics
from tokenmill.engine.server.responses_store import ResponseStore
from tokenmill.engine.server.tracing import RequestTracer

log = logging.getLogger(__name__)


@dataclass
class ServerOptions:
    served_model_name: str  # the model's name in replies and metrics (the first given)
    model_aliases: tuple[str, ...] = ()  # more names a request's `model` may use (vLLM's)
    max_waiting_requests: int = 1024
    shutdown_timeout: float = 30.0
    api_key: str | None = None  # when set, required as a Bearer token (middleware.ApiKey)
    max_request_body_bytes: int = 10 << 20
    enable_auto_tool_choice: bool = False  # parse tool calls when tool_choice is "auto"
    tool_call_parser: str | None = None  # the model's tool-call format (tool_parsers.py)
    chat_template: str | None = None  # --chat-template's text; None: the tokenizer's own
    chat_template_content_format: str = "auto"  # string, openai, or auto: the template's
    # Template variables a request's chat_template_kwargs may override.
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_request_chat_template: bool = False  # a request's chat_template may render it
    response_role: str = "assistant"  # a chat reply's role when the prompt asks for a reply
    reasoning_parser: str | None = None  # the model's thinking format (reasoning.py)
    # auto: the model's sampling defaults; vllm: the API's; a directory: its config's
    generation_config: str = "auto"
    generation_overrides: dict[str, float] = field(default_factory=dict)  # win over both
    # CORS (vLLM's defaults: any origin, method and header; no credentials).
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    fastapi_docs: bool = True  # /docs, /redoc and /openapi.json
    max_header_count: int = 256  # more headers are a 431 (vLLM's --h11-max-header-count)
    middleware: tuple[str, ...] = ()  # --middleware's import paths, outermost last
    tokenizer_info_endpoint: bool = False  # GET /tokenizer_info (it shows the chat template)
    log_requests: bool = False  # a line per generation request (--enable-log-requests)
    log_outputs: bool = False  # a line per finished generation (--enable-log-outputs)
    log_deltas: bool = True  # with log_outputs, a line per streamed step too
    log_error_stack: bool = False  # an error response logs the traceback that made it
    max_log_len: int | None = None  # characters (or token ids) of a text in those lines
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:ID"
    force_include_usage: bool = False  # every stream ends with a usage chunk
    root_path: str = ""  # the prefix a path-based proxy serves this server under
    allowed_local_media_path: str | None = None  # file:// images are read only under it
    allowed_media_domains: tuple[str, ...] | None = None  # hosts images are fetched from
    # gc.freeze() once loaded: for a process that serves until it exits (tokenmill serve),
    # not for a state built and dropped in a longer-lived process.
    freeze_startup_heap: bool = False
    # Responses kept for GET, previous_response_id and background runs (0: none).
    max_stored_responses: int = 1000
    # The OpenTelemetry collector finished requests' spans go to (None: no tracing).
    otlp_traces_endpoint: str | None = None

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return (self.served_model_name, *self.model_aliases)


@dataclass
class ServerState:
    options: ServerOptions
    config: EngineConfig
    metrics: EngineMetrics
    engine: AsyncEngine | None = None
    # The HTTP side's own tokenizer (None before loading, and under --skip-tokenizer-init).
    loaded_tokenizer: Any = None
    max_model_len: int = 0
    # The text of the model's image placeholder token; None: the model reads no images.
    image_placeholder: str | None = None
    # What the model serves (vLLM's task names): generate, embed or classify; a classifier's
    # head (its labels) under classify.
    task: str = "generate"
    classifier: Classifier | None = None
    # What a request's unset sampling fields default to (the model's generation config).
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    load_error: BaseException | None = None
    worker_error: str | None = None  # a tensor-parallel worker died (from its watcher thread)
    draining: bool = False
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # How each chat template seen reads message content (auto), by the template's text.
    content_formats: dict[str, str] = field(default_factory=dict)
    responses: ResponseStore = field(init=False)
    tracer: RequestTracer | None = field(init=False)

    def __post_init__(self) -> None:
        self.responses = ResponseStore(self.options.max_stored_responses)
        endpoint = self.options.otlp_traces_endpoint
        self.tracer = RequestTracer(endpoint) if endpoint is not None else None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer a request's text needs; a 400 saying so where the server loaded none
        (--skip-tokenizer-init)."""
        if self.loaded_tokenizer is None and self.config.skip_tokenizer_init:
            raise APIError(400, "this needs the tokenizer, which the server did not load "
                                "(--skip-tokenizer-init): send prompts as token ids to "
                                "/v1/completions")
        return self.loaded_tokenizer

    @property
    def has_tokenizer(self) -> bool:
        return self.loaded_tokenizer is not None

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.alive and not self.draining

    def fatal_error(self) -> tuple[str, BaseException] | None:
        """What keeps this server from ever serving: a failed load or a dead engine loop."""
        if self.worker_error is not None:
            return "tensor-parallel worker failed", WorkerFailed(self.worker_error)
        if self.load_error is not None:
            return "model failed to load", self.load_error
        if self.engine is not None and self.engine.error is not None:
            return "engine loop failed", self.engine.error
        return None

    def content_format(self, images: bool = False, template: str | None = None) -> str:
        """How the chat template in use (a request's own `template`, else the server's) reads
        a message's content: "string" or "openai" (for a conversation with `images`, parts
        wherever the template prints them)."""
        chosen = self.options.chat_template_content_format
        if chosen != "auto":
            return chosen
        template = template or self.options.chat_template
        used = template or getattr(self.tokenizer, "chat_template", None)
        key = f"{images}:{used!r}"
        if key not in self.content_formats:
            self.content_formats[key] = detect_content_format(self.tokenizer, template, images)
        return self.content_formats[key]

    def load(self, show_progress: bool = True) -> None:
        """Load the model (on a worker thread at start-up) and start the engine loop."""
        try:
            core = LLMEngine(self.config, show_progress=show_progress,
                             on_worker_failure=self._worker_failed)
            # The HTTP side tokenizes on the event loop; the engine thread detokenizes.
            # Separate tokenizer objects keep the two threads from sharing one.
            self.loaded_tokenizer = copy.deepcopy(core.tokenizer)
            self.max_model_len = core.max_model_len
            if core.images is not None:
                self.image_placeholder = self.tokenizer.convert_ids_to_tokens(
                    core.images.placeholder)
            self.task = core.task
            self.classifier = core.pooler.classifier if core.pooler is not None else None
            model_defaults = generation_config.sampling_defaults(
                self.options.generation_config, core.generation_defaults)
            self.sampling_defaults = {**model_defaults, **self.options.generation_overrides}
            if self.sampling_defaults:
                log.info("default sampling parameters (the model's generation config, then "
                         "--override-generation-config)", extra=self.sampling_defaults)
            engine = AsyncEngine(core, observer=self.metrics.observe_step)
            self.metrics.bind(engine)
            self.engine = engine
            if self.options.freeze_startup_heap:
                # What start-up made (the model, its tokenizers, the libraries' modules) lives
                # as long as the server: kept out of the collector's full passes, each of which
                # would otherwise walk all of it and stall both threads (vLLM does the same).
                gc.collect()
                gc.freeze()
        except BaseException as exc:
            self.load_error = exc
            if not isinstance(exc, ConfigError | ModelLoadError | OSError):  # one line says all
                log.exception("model loading failed")
            raise

    def _worker_failed(self, message: str) -> None:
        self.worker_error = message

    def close(self) -> None:
        """Stop the engine loop and end the tensor-parallel workers. After a failure the loop
        may be stuck in a collective with the dead rank, so it is not waited for. What load
        froze can be collected again."""
        if self.options.freeze_startup_heap:
            gc.unfreeze()
        if self.engine is not None:
            self.engine.shutdown(wait=self.fatal_error() is None)
        if self.tracer is not None:
            self.tracer.shutdown()  # the spans still queued go out

    def request_started(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def request_ended(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


def start_loading(state: ServerState, show_progress: bool = True) -> threading.Thread:
    thread = threading.Thread(target=_load_quietly, args=(state, show_progress),
                              name="model-loader", daemon=True)
    thread.start()
    return thread


def _load_quietly(state: ServerState, show_progress: bool) -> None:
    with contextlib.suppress(BaseException):  # kept in state.load_error; the server exits on it
        state.load(show_progress)


def check_ready(state: ServerState) -> None:
    """503 unless the model is loaded and the engine serving."""
    if state.draining:
        raise APIError(503, "the server is shutting down", headers={"Retry-After": "1"})
    if state.engine is None:
        message = ("the model failed to load" if state.load_error is not None
                   else "the model is still loading")
        raise APIError(503, message, headers={"Retry-After": "5"})
    if not state.engine.alive:
        raise APIError(503, "the engine stopped; the server must restart")


def state_of(request: Request) -> ServerState:
    """The app's ServerState. Routes take it per request (`state: State`) rather than close
    over it: FastAPI keeps route functions in process-wide caches, which would keep a stopped
    server's engine, its weights and KV pool, alive for as long as the process lives."""
    return request.app.state.tokenmill


State = Annotated[ServerState, Depends(state_of)]
