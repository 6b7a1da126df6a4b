"""vLLM's per-request `chat_template`: a chat request may bring its own Jinja template, which
renders its messages in place of the server's, only where the server was started with
--trust-request-chat-template (a template is code the server runs, sandboxed as transformers
runs every chat template)."""

from __future__ import annotations

from typing import Any

import jinja2

from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.state import ServerState


def request_template(body: Any, state: ServerState) -> str | None:
    """The request's own template (None: the server's); a 400 naming `chat_template` where
    the server does not take one, or where it does not parse."""
    template = body.chat_template
    if template is None:
        return None
    if not state.options.trust_request_chat_template:
        raise APIError(400, "chat_template: this server renders messages with its own chat "
                            "template; a request's template needs the server started with "
                            "--trust-request-chat-template", param="chat_template")
    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise APIError(400, f"chat_template: the template does not parse: line {exc.lineno}: "
                            f"{exc.message}", param="chat_template") from None
    return template
