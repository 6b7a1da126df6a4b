"""Images named by URL, as OpenAI's image_url parts name them: a data: URL (base64), an
http(s) URL, or a local file (file:// or a path). The offline API reads them here; the server
reads data: URLs with the same rules and fetches the rest without blocking its event loop."""

from __future__ import annotations

import base64
import binascii
import io
import os
from typing import Any
from urllib.parse import unquote, urlparse

MAX_IMAGE_BYTES = 20 << 20  # an image's encoded bytes, fetched or inlined
# Decoded pixels (8192 x 8192): a PNG of one colour decodes from a few hundred KB to gigabytes,
# where PIL's own bound (about 179 million) still lets one request take seconds and 4 GB.
MAX_IMAGE_PIXELS = 8192 * 8192
# Seconds to fetch an image; vLLM's variable sets it too.
FETCH_TIMEOUT_S = float(os.environ.get("VLLM_IMAGE_FETCH_TIMEOUT", "5"))


def data_url_bytes(url: str) -> bytes:
    """The bytes of a data:<type>;base64,<data> URL; ValueError saying what is wrong."""
    header, comma, payload = url[len("data:"):].partition(",")
    if not comma or not header.endswith(";base64"):
        raise ValueError("a data URL must be data:<type>;base64,<data>")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ValueError(f"larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the data URL is not valid base64 ({exc})") from exc


def open_image(data: bytes) -> Any:
    """A decoded PIL image; ValueError for bytes PIL cannot read as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size  # read from the header, before any pixel is decoded
        if width * height <= MAX_IMAGE_PIXELS:
            image.load()
    except UnidentifiedImageError as exc:  # its message names a buffer object's address
        raise ValueError("not an image PIL can read: no image format it knows (PNG, JPEG, "
                         "WebP, GIF, BMP, ...) matches its bytes") from exc
    except Exception as exc:  # PIL's errors for an image it cannot decode
        raise ValueError(f"not an image PIL can read: {exc}") from exc
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"an image of {width} x {height} pixels; at most "
                         f"{MAX_IMAGE_PIXELS:,} pixels are read")
    return image


def read_image_url(url: str) -> Any:
    """The image a URL names, read here and now (the offline API's; a local path is read
    wherever it is: the caller owns this process)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return open_image(data_url_bytes(url))
    if scheme in ("http", "https"):
        import httpx

        try:
            response = httpx.get(url, timeout=FETCH_TIMEOUT_S, follow_redirects=True)
        except httpx.HTTPError as exc:
            raise ValueError(f"cannot fetch {url}: {type(exc).__name__} {exc}") from exc
        if response.status_code != 200:
            raise ValueError(f"fetching {url} answered HTTP {response.status_code}")
        return open_image(response.content)
    path = unquote(urlparse(url).path) if scheme == "file" else url
    try:
        with open(path, "rb") as f:
            return open_image(f.read(MAX_IMAGE_BYTES + 1))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
