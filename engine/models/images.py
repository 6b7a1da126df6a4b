"""Images in prompts: which checkpoints read them, the checkpoint's own image processor
(pixels resized, cropped and normalized as the model was trained), and its image encoder,
whose rows take the places of an image's placeholder tokens."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

from tokenmill.engine.models import llava
from tokenmill.engine.models.llava import LlavaImageEncoder, image_encoder_weight
from tokenmill.engine.models.safetensors_files import Checkpoint
from tokenmill.engine.models.source import ModelLoadError, ModelSource

log = logging.getLogger(__name__)

# Multimodal architectures whose images the engine reads; the others serve text only.
READS_IMAGES = ("LlavaForConditionalGeneration",)


PROCESSOR_CONFIG = "preprocessor_config.json"


def reads_images(model_config: Any, directory: str) -> bool:
    """Whether the checkpoint behind this (language model's) config takes images: an
    architecture whose encoder the engine runs, with the image processor's settings (a
    checkpoint without them is served text only, and a line says so)."""
    if getattr(model_config, "multimodal", None) not in READS_IMAGES:
        return False
    if os.path.isfile(os.path.join(directory, PROCESSOR_CONFIG)):
        return True
    log.warning("images are not read: the checkpoint has no image processor settings",
                extra={"directory": directory, "missing": PROCESSOR_CONFIG})
    return False


def image_token_id(model_config: Any) -> int:
    """The placeholder token an image's rows replace."""
    return llava.image_token_id(model_config.multimodal_config)


def tokens_per_image(model_config: Any) -> int:
    """How many placeholder tokens (encoder rows) one image takes."""
    return llava.tokens_per_image(model_config.multimodal_config)


class ImageProcessor:
    """The checkpoint's image processor (preprocessor_config.json), on PIL: an image in,
    float32 pixel values [3, H, W] out."""

    def __init__(self, directory: str):
        from transformers import AutoImageProcessor

        try:
            self._processor = AutoImageProcessor.from_pretrained(directory, backend="pil")
        except Exception as exc:
            raise ModelLoadError.reading(f"the image processor from {directory}", exc) from exc

    def __call__(self, image: Any) -> torch.Tensor:
        pixels = self._processor(images=[image.convert("RGB")], return_tensors="pt")
        return pixels["pixel_values"][0].float()


@functools.lru_cache(maxsize=4)
def image_processor(directory: str) -> ImageProcessor:
    return ImageProcessor(directory)


def build_image_encoder(model_config: Any, source: ModelSource, dtype: torch.dtype,
                        device: torch.device) -> LlavaImageEncoder:
    """The image encoder, its weights read from the checkpoint (the tower's layers past the
    one read are not)."""
    with torch.device("meta"):
        encoder = LlavaImageEncoder(model_config.multimodal_config)
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
