"""RE2, the regexp of Go: the server compiles every `pattern` and every literal matches()
argument with it; Python's re stands in, less the constructs RE2 lacks."""

from __future__ import annotations

import re


def regex_problem(pattern: str) -> str | None:
    """Whether RE2 (Go's regexp) would reject the pattern, approximated with Python's re."""
    if re.search(r"\(\?[=!<>]|\\[1-9]", pattern):
        return "lookaround and backreferences are not RE2 syntax"
    if re.search(r"\\[pP]", pattern):
        return None
    try:
        re.compile(pattern)
    except re.error as err:
        return str(err)
    return None
