"""Images in a prompt, from the core's side: each image is a run of placeholder tokens whose
rows the image encoder's output replaces in the prefill, wherever the prompt's chunks cut it.

The prefix cache sees an image's placeholders as keys derived from the image's pixels, so two
prompts share a cached block only where they hold the same image at the same place."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenmill.engine.core.errors import RequestError


@dataclass(frozen=True)
class ImageInput:
    """An image as the model's processor prepared it: pixel values [3, H, W] (float32, on the
    host) and a digest of them, the image's identity in the prefix cache."""

    pixels: torch.Tensor
    digest: bytes

    @classmethod
    def of(cls, pixels: torch.Tensor) -> ImageInput:
        pixels = pixels.contiguous()
        digest = hashlib.sha256(pixels.numpy().tobytes())
        digest.update(str(tuple(pixels.shape)).encode())
        return cls(pixels, digest.digest())

    @property
    def cache_key(self) -> int:
        """A negative id (no token's) standing for each of this image's placeholders."""
        return -1 - int.from_bytes(self.digest[:8], "big") // 2


@dataclass
class ImageSpan:
    """One image in a prompt: its placeholders at [offset, offset + length), and the encoder's
    rows for them [length, hidden] while the prefill still needs them (None: not encoded yet,
    or let go once the prompt was computed)."""

    image: ImageInput
    offset: int
    length: int
    rows: torch.Tensor | None = field(default=None, repr=False)

    @property
    def end(self) -> int:
        return self.offset + self.length


def place_images(token_ids: list[int], images: Sequence[ImageInput], placeholder: int,
                 per_image: int) -> tuple[list[int], list[ImageSpan]]:
    """The prompt with each image's placeholder expanded to `per_image` tokens, and where each
    image lies. A prompt whose placeholders are already expanded (per_image for each image, as
    a processor writes them) is taken as it is. RequestError when the placeholders do not
    match the images."""
    count = sum(1 for t in token_ids if t == placeholder)
    if count == len(images) * per_image and per_image != 1:
        expanded = list(token_ids)
    elif count == len(images):
        expanded = []
        for t in token_ids:
            expanded += [t] * per_image if t == placeholder else [t]
    else:
        raise RequestError(f"the prompt holds {count} image placeholder tokens (id "
                           f"{placeholder}) for {len(images)} images: each image takes one "
                           f"(or {per_image}, already expanded)")
    spans: list[ImageSpan] = []
    for position, t in enumerate(expanded):
        if t == placeholder and (not spans or position >= spans[-1].end):
            span = ImageSpan(images[len(spans)], position, per_image)
            if expanded[span.offset:span.end] != [placeholder] * per_image:
                raise RequestError(f"an image's placeholder tokens (id {placeholder}) must "
                                   f"come one per image or {per_image} in a row")
            spans.append(span)
    return expanded, spans


def cache_token_ids(token_ids: list[int], spans: Sequence[ImageSpan]) -> list[int]:
    """The ids the prefix cache keys a prompt by: each image's placeholders replaced by its
    image's key."""
    if not spans:
        return token_ids
    keyed = list(token_ids)
    for span in spans:
        keyed[span.offset:span.end] = [span.image.cache_key] * span.length
    return keyed


def rows_in_step(spans: Sequence[ImageSpan], start: int, end: int,
                 first_row: int) -> list[tuple[int, torch.Tensor]]:
    """(step row, encoder rows) for the image tokens among positions [start, end) of a prompt
    whose new tokens begin at step row `first_row`."""
    found = []
    for span in spans:
        lo, hi = max(start, span.offset), min(end, span.end)
        if lo < hi:
            found.append((first_row + lo - start, span.rows[lo - span.offset:hi - span.offset]))
    return found



class PromptImages:
    """A model's way with images: its processor (PIL image in, ImageInput out), its
    placeholder token and how many rows an image takes, and the encoder that makes them."""

    def __init__(self, processor: Callable[[Any], torch.Tensor], placeholder: int,
                 per_image: int, encode: Callable[[torch.Tensor], torch.Tensor],
                 rows_on_host: bool):
        self.processor = processor
        self.placeholder = placeholder
        self.per_image = per_image
        self._encode = encode
        self._rows_on_host = rows_on_host  # rows a step carries to other ranks: on the host

    def prepare(self, images: Sequence[Any]) -> list[ImageInput]:
        """Each image (PIL, or already an ImageInput) as the processor prepares it."""
        prepared = []
        for index, image in enumerate(images):
            if isinstance(image, ImageInput):
                prepared.append(image)
                continue
            try:
                prepared.append(ImageInput.of(self.processor(image)))
            except Exception as exc:  # what PIL or the processor raises for this image
                raise RequestError(f"image {index} cannot be read: {exc}",
                                   param="images") from exc
        return prepared

    def place(self, token_ids: list[int],
              images: Sequence[ImageInput]) -> tuple[list[int], list[ImageSpan]]:
        return place_images(token_ids, images, self.placeholder, self.per_image)

    def encode_for_step(self, scheduled: Sequence[tuple[Any, int]]) -> None:
        """Encode, in one batch, the images whose placeholders this step computes and whose
        rows are not at hand (first scheduled, or recomputed after a preemption)."""
        wanted = []
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            wanted += [span for span in seq.images if span.rows is None
                       and span.offset < start + num_new and span.end > start
                       and all(span is not w for w in wanted)]
        if not wanted:
            return
        rows = self._encode(torch.stack([span.image.pixels for span in wanted]))
        if self._rows_on_host:
            rows = rows.cpu()
        for span, image_rows in zip(wanted, rows, strict=True):
            span.rows = image_rows

    @staticmethod
    def release_computed(spans: Sequence[ImageSpan], num_computed: int) -> None:
        """Let go of the rows of images the prompt has computed."""
        for span in spans:
            if span.end <= num_computed:
                span.rows = None
