"""Images in a prompt, from the core's side: each image is a run of placeholder tokens whose
rows the image encoder's output replaces in the prefill, wherever the prompt's chunks cut it.

The prefix cache sees an image's placeholders as keys derived from the image's pixels, so two
prompts share a cached block only where they hold the same image at the same place."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.models.images import ImageTokens

ENCODE_BATCH = 8  # images through the encoder at once


@dataclass(frozen=True)
class ImageInput:
    """An image as the model's processor prepared it: pixel values ([3, H, W], LLaVA-NeXT's
    views [n, 3, H, W] or Qwen's patches [n, patch pixels]; float32, on the host), the rows it
    becomes, its size before processing where the encoder reads it (LLaVA-NeXT; Qwen: its
    patch grid), and a digest of them all, the image's identity in the prefix cache."""

    pixels: torch.Tensor
    digest: bytes
    rows: int
    size: tuple[int, ...] | None = None
    line: int | None = None  # rows per line where the prompt breaks them (Mistral 3)
    # The (frames, height, width) its rows make where the model gives them 3-D rotary
    # positions (Qwen2-VL's M-RoPE); None: each row's position is its index.
    grid: tuple[int, int, int] | None = None
    # Its tokens as the model's processor writes them out, where they depend on the image
    # (Idefics 3's tile tags); None: ImageTokens.before, the rows, ImageTokens.after.
    written: tuple[int, ...] | None = None

    @classmethod
    def of(cls, pixels: torch.Tensor, rows: int, size: tuple[int, ...] | None = None,
           line: int | None = None, grid: tuple[int, int, int] | None = None,
           written: tuple[int, ...] | None = None) -> ImageInput:
        pixels = pixels.contiguous()
        digest = hashlib.sha256(pixels.numpy().tobytes())
        digest.update(str((tuple(pixels.shape), rows, size, line, grid, written)).encode())
        return cls(pixels, digest.digest(), rows, size, line, grid, written)

    def runs(self, row: int | None = None) -> list[int]:
        """The lengths of the runs its row tokens (id `row`) make in the prompt."""
        if self.written is not None:
            return [len(list(run)) for token, run in itertools.groupby(self.written)
                    if token == row]
        return [self.rows] if self.line is None else [self.line] * (self.rows // self.line)

    @property
    def cache_key(self) -> int:
        """A negative id (no token's) standing for each of this image's placeholders."""
        return -1 - int.from_bytes(self.digest[:8], "big") // 2


@dataclass
class ImageSpan:
    """One run of an image's row tokens in a prompt (the whole image, or one of its lines):
    the tokens at [offset, offset + length), the image's rows from `first_row` that replace
    them, and those rows [length, hidden] while the prefill still needs them (None: not
    encoded yet, or let go once the prompt was computed)."""

    image: ImageInput
    offset: int
    length: int
    both_ways: bool = False
    rows: torch.Tensor | None = field(default=None, repr=False)
    first_row: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.length


def place_images(token_ids: list[int], images: Sequence[ImageInput],
                 tokens: ImageTokens) -> tuple[list[int], list[ImageSpan]]:
    """The prompt with each image's marker expanded, and where each image's rows lie. A prompt
    already expanded (per_image row tokens for each image, as a processor writes them) is
    taken as it is. RequestError when the markers do not match the images."""
    rows = sum(1 for t in token_ids if t == tokens.row)
    markers = sum(1 for t in token_ids if t == tokens.marker)
    single = tokens.marker == tokens.row and all(image.rows == 1 for image in images)
    if rows == sum(image.rows for image in images) and not single:
        expanded = list(token_ids)
    elif markers == len(images) and (tokens.marker == tokens.row or rows == 0):
        pending = iter(images)
        expanded = []
        for t in token_ids:
            expanded += _written(next(pending), tokens) if t == tokens.marker else [t]
    else:
        raise RequestError(f"the prompt holds {markers} image placeholder tokens (id "
                           f"{tokens.marker}) for {len(images)} images: each image takes one "
                           f"(or its rows' tokens of id {tokens.row}, already expanded)")
    spans: list[ImageSpan] = []
    position = 0
    for index, image in enumerate(images):
        first_row = 0
        for length in image.runs(tokens.row):
            position = expanded.index(tokens.row, position)
            if expanded[position:position + length] != [tokens.row] * length:
                raise RequestError(f"image {index}'s tokens (id {tokens.row}) must come "
                                   f"{length} in a row")
            spans.append(ImageSpan(image, position, length, tokens.both_ways,
                                   first_row=first_row))
            position += length
            first_row += length
    return expanded, spans


def _written(image: ImageInput, tokens: ImageTokens) -> list[int]:
    """An image's marker written out: its row tokens, in lines where the model breaks them."""
    if image.written is not None:
        return list(image.written)
    if image.line is None:
        return [*tokens.before, *[tokens.row] * image.rows, *tokens.after]
    lines = [[tokens.row] * length + [tokens.line_end] for length in image.runs()]
    lines[-1][-1] = tokens.image_end
    return [*tokens.before, *(t for line in lines for t in line), *tokens.after]


def whole_images(spans: Sequence[ImageSpan], start: int, num_new: int) -> int:
    """How many of the `num_new` prompt tokens from `start` a step may compute without cutting
    an image whose rows see each other both ways: the chunk ends before such an image it would
    cut, or runs to its end when it starts inside one (0: not this step)."""
    end = start + num_new
    for span in spans:
        if not span.both_ways or not span.offset < end < span.end:
            continue
        return span.offset - start if span.offset > start else \
            (span.end - start if span.end - start <= num_new else 0)
    return num_new


def visible_until(spans: Sequence[ImageSpan], start: int, end: int) -> list[int] | None:
    """The last position each of positions [start, end) sees: its own, or for a row of an
    image seen both ways the image's last. None where no row sees past itself."""
    both = [s for s in spans if s.both_ways and s.offset < end and s.end > start]
    if not both:
        return None
    last = list(range(start, end))
    for span in both:
        for position in range(max(start, span.offset), min(end, span.end)):
            last[position - start] = span.end - 1
    return last


def rope_shift(spans: Sequence[ImageSpan], position: int) -> int:
    """How far the rotary position of a text token at `position` lies from its index: an
    image with 3-D positions spans as many positions as its rows' longest side, not one per
    row (Qwen2-VL's M-RoPE)."""
    return sum(max(span.image.grid[1:]) - span.length for span in spans
               if span.image.grid is not None and span.end <= position)


def rope_positions(spans: Sequence[ImageSpan], start: int,
                   end: int) -> list[tuple[int, int, int]] | None:
    """The (frame, row, column) rotary positions of positions [start, end) of a prompt where
    some of them are rows of an image with 3-D positions (None where none are): a text token
    has its shifted index three times; an image's rows count from the position the image
    starts at, along each of its axes."""
    gridded = [s for s in spans if s.image.grid is not None and s.offset < end and s.end > start]
    if not gridded:
        return None
    bases = {id(s): s.offset + rope_shift(spans, s.offset) for s in gridded}
    out = []
    for position in range(start, end):
        span = next((s for s in gridded if s.offset <= position < s.end), None)
        if span is None:
            text = position + rope_shift(spans, position)
            out.append((text, text, text))
            continue
        _, height, width = span.image.grid
        base, row = bases[id(span)], position - span.offset
        out.append((base, base + row % (height * width) // width, base + row % width))
    return out


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

    def __init__(self, processor: Callable[[Any], tuple[torch.Tensor, Any]],
                 tokens: ImageTokens, marker_text: str, expansion_text: str, *,
                 encode: Callable[[list[torch.Tensor], list[Any]], list[torch.Tensor]],
                 rows_on_host: bool,
                 layout_of: Callable[[Any], tuple[int, int | None]] | None = None,
                 grid_of: Callable[[Any], tuple[int, int, int]] | None = None,
                 several: Callable[[list[Any]], list[tuple[torch.Tensor, Any]]] | None = None,
                 writer: Callable[[Any], list[int]] | None = None):
        """processor: an image to (pixels, its size); layout_of: the rows an image of that
        size becomes and the rows per line of them (None: tokens.per_image rows in one run);
        grid_of: the (frames, height, width) extent of those rows where the model gives them
        3-D positions (None: it does not); encode: pixels and sizes to each image's rows;
        several: where the model reads an image differently when its prompt holds several
        (LLaVA-OneVision), the processor of such a prompt's images, all at once; an image's
        size then carries a third number, 1 where its prompt holds several; writer: an
        image's tokens as the processor writes them, where they follow its size (Idefics 3's
        grid of tiles)."""
        self.processor = processor
        self.tokens = tokens
        # A text prompt's marker, and what replaces it before tokenizing (as the model's
        # processor writes it: the text around the rows tokenizes as it does there).
        self.marker_text = marker_text
        self.expansion_text = expansion_text
        self._encode = encode
        self._layout_of = layout_of or (lambda size: (tokens.per_image, None))
        self._grid_of = grid_of
        self._several = several
        self._writer = writer
        self._rows_on_host = rows_on_host  # rows a step carries to other ranks: on the host

    def prepare(self, images: Sequence[Any],
                settings: dict[str, Any] | None = None) -> list[ImageInput]:
        """Each image (PIL, an array, or already an ImageInput) as the processor prepares it,
        with a request's own processor settings (vLLM's mm_processor_kwargs)."""
        settings = self._checked(settings or {})
        together = self._several is not None and len(images) > 1
        if together:
            raw = [image for image in images if not isinstance(image, ImageInput)]
            try:
                batch = iter(self._several(raw, **settings) if raw else [])
            except Exception as exc:  # what PIL or the processor raises for these images
                raise RequestError(f"the images cannot be read: {exc}", param="images") from exc
        prepared = []
        for index, image in enumerate(images):
            if isinstance(image, ImageInput):
                prepared.append(image)
                continue
            try:
                pixels, size = next(batch) if together else self.processor(image, **settings)
                if self._several is not None:
                    size = (*size, int(together))
                rows, line = self._layout_of(size)
                grid = None if self._grid_of is None else self._grid_of(size)
                written = None if self._writer is None else tuple(self._writer(size))
                prepared.append(ImageInput.of(pixels, rows, size, line, grid, written))
            except Exception as exc:  # what PIL or the processor raises for this image
                raise RequestError(f"image {index} cannot be read: {exc}",
                                   param="images") from exc
        return prepared

    def largest_batch(self) -> list[ImageInput]:
        """The largest batch of images one encoder call takes: ENCODE_BATCH of the largest
        image the processor makes (the KV pool's profile encodes it)."""
        largest = getattr(self.processor, "largest", None)
        if largest is None:
            return []
        image = self.prepare([largest()])[0]
        return [image] * ENCODE_BATCH

    def _checked(self, settings: dict[str, Any]) -> dict[str, Any]:
        if not settings:
            return {}
        if not isinstance(settings, dict):
            raise RequestError("mm_processor_kwargs must be an object of the image processor's "
                               "settings", param="mm_processor_kwargs")
        check = getattr(self.processor, "checked", None)
        try:
            return check(settings) if check is not None else dict(settings)
        except ValueError as exc:
            raise RequestError(f"mm_processor_kwargs: {exc}", param="mm_processor_kwargs") \
                from exc

    @property
    def placeholder(self) -> int:
        return self.tokens.marker

    @property
    def per_image(self) -> int:
        return self.tokens.per_image

    def place(self, token_ids: list[int],
              images: Sequence[ImageInput]) -> tuple[list[int], list[ImageSpan]]:
        return place_images(token_ids, images, self.tokens)

    def expand_text(self, text: str) -> str:
        """A text prompt with each image marker written out as the processor writes it."""
        if not self.marker_text or self.marker_text == self.expansion_text:
            return text
        return text.replace(self.marker_text, self.expansion_text)

    def encode_for_step(self, scheduled: Sequence[tuple[Any, int]]) -> None:
        """Encode the images whose placeholders this step computes and whose rows are not at
        hand (first scheduled, or recomputed after a preemption), ENCODE_BATCH at a time (the
        tower's activations grow with the batch; the KV pool was sized without them)."""
        wanted: list[ImageInput] = []  # each image once, whichever of its runs asks
        runs: list[ImageSpan] = []  # every run of those images in the step's prompts
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            for span in seq.images:
                if span.rows is None and span.offset < start + num_new and span.end > start \
                        and all(span.image is not w for w in wanted):
                    wanted.append(span.image)
            runs += [span for span in seq.images if span.rows is None]
        for first in range(0, len(wanted), ENCODE_BATCH):
            batch = wanted[first:first + ENCODE_BATCH]
            rows = self._encode([image.pixels for image in batch],
                                [image.size for image in batch])
            for image, image_rows in zip(batch, rows, strict=True):
                image_rows = image_rows.cpu() if self._rows_on_host else image_rows
                for span in runs:
                    if span.image is image and span.rows is None:
                        span.rows = image_rows[span.first_row:span.first_row + span.length]

    @staticmethod
    def release_computed(spans: Sequence[ImageSpan], num_computed: int) -> None:
        """Let go of the rows of images the prompt has computed."""
        for span in spans:
            if span.end <= num_computed:
                span.rows = None
