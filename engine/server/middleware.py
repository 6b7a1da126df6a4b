"""What every HTTP request passes before a route: its request id, the header count limit, the
API key, the body limit; and the middleware --middleware names.

Plain ASGI wrappers, outermost first: (--middleware's,) RequestId, HeaderLimit, (Starlette's
CORS,) ApiKey, BodyLimit. None of them buffers a response, so streams pass through as they are
sent; the request id stays set (a context variable, see log.log_fields) for every line logged
while its request runs.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import inspect
import logging
import time
import uuid

from fastapi import FastAPI
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenmill.engine.core.errors import ConfigError
from tokenmill.engine.log import log_fields
from tokenmill.engine.server.errors import APIError, error_response
from tokenmill.engine.server.state import ServerOptions

log = logging.getLogger(__name__)

# Open without a key: probes, Prometheus, the load and the API's own description. Every
# other path, /v1/* and /tokenize among them, needs the key (unknown paths too: they answer
# 401, not 404).
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/load", "/version",
                        "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
_CHALLENGE = {"WWW-Authenticate": "Bearer"}  # RFC 6750: a 401 names the scheme it wants


class RequestId:
    """Echo the client's X-Request-Id (or a new one) on the response and tag the request's log
    lines with it; log one line per request (INFO) and turn an unexpected exception into a 500
    in OpenAI's shape."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = Headers(scope=scope).get("x-request-id") or uuid.uuid4().hex
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-Id"] = request_id
            await send(message)

        start = time.perf_counter()
        with log_fields(request_id=request_id):
            try:
                await self.app(scope, receive, send_with_id)
            except Exception:
                log.exception("unhandled error", extra={"path": scope["path"]})
                if status is not None:  # a stream already under way: nothing left to say
                    raise
                await error_response(APIError(
                    500, f"internal error; the server log has its cause under request id "
                         f"{request_id}"))(scope, receive, send_with_id)
            finally:
                log.info("request", extra={"method": scope["method"], "path": scope["path"],
                                           "status": status,
                                           "duration_s": round(time.perf_counter() - start, 4)})


def route_path(scope: Scope) -> str:
    """The request's path below --root-path, which a proxy may or may not have stripped (the
    router matches either way)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root + "/") else path


class ApiKey:
    """With options.api_key set, `Authorization: Bearer <key>` (or `x-api-key: <key>`, as
    Anthropic's clients send it) on every path but OPEN_PATHS; 401 in OpenAI's shape."""

    def __init__(self, app: ASGIApp, options: ServerOptions):
        self.app = app
        self.options = options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.options.api_key
        if key is None or scope["type"] != "http" or route_path(scope) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, token = (headers.get("authorization") or "").strip().partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        token = token or (headers.get("x-api-key") or "").strip()  # Anthropic's clients' header
        if not token:
            # OpenAI's words and shape for a request without a key (its code is null).
            error = APIError(401, "You didn't provide an API key. You need to provide your API "
                                  "key in an Authorization header using Bearer auth (i.e. "
                                  "Authorization: Bearer YOUR_KEY).", headers=_CHALLENGE)
        elif not hmac.compare_digest(_digest(token.encode("latin-1")), _digest(key.encode())):
            error = APIError(401, "Incorrect API key provided.", code="invalid_api_key",
                             headers=_CHALLENGE)
        else:
            await self.app(scope, receive, send)
            return
        await error_response(error)(scope, receive, send)


def _digest(key: bytes) -> bytes:
    # Digests of equal length, compared in constant time: neither the key's bytes nor its
    # length show in how long a wrong guess takes. (A header's bytes arrive as latin-1 text.)
    return hashlib.sha256(key).digest()


class HeaderLimit:
    """431 for a request with more headers than options.max_header_count (vLLM's
    --h11-max-header-count: a bound on what one request makes the server parse and keep)."""

    def __init__(self, app: ASGIApp, options: ServerOptions):
        self.app = app
        self.options = options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.options.max_header_count
        if scope["type"] == "http" and len(scope["headers"]) > limit:
            error = APIError(431, f"the request has {len(scope['headers'])} headers, more than "
                                  f"this server's limit of {limit} (--h11-max-header-count)")
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def add_user_middleware(app: FastAPI, path: str) -> None:
    """--middleware (vLLM's): the class or async function at `path` (package.module.name, or
    package.module:name), a class added as ASGI middleware, a function as FastAPI's
    @app.middleware("http"); ConfigError naming the flag for anything else."""
    module_name, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("--middleware", f"can't import {path}: {exc}") from None
    if inspect.isclass(target):
        app.add_middleware(target)
    elif inspect.iscoroutinefunction(target):
        app.middleware("http")(target)
    else:
        raise ConfigError("--middleware", f"{path} is neither a class nor an async function")


class BodyLimit:
    """413 for a body over options.max_request_body_bytes, before the app reads any of it: at
    once when its Content-Length says so, else (chunked) as soon as the bytes received pass
    the limit. The body is read here, up to the limit, and handed to the app whole."""

    def __init__(self, app: ASGIApp, options: ServerOptions):
        self.app = app
        self.options = options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.options.max_request_body_bytes
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _too_large(limit, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await _too_large(limit, scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks),
                                "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)


async def _too_large(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
    error = APIError(413, f"the request body is larger than this server's limit of {limit} "
                          "bytes (--max-request-body-bytes)")
    await error_response(error)(scope, receive, send)
