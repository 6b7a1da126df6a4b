"""Images in prompts: which checkpoints read them, the checkpoint's own image processor
(pixels resized, cropped and normalized as the model was trained), and its image encoder,
whose rows take the places of an image's placeholder tokens."""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenmill.engine.models import idefics3_images, llava, qwen_vision
from tokenmill.engine.models.gemma3_images import Gemma3ImageEncoder
from tokenmill.engine.models.idefics3_images import Idefics3ImageEncoder
from tokenmill.engine.models.internvl_images import InternVLImageEncoder, rows_per_tile
from tokenmill.engine.models.llava import LlavaImageEncoder
from tokenmill.engine.models.llava_next import LlavaNextImageEncoder
from tokenmill.engine.models.llava_onevision import LlavaOnevisionImageEncoder
from tokenmill.engine.models.mistral3_images import Mistral3ImageEncoder, PixtralImageEncoder
from tokenmill.engine.models.qwen_vision import QwenImageEncoder
from tokenmill.engine.models.safetensors_files import Checkpoint
from tokenmill.engine.models.source import ModelLoadError, ModelSource
from tokenmill.engine.models.vision_encoder import TOWERS

log = logging.getLogger(__name__)

# Multimodal architectures whose images the engine reads, and their encoders; the others
# serve text only.
ENCODERS = {"LlavaForConditionalGeneration": LlavaImageEncoder,
            "LlavaNextForConditionalGeneration": LlavaNextImageEncoder,
            "LlavaOnevisionForConditionalGeneration": LlavaOnevisionImageEncoder,
            "InternVLForConditionalGeneration": InternVLImageEncoder,
            "Idefics3ForConditionalGeneration": Idefics3ImageEncoder,
            "SmolVLMForConditionalGeneration": Idefics3ImageEncoder,
            "Gemma3ForConditionalGeneration": Gemma3ImageEncoder,
            "Mistral3ForConditionalGeneration": Mistral3ImageEncoder,
            "Qwen2VLForConditionalGeneration": QwenImageEncoder,
            "Qwen2_5_VLForConditionalGeneration": QwenImageEncoder,
            "Qwen3VLForConditionalGeneration": QwenImageEncoder,
            "Qwen3VLMoeForConditionalGeneration": QwenImageEncoder,
            "Qwen3_5ForConditionalGeneration": QwenImageEncoder,
            "Qwen3_5MoeForConditionalGeneration": QwenImageEncoder}
# The vision towers each architecture's encoder runs.
TOWERS_OF = {"LlavaForConditionalGeneration": (*TOWERS, "pixtral"),
             "LlavaNextForConditionalGeneration": TOWERS,
             "LlavaOnevisionForConditionalGeneration": TOWERS,
             "InternVLForConditionalGeneration": ("internvl_vision",),
             "Idefics3ForConditionalGeneration": idefics3_images.TOWERS,
             "SmolVLMForConditionalGeneration": idefics3_images.TOWERS,
             "Gemma3ForConditionalGeneration": TOWERS,
             "Mistral3ForConditionalGeneration": ("pixtral",),
             "Qwen2VLForConditionalGeneration": qwen_vision.QWEN2_VL,
             "Qwen2_5_VLForConditionalGeneration": qwen_vision.QWEN2_5_VL,
             "Qwen3VLForConditionalGeneration": qwen_vision.QWEN3_VL,
             "Qwen3VLMoeForConditionalGeneration": qwen_vision.QWEN3_VL,
             "Qwen3_5ForConditionalGeneration": qwen_vision.QWEN3_5,
             "Qwen3_5MoeForConditionalGeneration": qwen_vision.QWEN3_5}
INTERNVL = "InternVLForConditionalGeneration"
# Architectures whose prompt writes an image out with tags that follow its grid of tiles.
TILE_TAGGED = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")
# Architectures that cut an image into tiles, its row count following its size.
TILED = ("LlavaNextForConditionalGeneration", "LlavaOnevisionForConditionalGeneration")
# Architectures whose image rows take 3-D (frame, row, column) rotary positions (M-RoPE).
GRID_POSITIONS = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                  "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                  "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# Where checkpoints keep the tower and the projector: as first published and as transformers
# has saved them since 4.52 (under `model.`); the tower's tensors under `vision_model.` or not
# (transformers 5); Qwen's under `visual.` (or `model.visual.`); Idefics 3's under
# `model.vision_model.` and `model.connector.`.
_PREFIXES = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
             "multi_modal_projector.", "model.image_newline", "image_newline",
             "model.visual.", "visual.", "model.vision_model.", "model.connector.")


