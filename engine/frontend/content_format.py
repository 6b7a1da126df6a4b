"""How the chat template reads a message's content (vLLM's --chat-template-content-format):
as a string, or as OpenAI's list of parts ([{"type": "text", "text": ...}]). Most templates
print a string; some, written for a multimodal processor (LLaVA's), loop over the parts and
would print nothing of a string. `auto` asks the template itself: the format in which a
probe message's text shows in what it renders."""

from __future__ import annotations

from typing import Any

_PROBE = "tokenmill-content-probe"
CONTENT_FORMATS = ("auto", "string", "openai")


def detect_content_format(tokenizer: Any, chat_template: str | None,
                          images: bool = False) -> str:
    """"string" where the template prints a string content (or neither form shows), else
    "openai" where it prints a list of text parts. For a conversation with images, "openai"
    wherever the template prints parts: there it places each image itself."""
    def shows(content: Any) -> bool:
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True,
                tokenize=False, chat_template=chat_template)
        except Exception:  # a template that refuses this form
            return False
        # A template printing the list itself (its repr) shows the probe without reading it.
        return isinstance(text, str) and _PROBE in text and "'type'" not in text

    parts = shows([{"type": "text", "text": _PROBE}])
    if not parts or (not images and shows(_PROBE)):
        return "string"
    return "openai"


def in_content_format(conversation: list[dict[str, Any]], content_format: str,
                      image_text: str | None = None) -> list[dict[str, Any]]:
    """The conversation with each message's content as the template reads it: a string (text
    parts joined by newlines, as vLLM joins them), or a list of parts (a string made one text
    part). A template that prints strings gets a message's images as the model's placeholder
    (`image_text`), one line each before its text, as vLLM writes them. ValueError for an image
    where `image_text` is None (a model that reads no images)."""
    def form(content: Any) -> Any:
        if image_text is None and isinstance(content, list) and any(
                part.get("type") == "image" for part in content):
            raise ValueError("this model reads text only: a message cannot carry image_url "
                             "parts")
        if content_format == "openai" and isinstance(content, str):
            return [{"type": "text", "text": content}]
        if content_format != "openai" and isinstance(content, list):
            images = sum(1 for part in content if part.get("type") == "image")
            texts = [part.get("text") or "" for part in content if part.get("type") != "image"]
            return f"{image_text}\n" * images + "\n".join(texts)
        return content

    return [{**message, "content": form(message.get("content"))} if "content" in message
            else message for message in conversation]
