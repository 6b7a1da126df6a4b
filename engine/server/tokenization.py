"""vLLM's /tokenize and /detokenize: the served model's tokenizer and chat template over HTTP."""

from __future__ import annotations

from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.images import request_images
from tokenmill.engine.server.openai_serving import chat_ids, check_model, with_images
from tokenmill.engine.server.protocol import DetokenizeRequest, TokenizeRequest
from tokenmill.engine.server.request_template import request_template
from tokenmill.engine.server.state import ServerState, check_ready
from tokenmill.engine.server.tools import ToolRequestError, template_tools


async def tokenize(body: TokenizeRequest, state: ServerState) -> dict:
    """The prompt's token ids; for messages, with each image's placeholder written out as
    many times as the image takes rows, so the count is a chat completion's prompt_tokens
    (the images are read and checked as a chat request's are)."""
    check_model(state, body.model)
    if body.messages is not None:
        try:
            tools = template_tools(body.tools)
        except ToolRequestError as exc:
            raise APIError(400, str(exc), param=exc.param) from exc
        try:
            ids = chat_ids(state, body.conversation(), tools,
                           add_generation_prompt=body.add_generation_prompt,
                           continue_final_message=body.continue_final_message,
                           template_kwargs=body.chat_template_kwargs,
                           add_special_tokens=bool(body.add_special_tokens),
                           chat_template=request_template(body, state),
                           documents=body.documents)
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", param="messages") from exc
        urls = [url for message in body.messages for url in message.image_urls()]
        images = await request_images(urls, state, body.mm_processor_kwargs)
        if images:
            ids = with_images(state, ids, images, None)
    else:
        ids = state.tokenizer.encode(body.prompt,
                                     add_special_tokens=body.add_special_tokens is not False)
    strs = state.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids,
            "token_strs": strs}


def detokenize(body: DetokenizeRequest, state: ServerState) -> dict:
    check_model(state, body.model)
    vocab = len(state.tokenizer)
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"tokens: {bad} is not a token id of this model (0 to {vocab - 1})",
                       param="tokens")
    return {"prompt": state.tokenizer.decode(body.tokens, skip_special_tokens=False)}


def tokenizer_info(state: ServerState) -> dict:
    """vLLM's GET /tokenizer_info (--enable-tokenizer-info-endpoint): what the tokenizer was
    loaded with (its init kwargs, special tokens as their text), its class and the chat
    template the server renders with, for a client that tokenizes as the server does."""
    check_ready(state)
    tokenizer = state.tokenizer
    info = {key: _plain(value) for key, value in tokenizer.init_kwargs.items()}
    info["tokenizer_class"] = type(tokenizer).__name__
    template = state.options.chat_template or getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def _plain(value: object) -> object:
    """A JSON value: special tokens (AddedToken) as their text, anything else not JSON's as
    its string."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    content = getattr(value, "content", None)
    return content if isinstance(content, str) else str(value)
