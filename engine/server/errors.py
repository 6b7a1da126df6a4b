"""OpenAI-style error responses: {"error": {"message", "type", "param", "code"}}; on the
Messages API's paths, Anthropic's: {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

import logging
import re

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "not_found_error", 405: "invalid_request_error",
               409: "invalid_request_error", 413: "invalid_request_error",
               431: "invalid_request_error", 500: "internal_server_error",
               503: "service_unavailable"}


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# The Messages API's routes, whose errors take Anthropic's shape.
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")

# pydantic's error types for a body that is not an object (bytes, a list, a number).
NOT_AN_OBJECT = ("model_attributes_type", "dict_type", "model_type")


class FieldError(ValueError):
    """A request model's check across fields that faults one of them: the 400 names it in
    `param`, as a check of that field alone would."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def admission_error(exc: BaseException, field: str) -> APIError | None:
    """The HTTP error for a request the engine would not admit (None: not the engine's
    refusal): a RequestError names `field` unless it names its own."""
    from tokenmill.engine.core.errors import (
        EngineAsleepError,
        EngineDeadError,
        RequestError,
        UnknownAdapterError,
    )

    if isinstance(exc, UnknownAdapterError):  # removed since the request was checked
        return APIError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=exc.param or field)
    if isinstance(exc, EngineDeadError | EngineAsleepError):
        return APIError(503, str(exc))
    return None


def reworded(err: APIError, terms: list[tuple[re.Pattern, str]]) -> APIError:
    """The error with its message and param in the words of the API the client spoke (each
    pattern replaced by its term): a translated request's errors name the fields it sent."""
    message, param = err.message, err.param
    for pattern, term in terms:
        message = pattern.sub(term, message)
        param = pattern.sub(term, param) if param else param
    return APIError(err.status, message, param=param, code=err.code, headers=err.headers)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"),
                      "param": param, "code": code}}


def error_response(err: APIError, request: Request | None = None) -> JSONResponse:
    """The error in OpenAI's shape, or Anthropic's where `request` came to the Messages API."""
    if request is not None and request.url.path.endswith(ANTHROPIC_PATHS):
        kind = ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500
                                   else "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": err.message}}
    else:
        body = error_body(err.status, err.message, err.param, err.code)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def client_closed() -> JSONResponse:
    """The answer to a call whose client went away before it finished (nginx's 499)."""
    return JSONResponse(error_body(499, "client closed the request"), status_code=499)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    if request.app.state.tokenmill.options.log_error_stack:  # --log-error-stack
        log.warning("error response", exc_info=exc,
                    extra={"status": exc.status, "error": exc.message})
    return error_response(exc, request)


def _most_telling(errors: list[dict]) -> dict:
    """The error to report: the first, unless it only says a value is not one member of a
    union (a list where a string may also go) while another says what is wrong with the
    member the value is (too many items, an empty one)."""
    first = errors[0] if errors else {}
    if str(first.get("type", "")).endswith("_type"):
        field = _field(first)
        for other in errors[1:]:
            if _field(other) == field and not str(other.get("type", "")).endswith("_type"):
                return other
    return first


def _field(error: dict) -> str | None:
    return next((str(p) for p in error.get("loc", ()) if p != "body"), None)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = _most_telling(list(exc.errors()))
    field = _field(first)  # None: the body as a whole
    param = field
    message = first.get("msg", "invalid request")
    error = first.get("ctx", {}).get("error")
    if first.get("type") == "value_error" and error is not None:
        message = str(error)  # our validators' own words, without a prefix
        if isinstance(error, FieldError) and field is None:
            param = error.field
    sent_as = request.headers.get("content-type")
    if field is None and first.get("type") in NOT_AN_OBJECT and not _is_json(sent_as):
        # FastAPI reads a body as JSON only when its Content-Type says so (curl's -d alone
        # sends a form's): the body arrived as bytes, which no request model accepts.
        message = ("the request body must be JSON sent with 'Content-Type: application/json' "
                   + (f"(this one came as {sent_as!r})" if sent_as else "(this one had none)"))
    elif first.get("type") == "json_invalid":
        message = "the request body is not valid JSON" + (f": {error}" if error else "")
        param = None
    elif first.get("type") == "missing" and field is None:
        message = "the request needs a JSON body"
    elif param:
        message = f"{param}: {message}"
    return error_response(APIError(400, message, param=param), request)


def _is_json(content_type: str | None) -> bool:
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                          and kind.endswith("+json"))


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The router's 404 and 405 in OpenAI's words, with their headers (405's Allow)."""
    message = str(exc.detail)
    headers = dict(exc.headers or {})
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404 and message == "Not Found":
        message = f"Invalid URL ({where})"
    elif exc.status_code == 405:
        allowed = next((v for k, v in headers.items() if k.lower() == "allow"), None)
        message = f"Method not allowed ({where})" + (f": it takes {allowed}" if allowed else "")
    return error_response(APIError(exc.status_code, message, headers=headers or None), request)


def install_error_handlers(app) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
