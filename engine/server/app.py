"""The FastAPI application: OpenAI routes, health, metrics, models and version."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tokenmill.engine.server.errors import install_error_handlers
from tokenmill.engine.server.openai_serving import create_chat_completion, create_completion
from tokenmill.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.engine.server.state import ServerState, start_loading


def tokenmill_version() -> str:
    try:
        return version("tokenmill")
    except PackageNotFoundError:
        return "unknown"


def create_app(state: ServerState, load_model: bool = True) -> FastAPI:
    """An app serving `state`. With load_model, the model loads on a thread at start-up, so
    /health answers (503) while it loads."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.idle.set()
        if load_model and state.engine is None:
            start_loading(state)
        yield
        if state.engine is not None:
            state.engine.shutdown()

    app = FastAPI(title="tokenmill", version=tokenmill_version(), lifespan=lifespan)
    app.state.tokenmill = state
    install_error_handlers(app)
    created = int(time.time())

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(body, request, state)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(body, request, state)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.options.served_model_name, "object": "model", "created": created,
            "owned_by": "tokenmill", "root": state.config.model,
            "max_model_len": state.max_model_len or None,
        }]}

    @app.get("/health")
    async def health():
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

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def get_version():
        return {"version": tokenmill_version()}

    return app
