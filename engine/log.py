"""Structured, quiet-by-default logging: one logfmt line per event, extra fields included.

Level from TOKENMILL_LOG_LEVEL (default WARNING); set it to INFO to see model loading,
engine start-up and one line per HTTP request. A server's --log-config-file replaces all of
this with the user's own logging.config.dictConfig (apply_log_config).

`log_fields(request_id=...)` adds fields to every line logged in its context (the task or
thread that entered it): the server tags each request's lines with its request id this way.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import logging.config
import os
import sys
from collections.abc import Iterator

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
# (name, value) pairs, later ones winning; a tuple, so the default can't be changed in place.
_CONTEXT: contextvars.ContextVar[tuple[tuple[str, object], ...]] = contextvars.ContextVar(
    "log_fields", default=())


@contextlib.contextmanager
def log_fields(**fields: object) -> Iterator[None]:
    token = _CONTEXT.set((*_CONTEXT.get(), *fields.items()))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        fields.update(_CONTEXT.get())
        line = " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quote(value: object) -> str:
    """Quoted (JSON string escapes) when needed, so no value can end its field early: a
    client-chosen request id with quotes in it can't forge other fields."""
    text = str(value)
    if not text or any(c in ' ="\\' or not c.isprintable() for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def configure_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("TOKENMILL_LOG_LEVEL", "WARNING")).upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger("tokenmill")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def apply_log_config(path: str) -> None:
    """Configure logging from a JSON file of logging.config.dictConfig's schema (vLLM's
    --log-config-file): tokenmill's loggers and uvicorn's alike. ValueError naming what is
    wrong with the file; `LogfmtFormatter` may be named as a formatter's "()"."""
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except OSError as exc:
        raise ValueError(f"can't read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict) or "version" not in config:
        raise ValueError(f"{path} must hold a JSON object in logging.config.dictConfig's "
                         'schema, such as {"version": 1, "loggers": {...}}')
    try:
        logging.config.dictConfig(config)
    except (ValueError, TypeError, AttributeError, ImportError) as exc:
        raise ValueError(f"{path}: {exc}") from None
