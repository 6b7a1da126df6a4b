"""Structured, quiet-by-default logging: one logfmt line per event, extra fields included.

Level from TOKENMILL_LOG_LEVEL (default WARNING); set it to INFO to see model loading and
engine start-up.
"""

from __future__ import annotations

import logging
import os
import sys

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        line = " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quote(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or "=" in text or not text) else text


def configure_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("TOKENMILL_LOG_LEVEL", "WARNING")).upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger("tokenmill")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
