"""`tokenmill chat` and `tokenmill complete` (vLLM's `vllm chat` and `vllm complete`): talk to a
running server from a terminal. Each reply streams as it is generated; a chat keeps the
conversation, so each message is read after the ones before it. `-q MESSAGE` sends one and
exits. Any server speaking the OpenAI API will do (`--url`), a pod behind `kubectl
port-forward` too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import httpx

DEFAULT_URL = "http://localhost:8000/v1"


class ClientError(Exception):
    """What ends the command with exit status 1, in one line."""


def add_arguments(parser: argparse.ArgumentParser, chat: bool) -> None:
    parser.add_argument("--url", default=DEFAULT_URL,
                        help=f"The server's API base (default {DEFAULT_URL}).")
    parser.add_argument("--model-name", default=None,
                        help="The model to ask (default: the first one /v1/models lists).")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY")
                        or os.environ.get("TOKENMILL_API_KEY"),
                        help="Sent as a Bearer token (default: $OPENAI_API_KEY, else "
                             "$TOKENMILL_API_KEY; none: no key).")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="The most tokens a reply may have (default: the server's).")
    parser.add_argument("--temperature", type=float, default=None,
                        help="Sampling temperature (default: the server's).")
    parser.add_argument("-q", "--quick", metavar="MESSAGE" if chat else "PROMPT",
                        help="Send this one message, print the reply and exit." if chat
                        else "Complete this one prompt, print the text and exit.")
    if chat:
        parser.add_argument("--system-prompt", default=None,
                            help="A system message before the conversation.")


def run(args: argparse.Namespace, chat: bool, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    command = "tokenmill chat" if chat else "tokenmill complete"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        with httpx.Client(base_url=args.url.rstrip("/"), headers=headers,
                          timeout=httpx.Timeout(None, connect=10.0)) as client:
            model = args.model_name or _first_model(client)
            conversation = ([{"role": "system", "content": args.system_prompt}]
                            if chat and args.system_prompt else [])
            if args.quick is not None:
                _turn(client, args, model, conversation, args.quick, chat, out)
                return 0
            while True:
                try:
                    said = input("> ")
                except EOFError:
                    print(file=out)
                    return 0
                if said.strip():
                    _turn(client, args, model, conversation, said, chat, out)
    except ClientError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"{command}: error: can't reach {args.url}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=out)
        return 130


def _first_model(client: httpx.Client) -> str:
    models = _checked(client.get("/models")).json().get("data") or []
    if not models:
        raise ClientError("the server lists no model; name one with --model-name")
    return models[0]["id"]


def _turn(client: httpx.Client, args: argparse.Namespace, model: str,
          conversation: list[dict[str, Any]], said: str, chat: bool, out: TextIO) -> None:
    """Send one message (or prompt), print its reply as it streams, and, in a chat, keep
    both in the conversation."""
    body: dict[str, Any] = {"model": model, "stream": True}
    for name in ("max_tokens", "temperature"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if chat:
        body["messages"] = [*conversation, {"role": "user", "content": said}]
    else:
        body["prompt"] = said
    reply = []
    with client.stream("POST", "/chat/completions" if chat else "/completions",
                       json=body) as response:
        _checked(response)
        for chunk in _events(response):
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    reply.append(piece)
                    out.write(piece)
                    out.flush()
    out.write("\n")
    if chat:
        conversation += [{"role": "user", "content": said},
                         {"role": "assistant", "content": "".join(reply)}]


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON bodies of a server-sent event stream, up to `data: [DONE]`; an error event
    (OpenAI's `{"error": ...}`) ends the command."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        body = json.loads(data)
        if "error" in body:
            raise ClientError(_message(body))
        yield body


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        response.read()
        try:
            message = _message(response.json())
        except ValueError:
            message = response.text.strip() or response.reason_phrase
        raise ClientError(f"the server answered {response.status_code}: {message}")
    return response


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return json.dumps(body)
