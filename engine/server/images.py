"""A chat request's images (OpenAI's image_url parts): each URL read (a data: URL, an
http(s) URL fetched with a deadline and a size cap, or a file:// under
--allowed-local-media-path), decoded by PIL and prepared by the model's processor off the
event loop. Whatever cannot be read is a 400 naming the part."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import unquote, urlparse

import httpx

from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.frontend.media import (
    FETCH_TIMEOUT_S,
    MAX_IMAGE_BYTES,
    data_url_bytes,
    open_image,
)
from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.state import ServerState


async def request_images(urls: list[str], state: ServerState,
                         settings: dict[str, Any] | None = None) -> list[Any]:
    """The images behind `urls`, prepared for the engine (ImageInputs), in order, with the
    request's own processor settings (mm_processor_kwargs). A model that reads no images
    never gets here: rendering the messages refused them."""
    if not urls:
        return []
    try:
        state.engine.engine.check_image_count(len(urls))
    except RequestError as exc:
        raise APIError(400, str(exc), param="messages") from exc
    encoded = await asyncio.gather(*(_read(url, index, state) for index, url in
                                     enumerate(urls)))
    try:
        return await asyncio.to_thread(_prepare, encoded, state.engine.engine, settings)
    except RequestError as exc:
        if exc.param == "mm_processor_kwargs":
            raise APIError(400, str(exc), param=exc.param) from exc
        raise APIError(400, f"messages: {exc}", param="messages") from exc


def _prepare(encoded: list[bytes], engine: Any, settings: dict[str, Any] | None) -> list[Any]:
    images = []
    for index, data in enumerate(encoded):
        try:
            images.append(open_image(data))
        except ValueError as exc:
            raise RequestError(f"image {index} is {exc}") from exc
    return engine.prepare_images(images, settings)


async def _read(url: str, index: int, state: ServerState) -> bytes:
    where = f"image {index}"
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, where)
    if scheme in ("http", "https"):
        return await _fetch(url, where, state.options.allowed_media_domains)
    if scheme == "file":
        return _local_file(url, where, state.options.allowed_local_media_path)
    raise APIError(400, f"{where}: the URL must be http(s)://, data: or file:// (under "
                        "--allowed-local-media-path)", param="messages")


def _data_url(url: str, where: str) -> bytes:
    try:
        return data_url_bytes(url)
    except ValueError as exc:
        raise APIError(400, f"{where}: {exc}", param="messages") from exc


async def _fetch(url: str, where: str, domains: tuple[str, ...] | None) -> bytes:
    async def allowed(request: httpx.Request) -> None:  # the URL and every redirect
        if domains is not None and request.url.host not in domains:
            raise APIError(400, f"{where}: {request.url.host} is not one of "
                                "--allowed-media-domains", param="messages")

    try:
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=True,
                                     event_hooks={"request": [allowed]}) as client, \
                client.stream("GET", url) as response:
            if response.status_code != 200:
                raise APIError(400, f"{where}: fetching {url} answered HTTP "
                                    f"{response.status_code}", param="messages")
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_IMAGE_BYTES:
                    raise APIError(400, f"{where}: {url} is larger than "
                                        f"{MAX_IMAGE_BYTES >> 20} MiB", param="messages")
            return bytes(data)
    except httpx.HTTPError as exc:
        raise APIError(400, f"{where}: cannot fetch {url}: {type(exc).__name__} {exc}".strip(),
                       param="messages") from exc


def _local_file(url: str, where: str, allowed: str | None) -> bytes:
    if allowed is None:
        raise APIError(400, f"{where}: file:// URLs are read only under "
                            "--allowed-local-media-path, which this server does not set",
                       param="messages")
    path = os.path.realpath(unquote(urlparse(url).path))
    root = os.path.realpath(allowed)
    if os.path.commonpath([path, root]) != root:
        raise APIError(400, f"{where}: {path} is outside --allowed-local-media-path",
                       param="messages")
    try:
        if os.path.getsize(path) > MAX_IMAGE_BYTES:
            raise APIError(400, f"{where}: larger than {MAX_IMAGE_BYTES >> 20} MiB",
                           param="messages")
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise APIError(400, f"{where}: cannot read {path}: {exc.strerror}",
                       param="messages") from exc