PROCESSOR_CONFIG = "preprocessor_config.json"


def reads_images(model_config: Any, directory: str) -> bool:
    """Whether the checkpoint behind this (language model's) config takes images: an
    architecture whose encoder the engine runs, with the image processor's settings (a
    checkpoint without them is served text only, and a line says so)."""
    if getattr(model_config, "multimodal", None) not in ENCODERS:
        return False
    tower = getattr(model_config.multimodal_config.vision_config, "model_type", None)
    if tower not in TOWERS_OF[model_config.multimodal]:
        log.warning("images are not read: the vision tower is of a type tokenmill does not run",
                    extra={"directory": directory, "tower": tower})
        return False
    if os.path.isfile(os.path.join(directory, PROCESSOR_CONFIG)):
        return True
    log.warning("images are not read: the checkpoint has no image processor settings",
                extra={"directory": directory, "missing": PROCESSOR_CONFIG})
    return False


@dataclass(frozen=True)
class ImageTokens:
    """How a model's prompt holds an image: the `marker` token once where the user puts it,
    expanded to `before`, then `per_image` tokens `row` (the encoder's rows take their
    places), then `after`. LLaVA: the marker is the row token, nothing around it; Gemma 3:
    "\\n\\n<start_of_image>", 256 soft tokens, "<end_of_image>\\n\\n". `both_ways`: an image's
    rows attend to each other in both directions (Gemma 3), so a prefill chunk never cuts
    one."""

    marker: int
    row: int
    per_image: int
    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    both_ways: bool = False
    # Mistral 3: each line of an image's row tokens ends with line_end, the last with
    # image_end (None: an image's row tokens are one run).
    line_end: int | None = None
    image_end: int | None = None


def image_tokens(model_config: Any, tokenizer: Any) -> tuple[ImageTokens, str, str]:
    """How the model's prompts hold an image, with the text marker of a text prompt and what
    the model's processor writes in its place."""
    outer = model_config.multimodal_config
    if model_config.multimodal == "Gemma3ForConditionalGeneration":
        return _gemma3_tokens(outer, tokenizer)
    # The other models' marker is their row token, expanded in the ids (the text around it
    # tokenizes alike): by the image's row count, in lines (Mistral 3, Pixtral 12B), between
    # tags (InternVL, Idefics 3), or as LLaVA's fixed count.
    image = llava.image_token_id(outer)
    marker = tokenizer.convert_ids_to_tokens(image)
    if _line_side(model_config):
        line_end, image_end = tokenizer.convert_tokens_to_ids(["[IMG_BREAK]", "[IMG_END]"])
        return ImageTokens(image, image, 0, line_end=line_end, image_end=image_end), marker, marker
    if model_config.multimodal == INTERNVL:  # written out between <img> and </img>
        start, end = tokenizer.convert_tokens_to_ids([
            getattr(tokenizer, "start_image_token", None) or "<img>",
            getattr(tokenizer, "end_image_token", None) or "</img>"])
        return ImageTokens(image, image, 0, (start,), (end,)), marker, marker
    if model_config.multimodal in GRID_POSITIONS:  # written between the vision tokens
        marker = "".join(tokenizer.convert_ids_to_tokens(
            [int(outer.vision_start_token_id), image, int(outer.vision_end_token_id)]))
        return ImageTokens(image, image, 0), marker, marker
    if model_config.multimodal in TILE_TAGGED:  # its tags written per image (image_writer)
        return ImageTokens(image, image, 0), marker, marker
    return ImageTokens(image, image, llava.tokens_per_image(outer)), marker, marker


def _gemma3_tokens(config: Any, tokenizer: Any) -> tuple[ImageTokens, str, str]:
    """Gemma 3's processor writes each `<start_of_image>` as a blank line, itself, the soft
    tokens, `<end_of_image>` and a blank line; the soft tokens see each other both ways."""
    begin, end = int(config.boi_token_index), int(config.eoi_token_index)
    soft, count = int(config.image_token_index), int(config.mm_tokens_per_image)
    blank = tuple(tokenizer.encode("\n\n", add_special_tokens=False))
    text = dict(zip(("begin", "soft", "end"),
                    tokenizer.convert_ids_to_tokens([begin, soft, end]), strict=True))
    expansion = f"\n\n{text['begin']}{text['soft'] * count}{text['end']}\n\n"
    return (ImageTokens(begin, soft, count, (*blank, begin), (end, *blank), both_ways=True),
            text["begin"], expansion)


