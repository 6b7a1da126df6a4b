"""The FastAPI application: OpenAI routes (embeddings too), vLLM's classify, score and rerank,
tokenize, health, metrics, models and version."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Literal

from fastapi import FastAPI, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic_core import from_json

from tokenmill.engine.server.adapters import add_runtime_routes, model_cards, resolve_model
from tokenmill.engine.server.classify import create_classification
from tokenmill.engine.server.embeddings import create_embedding
from tokenmill.engine.server.embeddings_protocol import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
)
from tokenmill.engine.server.errors import install_error_handlers
from tokenmill.engine.server.invocations import invoke
from tokenmill.engine.server.messages import count_message_tokens, create_message
from tokenmill.engine.server.messages_protocol import MessagesRequest
from tokenmill.engine.server.middleware import (
    ApiKey,
    BodyLimit,
    HeaderLimit,
    RequestId,
    add_user_middleware,
)
from tokenmill.engine.server.openai_serving import create_chat_completion, create_completion
from tokenmill.engine.server.pooling import create_pooling
from tokenmill.engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from tokenmill.engine.server.responses import (
    cancel_response,
    count_input_tokens,
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)
from tokenmill.engine.server.responses_protocol import ResponsesRequest
from tokenmill.engine.server.scores import create_rerank, create_score
from tokenmill.engine.server.scores_protocol import RerankRequest, ScoreRequest
from tokenmill.engine.server.sleep_routes import add_sleep_routes
from tokenmill.engine.server.state import ServerState, State, start_loading
from tokenmill.engine.server.tokenization import detokenize, tokenize, tokenizer_info
from tokenmill.engine.server.tracing import TraceContextMiddleware


def tokenmill_version() -> str:
    try:
        return version("tokenmill")
    except PackageNotFoundError:
        return "unknown"


class _StrictJSONRequest(Request):
    async def json(self):
        if not hasattr(self, "_json"):
            try:
                self._json = from_json(await self.body(), allow_inf_nan=False)
            except ValueError as exc:  # FastAPI answers this one as a 400 "json_invalid"
                raise json.JSONDecodeError(_explained(str(exc)), "", 0) from exc
        return self._json


def _explained(message: str) -> str:
    """The parser's words, with what they mean where they name the escape rather than the
    text: a lone half of a surrogate pair, which Python's json module would take."""
    if "hex escape" in message:
        return (f"{message} (a \\ud800-\\udfff escape must be one half of a surrogate pair: "
                "alone it is no character)")
    return message


