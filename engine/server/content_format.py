"""How the chat template reads a message's content (vLLM's --chat-template-content-format):
as a string, or as OpenAI's list of parts ([{"type": "text", "text": ...}]). Most templates
print a string; some, written for a multimodal processor (LLaVA's), loop over the parts and
would print nothing of a string. `auto` asks the template itself: the format in which a
probe message's text shows in what it renders."""

from __future__ import annotations

from typing import Any

_PROBE = "tokenmill-content-probe"


def detect_content_format(tokenizer: Any, chat_template: str | None) -> str:
    """"string" where the template prints a string content (or neither form shows), else
    "openai" where it prints a list of text parts."""
    def shows(content: Any) -> bool:
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True,
                tokenize=False, chat_template=chat_template)
        except Exception:  # a template that refuses this form
            return False
        return isinstance(text, str) and _PROBE in text

    if shows(_PROBE) or not shows([{"type": "text", "text": _PROBE}]):
        return "string"
    return "openai"


def in_content_format(conversation: list[dict[str, Any]],
                      content_format: str) -> list[dict[str, Any]]:
    """The conversation with each message's content as the template reads it: a string (text
    parts joined), or a list of text parts (a string made one part)."""
    def form(content: Any) -> Any:
        if content_format == "openai" and isinstance(content, str):
            return [{"type": "text", "text": content}]
        if content_format != "openai" and isinstance(content, list):
            return "".join(part.get("text") or "" for part in content)
        return content

    return [{**message, "content": form(message.get("content"))} if "content" in message
            else message for message in conversation]