def image_encoder_weight(name: str) -> str | None:
    """A checkpoint tensor's name in the image encoder, or None for the language model's."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix):].removeprefix("vision_model.")
            return prefix.removeprefix("model.") + rest
    return None


# Processor settings that change the shape of what the vision encoder reads (its patches, how
# they merge, a fixed crop): an encoder reads the shape it was trained on, so no flag or
# request sets them (a request's would fail inside the step it is encoded in).
GEOMETRY_SETTINGS = frozenset({"patch_size", "merge_size", "temporal_patch_size",
                               "spatial_merge_size", "crop_size", "do_center_crop",
                               "do_resize"})


class ImageProcessor:
    """The checkpoint's image processor (preprocessor_config.json), on PIL: an image in, its
    float32 pixel values (and size, where the encoder reads it) out."""

    def __init__(self, directory: str, settings: dict[str, Any] | None = None,
                 **options: Any):
        """settings: the user's changes to preprocessor_config.json (--mm-processor-kwargs;
        ValueError for one the processor has no setting for); options: what the model's full
        processor passes its image processor (Mistral 3's patch, merged 2 x 2)."""
        from transformers import AutoImageProcessor

        settings = dict(settings or {})
        # The user's settings win over the full processor's.
        self.options = {key: value for key, value in options.items() if key not in settings}
        try:
            self._processor = AutoImageProcessor.from_pretrained(directory, backend="pil",
                                                                 **settings)
        except Exception as exc:
            raise ModelLoadError.reading(f"the image processor from {directory}", exc) from exc
        self.checked(settings)
        if getattr(self._processor, "do_pan_and_scan", False):
            log.warning("pan-and-scan crops are not read: each image is read whole",
                        extra={"directory": directory})
            self._processor.do_pan_and_scan = False

    @property
    def _fixed_size(self) -> bool:
        """Whether every image is resized to one height and width with no crop after it
        (Gemma 3's, SigLIP's): then `size` is the encoder's input shape."""
        size = getattr(self._processor, "size", None)
        height = size.get("height") if isinstance(size, dict) else getattr(size, "height", None)
        return height is not None and not getattr(self._processor, "do_center_crop", False)

    def checked(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Settings for one call (a request's mm_processor_kwargs) as the processor takes them
        (Qwen-VL's min_pixels and max_pixels as the size they bound); ValueError for one it
        has no setting for, or one asking for what is not read."""
        known = getattr(getattr(self._processor, "valid_kwargs", None), "__annotations__", None)
        unknown = sorted(set(settings) - set(known)) if known is not None else []
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a setting of the checkpoint's image "
                             f"processor ({type(self._processor).__name__}); its settings: "
                             f"{', '.join(sorted(known))}")
        if settings.get("do_pan_and_scan"):
            raise ValueError("do_pan_and_scan: pan-and-scan crops are not read; each image is "
                             "read whole")
        fixed = sorted(key for key in settings if key in GEOMETRY_SETTINGS
                       or (key == "size" and self._fixed_size))
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: sets the shape of what the vision encoder "
                             "reads, which is the one it was trained on")
        pixels = {key: settings[key] for key in ("min_pixels", "max_pixels") if key in settings}
        size = getattr(self._processor, "size", None)
        if pixels and getattr(size, "longest_edge", None) is not None:
            settings = {key: value for key, value in settings.items() if key not in pixels}
            settings["size"] = {
                "shortest_edge": pixels.get("min_pixels", size.shortest_edge),
                "longest_edge": pixels.get("max_pixels", size.longest_edge)}
        return settings

    def __call__(self, image: Any, **settings: Any) -> tuple[torch.Tensor, tuple[int, ...] | None]:
        """The image's pixel values (float32), and its size where the encoder reads it
        (LLaVA-NeXT's and Mistral 3's processors report it), or its patch grid (frames,
        height, width: Qwen's processor cuts the image into a grid of patches)."""
        out = self._processor(images=[rgb(image)], return_tensors="pt",
                              **{**self.options, **settings})
        grid = out.get("image_grid_thw")
        if grid is not None:  # every patch of the one image, [patches, patch pixels]
            return out["pixel_values"].float(), tuple(int(n) for n in grid[0])
        if "rows" in out:  # Idefics 3's tiles, then the whole image: [tiles + 1, 3, S, S]
            return out["pixel_values"][0].float(), (int(out["rows"][0][0]),
                                                    int(out["cols"][0][0]))
        tiles = out.get("num_patches")
        if tiles is not None:  # InternVL's tiles of the one image, [tiles, 3, S, S]
            return out["pixel_values"].float(), (int(tiles[0]),)
        size = out.get("image_sizes")
        return out["pixel_values"][0].float(), None if size is None else \
            tuple(int(n) for n in size[0])

    def largest(self) -> Any:
        """A PIL image of the size that makes the most rows, as far as the processor's
        settings tell: Qwen-VL's and Pixtral's and Idefics 3's longest edge (Qwen-VL's in
        pixels), LLaVA-NeXT's largest grid resolution, InternVL's most tiles in a row; any
        image for a processor that resizes every image alike."""
        from PIL import Image

        processor = self._processor
        size = getattr(processor, "size", None)
        longest = getattr(size, "longest_edge", None)
        tile = getattr(size, "height", None) or getattr(size, "shortest_edge", None) or 336
        if getattr(processor, "merge_size", None) and longest:  # Qwen-VL: a pixel count
            factor = int(processor.patch_size) * int(processor.merge_size)
            sides = [(side, int(longest) // side // factor * factor)
                     for side in range(factor, int(longest ** 0.5) + 1, factor)]
            height, width = max(sides or [(factor, factor)], key=lambda hw: hw[0] * hw[1])
        elif getattr(processor, "image_grid_pinpoints", None):
            height, width = max(processor.image_grid_pinpoints, key=lambda hw: hw[0] * hw[1])
        elif self.options.get("crop_to_patches"):
            height, width = tile, tile * int(getattr(processor, "max_patches", 1))
        elif longest:
            height = width = int(longest)
        else:
            height = width = int(tile)
        return Image.new("RGB", (int(width), int(height)), (127, 127, 127))

    def several(self, images: list[Any],
                **settings: Any) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        """The images of one prompt that holds several, processed as one prompt's
        (LLaVA-OneVision's processor then reads each whole, without tiles): each one's pixel
        values and size."""
        out = self._processor(images=[[rgb(image) for image in images]],
                              return_tensors="pt", **{**self.options, **settings})
        return [(pixels.float(), tuple(int(n) for n in size))
                for pixels, size in zip(out["pixel_values"], out["image_sizes"], strict=True)]


def _line_side(model_config: Any) -> int:
    """The pixels a row covers along each side where Pixtral's tower reads the image and the
    prompt holds its rows line by line (Mistral 3: a patch, merged 2 x 2; Pixtral 12B: a
    patch); 0 for the other models."""
    outer = model_config.multimodal_config
    if model_config.multimodal == "Mistral3ForConditionalGeneration":
        return outer.vision_config.patch_size * outer.spatial_merge_size
    if getattr(outer.vision_config, "model_type", None) == "pixtral":
        return outer.vision_config.patch_size
    return 0


def rgb(image: Any) -> Any:
    """A PIL image in RGB from what vLLM's offline API takes as one: a PIL image, or an array
    (numpy or torch) of height x width x channels uint8 pixels (1, 3 or 4 channels)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    shape = getattr(image, "shape", None)
    if shape is None or len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3, 4)):
        raise ValueError(f"an image is a PIL image or an array of height x width x channels "
                         f"(1, 3 or 4), not {type(image).__name__}"
                         + (f" of shape {tuple(shape)}" if shape is not None else ""))
    if str(image.dtype) != "uint8":
        raise ValueError(f"an image array holds uint8 pixels, not {image.dtype}")
    array = image[:, :, 0] if len(shape) == 3 and shape[2] == 1 else image
    return Image.fromarray(array).convert("RGB")


def image_layout(model_config: Any) -> Any:
    """(rows, rows per line) of an image of a given size, where they vary (LLaVA-NeXT, whose
    rows are one run: line None; Mistral 3, line by line); None where every image takes
    ImageTokens.per_image rows in one run."""
    outer = model_config.multimodal_config
    side = _line_side(model_config)
    if side:

        def lines(size: tuple[int, int]) -> tuple[int, int]:
            return (size[0] // side) * (size[1] // side), size[1] // side

        return lines
    if model_config.multimodal in GRID_POSITIONS:
        return lambda grid: (qwen_vision.rows_of(outer, grid), None)
    if model_config.multimodal == INTERNVL:  # its size: how many tiles the processor cut
        return lambda tiles: (rows_per_tile(outer) * tiles[0], None)
    if model_config.multimodal in TILE_TAGGED:  # its size: the grid of tiles, (0, 0): none
        return lambda grid: (idefics3_images.rows_per_tile(outer) * (grid[0] * grid[1] + 1),
                             None)
    if model_config.multimodal not in TILED:
        return None
    with torch.device("meta"):
        encoder = ENCODERS[model_config.multimodal](outer)
    return lambda size: (encoder.image_rows(size), None)


def image_grid(model_config: Any) -> Any:
    """The (frames, height, width) extent of the rows of an image of a given patch grid,
    where the model gives image rows 3-D rotary positions; None where it does not."""
    if model_config.multimodal not in GRID_POSITIONS:
        return None
    return lambda grid: qwen_vision.row_grid(model_config.multimodal_config, grid)


def image_writer(model_config: Any, tokenizer: Any) -> Any:
    """An image's tokens as the processor writes them, from its size, where they follow it
    (Idefics 3's grid of tiles); None for the other models."""
    if model_config.multimodal not in TILE_TAGGED:
        return None
    outer = model_config.multimodal_config
    return lambda grid: tokenizer.encode(idefics3_images.image_text(outer, tokenizer, grid),
                                         add_special_tokens=False)


def reads_several_apart(model_config: Any) -> bool:
    """Whether the encoder reads an image differently when its prompt holds several
    (LLaVA-OneVision: its base view alone)."""
    return model_config.multimodal == "LlavaOnevisionForConditionalGeneration"


def batches_images(encoder: nn.Module) -> bool:
    """Whether the encoder takes a step's images in one batch (those of a fixed size), not
    one at a time."""
    return not isinstance(encoder, (LlavaNextImageEncoder, QwenImageEncoder,
                                    Mistral3ImageEncoder, PixtralImageEncoder,
                                    InternVLImageEncoder, Idefics3ImageEncoder))


def encode_images(encoder: nn.Module, pixels: list[torch.Tensor],
                  sizes: list[tuple[int, int] | None]) -> list[torch.Tensor]:
    """Each image's rows: in one batch where the encoder batches them, else one image at a
    time (views, patches or tiles that differ in number or size)."""
    if batches_images(encoder):
        return list(encoder(torch.stack(pixels)))
    if isinstance(encoder, (LlavaNextImageEncoder, QwenImageEncoder)):
        return [encoder(p, size) for p, size in zip(pixels, sizes, strict=True)]
    if isinstance(encoder, (Mistral3ImageEncoder, PixtralImageEncoder)):  # at its own size
        return [encoder(p[:, :size[0], :size[1]]) for p, size in zip(pixels, sizes, strict=True)]
    return [encoder(p) for p in pixels]  # InternVL's and Idefics 3's tiles


def image_processor(directory: str, model_config: Any,
                    settings: dict[str, Any] | None = None) -> ImageProcessor:
    """The checkpoint's image processor with the user's settings (--mm-processor-kwargs)."""
    side = _line_side(model_config) \
        if model_config.multimodal == "Mistral3ForConditionalGeneration" else 0
    options = {"patch_size": {"height": side, "width": side}} if side else {}
    if model_config.multimodal == INTERNVL:
        options["crop_to_patches"] = True
    if model_config.multimodal in TILE_TAGGED:
        options["return_row_col_info"] = True
    return _processor(directory, json.dumps(options, sort_keys=True),
                      json.dumps(settings or {}, sort_keys=True))


@functools.lru_cache(maxsize=4)
def _processor(directory: str, options: str, settings: str) -> ImageProcessor:
    """options: what the model's full processor passes its image processor (the patch it
    sizes images by, Mistral 3's merged 2 x 2; InternVL's cutting into tiles; Idefics 3's
    asking for the grid); settings: the user's. Both as JSON (keys of the cache)."""
    return ImageProcessor(directory, json.loads(settings), **json.loads(options))


def build_image_encoder(model_config: Any, source: ModelSource, dtype: torch.dtype,
                        device: torch.device) -> nn.Module:
    """The image encoder, its weights read from the checkpoint (the tower's layers past the
    one read are not)."""
    outer = model_config.multimodal_config
    kind = PixtralImageEncoder if model_config.multimodal == "LlavaForConditionalGeneration" \
        and outer.vision_config.model_type == "pixtral" else ENCODERS[model_config.multimodal]
    with torch.device("meta"):
        encoder = kind(outer)
    encoder = encoder.to(dtype=dtype).to_empty(device=device)
    params = dict(encoder.named_parameters())
    loaded = set()
    with Checkpoint(source.directory) as checkpoint:
        for tensor in checkpoint.tensors:
            name = image_encoder_weight(tensor.name)
            if name is None or name not in params:
                continue
            stored = checkpoint.slice(tensor)[:]
            if tuple(stored.shape) != tuple(params[name].shape):
                raise ModelLoadError(f"{tensor.name}: checkpoint shape {tuple(stored.shape)} "
                                     f"!= image encoder shape {tuple(params[name].shape)}")
            with torch.no_grad():
                params[name].copy_(stored)
            loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} image encoder tensors, e.g. "
                             f"{missing[:5]}")
    return encoder.eval()