class StrictJSONRoute(APIRoute):
    """Bodies parsed as JSON per RFC 8259, where Python's json module is lax: a lone surrogate
    escape ("\\ud800", text no encoder can write, so the tokenizer failed on it), NaN and
    Infinity are not JSON and answer 400."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request: Request):
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


def create_app(state: ServerState, load_model: bool = True) -> FastAPI:
    """An app serving `state`. With load_model, the model loads on a thread at start-up, so
    /health answers (503) while it loads."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state.tokenmill
        state.idle.set()
        if load_model and state.engine is None:
            start_loading(state)
        yield
        state.responses.cancel_all()
        if state.engine is not None:
            state.engine.shutdown()

    options = state.options
    docs = {} if options.fastapi_docs else {"openapi_url": None, "docs_url": None,
                                             "redoc_url": None}
    app = FastAPI(title="tokenmill", version=tokenmill_version(), lifespan=lifespan, **docs)
    # --root-path as vLLM sets it: the router matches paths with or without the prefix.
    app.root_path = options.root_path
    app.router.route_class = StrictJSONRoute
    app.state.tokenmill = state
    install_error_handlers(app)
    # Added innermost first: a request meets --middleware's, RequestId, HeaderLimit, then
    # CORS, then ApiKey, then BodyLimit (then, tracing, TraceContextMiddleware).
    # CORS sits outside the key check: a browser's preflight carries no key, and a 401 must
    # carry the CORS headers for the page to read it.
    if state.tracer is not None:  # innermost: in the task that serves the request
        app.add_middleware(TraceContextMiddleware)
    app.add_middleware(BodyLimit, options=options)
    app.add_middleware(ApiKey, options=options)
    app.add_middleware(CORSMiddleware, allow_origins=list(options.allowed_origins),
                       allow_methods=list(options.allowed_methods),
                       allow_headers=list(options.allowed_headers),
                       allow_credentials=options.allow_credentials)
    app.add_middleware(HeaderLimit, options=options)
    app.add_middleware(RequestId)
    for path in options.middleware:  # outermost, as vLLM adds them
        add_user_middleware(app, path)
    created = int(time.time())

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, state: State):
        return await create_completion(body, request, state)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request, state: State):
        return await create_chat_completion(body, request, state)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request, state: State):
        return await create_response(body, request, state)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request, state: State):
        return await create_embedding(body, request, state)

    async def classify(body: ClassificationRequest, request: Request, state: State):
        return await create_classification(body, request, state)

    async def score(body: ScoreRequest, request: Request, state: State):
        return await create_score(body, request, state)

    async def rerank(body: RerankRequest, request: Request, state: State):
        return await create_rerank(body, request, state)

    @app.post("/pooling")  # vLLM's: whatever the model pools for
    async def pooling(body: PoolingRequest, request: Request, state: State):
        return await create_pooling(body, request, state)

    @app.post("/invocations")  # SageMaker's, as vLLM serves it
    async def invocations(request: Request, state: State):
        return await invoke(request, state)

    for path in ("/classify", "/v1/classify"):  # vLLM's paths
        app.post(path)(classify)
    for path in ("/score", "/v1/score"):
        app.post(path)(score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.post(path)(rerank)

    @app.post("/v1/messages")  # Anthropic's
    async def messages(body: MessagesRequest, request: Request, state: State):
        return await create_message(body, request, state)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(body: MessagesRequest, state: State):
        return await count_message_tokens(body, state)

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens(body: ResponsesRequest, state: State):
        return await count_input_tokens(body, state)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, state: State, stream: bool = False):
        return retrieve_response(response_id, state, stream)

    @app.delete("/v1/responses/{response_id}")
    async def forget_response(response_id: str, state: State):
        return delete_response(response_id, state)

    @app.post("/v1/responses/{response_id}/cancel")
    async def stop_response(response_id: str, state: State):
        return await cancel_response(response_id, state)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, state: State,
                          order: Literal["asc", "desc"] = "desc",
                          limit: Annotated[int, Query(ge=1, le=100)] = 20,
                          after: str | None = None):
        return list_input_items(response_id, state, order, limit, after)

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest, state: State):
        return await tokenize(body, state)

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest, state: State):
        return detokenize(body, state)

    if options.tokenizer_info_endpoint:
        @app.get("/tokenizer_info")
        async def tokenizer_info_route(state: State):
            return tokenizer_info(state)

    @app.get("/v1/models")
    async def models(state: State):
        return {"object": "list", "data": model_cards(state, created)}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str, state: State):
        """One model's card (the openai client's `models.retrieve`); 404 for any other name.
        `:path`, since served names may hold slashes (`Qwen/Qwen3-0.6B`)."""
        resolve_model(state, model)
        return next(card for card in model_cards(state, created) if card["id"] == model)

    if state.config.enable_lora and state.config.allow_runtime_lora_updating:
        add_runtime_routes(app)
    if state.config.enable_sleep_mode:
        add_sleep_routes(app)

    @app.get("/health")
    @app.get("/ping")  # vLLM's (SageMaker's probe path), answered as /health
    @app.post("/ping")
    async def health(state: State):
        if state.ready:
            return {"status": "ok"}
        if state.draining:
            reason = "draining"
        elif state.load_error is not None:
            reason = f"model failed to load: {state.load_error}"
        elif state.engine is None:
            reason = "loading"
        else:
            reason = "engine loop stopped"
        return JSONResponse({"status": reason}, status_code=503)

    @app.get("/load")
    async def load(state: State):
        """vLLM's server load: the API calls in flight (each until its reply has ended)."""
        return {"server_load": state.in_flight}

    @app.get("/metrics")
    async def metrics(state: State):
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def get_version():
        return {"version": tokenmill_version()}

    return app
