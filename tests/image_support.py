"""A random-weight LLaVA checkpoint as transformers saves one (tokenizer with an `<image>`
token, a LLaVA-style chat template, the image processor's settings), drawn images, and
transformers' own answers on them: the reference of the image tests."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import torch
from model_support import make_random_model

IMAGE_TOKEN = "<image>"
# LLaVA's template shape: an image part prints the placeholder, then a line.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>\n"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
IMAGE_SIZE, PATCH = 28, 7  # 16 patches an image


def llava_tokenizer(tokenizer):
    """The tokenizer with LLaVA's placeholder token added and its chat template."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_llava(directory: str, tokenizer, tower: str = "clip") -> str:
    """A LLaVA checkpoint over a small Llama: CLIP's tower read at its second-to-last layer
    with the class token dropped (LLaVA 1.5's settings), or SigLIP's read at two layers
    concatenated, every row kept."""
    import transformers

    tokenizer = llava_tokenizer(tokenizer)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH,
                  model_type="clip_vision_model" if tower == "clip" else "siglip_vision_model")
    text = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=64,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    layers = dict(vision_feature_layer=-2, vision_feature_select_strategy="default") \
        if tower == "clip" else dict(vision_feature_layer=[-1, -3],
                                     vision_feature_select_strategy="full")
    config = transformers.LlavaConfig(
        text_config=text, vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), **layers)
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(directory)
    return directory


def drawn_image(seed: int, size: tuple[int, int] = (40, 52)):
    """A PIL image of random pixels (its aspect differs from the model's square crop)."""
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class HFLlava:
    """transformers' LLaVA on a checkpoint, with its own image processor (not the engine's)."""

    def __init__(self, directory: str):
        self._load(directory)
        config = self.model.config
        self.placeholder = config.image_token_id
        vision = config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        self.per_image = patches + int(vision.model_type == "clip_vision_model") - int(
            getattr(config, "vision_feature_select_strategy", None) == "default")

    def _load(self, directory: str) -> None:
        """transformers' model, image processor and tokenizer of the checkpoint."""
        import transformers

        self.model = transformers.AutoModelForImageTextToText.from_pretrained(
            directory, dtype=torch.float32).eval()
        self.processor = transformers.AutoImageProcessor.from_pretrained(directory)
        self.tokenizer = transformers_tokenizer(directory)

    def expand(self, ids: list[int]) -> list[int]:
        """Each placeholder made per_image tokens, as LLaVA's processor writes the prompt."""
        out = []
        for t in ids:
            out += [t] * self.per_image if t == self.placeholder else [t]
        return out

    writes_text = False  # LLaVA's markers are expanded in the ids

    def written(self, text: str) -> str:
        """A text prompt as the processor writes it before tokenizing."""
        return text

    def _inputs(self, ids: list[int], pixels: dict) -> dict:
        """What the model takes beside the ids: the pixels."""
        return pixels

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        """The prompt with each marker written out for its image."""
        return self.expand(ids)

    def image_inputs(self, images: list) -> dict:
        """The model's image arguments, from its image processor."""
        return {"pixel_values": self.processor(images=images, return_tensors="pt")[
            "pixel_values"]}

    def greedy(self, ids: list[int], images: list, max_new: int,
               expanded: bool = False) -> tuple[list[int], list[float]]:
        """The greedy continuation of the prompt with its images (markers `expanded` already,
        or not), and each token's log-probability."""
        prompt = list(ids) if expanded or not images else self.expand_images(ids, images)
        pixels = self.image_inputs(images) if images else {}
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt]), max_new_tokens=max_new,
                                      do_sample=False, pad_token_id=0,
                                      **self._inputs(prompt, pixels))
            tokens = out[0, len(prompt):].tolist()
            logits = self.model(input_ids=torch.tensor([prompt + tokens]),
                                **self._inputs(prompt + tokens, pixels)).logits[0].log_softmax(-1)
        return tokens, [logits[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


GEMMA_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
GEMMA_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<start_of_image>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def gemma3_tokenizer(tokenizer):
    """The tokenizer with Gemma 3's image tokens added and a Gemma-style chat template."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA_TOKENS)})
    tokenizer.chat_template = GEMMA_TEMPLATE
    return tokenizer


def make_gemma3(directory: str, tokenizer) -> str:
    """A Gemma 3 checkpoint: SigLIP's tower (4 x 4 patches averaged to 4 rows an image) over
    a small Gemma 3 text model with sliding and full layers."""
    import transformers

    tokenizer = gemma3_tokenizer(tokenizer)
    begin, soft, end = tokenizer.convert_tokens_to_ids(list(GEMMA_TOKENS))
    config = transformers.Gemma3Config(
        text_config=dict(model_type="gemma3_text", vocab_size=len(tokenizer), hidden_size=64,
                         intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         sliding_window=16, query_pre_attn_scalar=24, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0,
                         layer_types=["sliding_attention", "full_attention",
                                      "sliding_attention"]),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                           intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=IMAGE_SIZE, patch_size=PATCH),
        mm_tokens_per_image=4, image_token_index=soft, boi_token_index=begin,
        eoi_token_index=end)
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.Gemma3ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(directory)
    return directory


class HFGemma3(HFLlava):
    """transformers' Gemma 3 on a checkpoint: its processor's expansion of each
    `<start_of_image>` and the token types that let an image's rows see each other."""

    def __init__(self, directory: str):
        super().__init__(directory)
        config = self.model.config
        self.placeholder, self.soft = config.boi_token_index, config.image_token_index
        self.end, self.per_image = config.eoi_token_index, config.mm_tokens_per_image

    writes_text = True

    def written(self, text: str) -> str:
        """As Gemma 3's processor writes each `<start_of_image>` out."""
        begin, soft, end = GEMMA_TOKENS
        return text.replace(begin, f"\n\n{begin}{soft * self.per_image}{end}\n\n")

    def expand(self, ids: list[int]) -> list[int]:
        blank = self.tokenizer.encode("\n\n", add_special_tokens=False)
        out = []
        for t in ids:
            out += ([*blank, t, *[self.soft] * self.per_image, self.end, *blank]
                    if t == self.placeholder else [t])
        return out

    def _inputs(self, ids: list[int], pixels: dict) -> dict:
        types = (torch.tensor([ids]) == self.soft).long()
        return {**pixels, "token_type_ids": types} if pixels else pixels


def transformers_tokenizer(directory: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def small_qwen2(vocab: int) -> dict:
    """The text config of a small Qwen2 language model."""
    return dict(model_type="qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def make_llava_next(directory: str, tokenizer) -> str:
    """A LLaVA-NeXT checkpoint: CLIP's tower over a small Qwen2, images cut into a base view and
    the tiles of one of three grid resolutions, as its processor chooses by the image's
    size."""
    import transformers

    tokenizer = llava_tokenizer(tokenizer)
    config = transformers.LlavaNextConfig(
        text_config=small_qwen2(len(tokenizer)),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE_SIZE,
                           patch_size=PATCH, projection_dim=32),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_grid_pinpoints=GRID)
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.LlavaNextImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=GRID).save_pretrained(directory)
    return directory


GRID = [[IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE],
        [2 * IMAGE_SIZE, 2 * IMAGE_SIZE]]


class HFLlavaNext(HFLlava):
    """transformers' LLaVA-NeXT, each image's rows counted by its own processor."""

    def __init__(self, directory: str):
        from transformers import LlavaNextProcessor

        super().__init__(directory)
        config = self.model.config
        self.full = LlavaNextProcessor(
            image_processor=self.processor, tokenizer=self.tokenizer,
            patch_size=config.vision_config.patch_size,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            num_additional_image_tokens=1)

    def rows(self, image) -> int:
        ids = self.full(text=IMAGE_TOKEN, images=[image], return_tensors="pt")["input_ids"][0]
        return int((ids == self.placeholder).sum())

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        pending, prompt = iter(images), []
        for t in ids:
            prompt += [t] * self.rows(next(pending)) if t == self.placeholder else [t]
        return prompt

    def image_inputs(self, images: list) -> dict:
        out = self.processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}


MISTRAL_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")


def make_mistral3(directory: str, tokenizer, pixtral_12b: bool = False,
                  ministral3: bool = False) -> str:
    """A Mistral 3 checkpoint: Pixtral's tower (2-D rotary, 7-pixel patches merged 2 x 2) over
    a small Mistral, images read at their own size up to 56 pixels a side; or Pixtral 12B's
    layout (LLaVA over Pixtral's tower: a row per patch, nothing merged); or, with
    `ministral3`, Ministral 3's (its queries scaled by position past a context of 8)."""
    import transformers

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MISTRAL_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<image>", "[IMG]")
    parts = dict(
        text_config=dict(model_type="ministral3" if ministral3 else "mistral",
                         vocab_size=len(tokenizer), hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         **({"rope_parameters": {
                             "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                             "original_max_position_embeddings": 8,
                             "llama_4_scaling_beta": 0.5}} if ministral3 else {})),
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                           image_size=56, patch_size=PATCH),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"))
    config = transformers.LlavaConfig(
        **parts, vision_feature_layer=-1, vision_feature_select_strategy="full") \
        if pixtral_12b else transformers.Mistral3Config(**parts, spatial_merge_size=2)
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.PixtralImageProcessorPil(
        size={"longest_edge": 56}, patch_size={"height": PATCH, "width": PATCH}
    ).save_pretrained(directory)
    return directory


class HFMistral3(HFLlava):
    """transformers' Mistral 3 with its image processor; each image's tokens written out as
    its processor's description says (lines of [IMG] ended by [IMG_BREAK], the last by
    [IMG_END]), since its full processor needs torchvision."""

    def __init__(self, directory: str):
        super().__init__(directory)
        config = self.model.config
        self.side = config.vision_config.patch_size * getattr(config, "spatial_merge_size", 1)
        self.marks = self.tokenizer.convert_tokens_to_ids(list(MISTRAL_TOKENS))

    def image_inputs(self, images: list) -> dict:
        out = self.processor(images=images, return_tensors="pt",
                             patch_size={"height": self.side, "width": self.side})
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        image, line_end, image_end = self.marks
        sizes, pending, prompt = self.image_inputs(images)["image_sizes"].tolist(), 0, []
        for t in ids:
            if t != image:
                prompt.append(t)
                continue
            height, width = (side // self.side for side in sizes[pending])
            lines = [[image] * width + [line_end] for _ in range(height)]
            lines[-1][-1] = image_end
            prompt += [t for line in lines for t in line]
            pending += 1
        return prompt


QWEN_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
# Qwen2-VL's template shape: an image part prints its three tokens.
QWEN_TEMPLATE = CHAT_TEMPLATE.replace("<image>\n", "".join(QWEN_TOKENS))


def make_qwen_vl(directory: str, tokenizer, kind: str = "qwen2_vl") -> str:
    """A Qwen2-VL (or Qwen2.5-VL: RMSNorm, gated MLP, windows of 2 x 2 merged blocks with one
    block over the whole image; or Qwen3-VL: a learned 4 x 4 position table, DeepStack, over
    a Qwen3, or Qwen3-VL-MoE over experts; or Qwen3.5: that tower without DeepStack over
    Qwen3.5's layers) checkpoint: 7-pixel patches merged 2 x 2, images
    read at their own size up to 56 x 70 pixels, over a small language model whose rotary
    frequencies split 2 / 3 / 3 between frame, row and column."""
    import transformers

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_TOKENS)})
    tokenizer.chat_template = QWEN_TEMPLATE
    start, image, end = tokenizer.convert_tokens_to_ids(list(QWEN_TOKENS))
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                # A small base: every frequency turns far enough for a wrong axis to show.
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                 "rope_theta": 100.0})
    vision = dict(depth=3, num_heads=2, patch_size=PATCH, spatial_merge_size=2,
                  temporal_patch_size=2)
    ids = dict(image_token_id=image, vision_start_token_id=start, vision_end_token_id=end,
               video_token_id=image + 1000)
    if kind == "qwen2_vl":
        config = transformers.Qwen2VLConfig(
            text_config=text, vision_config=dict(vision, embed_dim=32, hidden_size=64,
                                                 mlp_ratio=2), **ids)
    elif kind.startswith("qwen3_vl"):  # interleaved; DeepStack rows after blocks 0 and 1
        text["rope_parameters"]["mrope_interleaved"] = True
        text["head_dim"] = 16
        if kind == "qwen3_vl_moe":
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
        outer = transformers.Qwen3VLMoeConfig if kind == "qwen3_vl_moe" else \
            transformers.Qwen3VLConfig
        config = outer(
            text_config=text, vision_config=dict(
                vision, hidden_size=32, intermediate_size=48, out_hidden_size=64,
                num_position_embeddings=16, deepstack_visual_indexes=[0, 1]), **ids)
    elif kind == "qwen3_5":  # Qwen3.5: Qwen3-VL's tower without DeepStack, over gated
        # delta nets and gated attention turning whole heads
        from qwen3_5_support import LAYERS

        text["rope_parameters"].update(mrope_interleaved=True, partial_rotary_factor=1.0)
        text.update(head_dim=16, num_hidden_layers=4, layer_types=LAYERS,
                    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4)
        config = transformers.Qwen3_5Config(
            text_config=text, vision_config=dict(
                vision, hidden_size=32, intermediate_size=48, out_hidden_size=64,
                num_position_embeddings=16), **ids)
    else:
        config = transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=dict(
                vision, hidden_size=32, intermediate_size=48, out_hidden_size=64,
                window_size=4 * PATCH, fullatt_block_indexes=[1]), **ids)
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.Qwen2VLImageProcessorPil(
        patch_size=PATCH, merge_size=2, temporal_patch_size=2,
        size={"shortest_edge": 28 * 28, "longest_edge": 56 * 70}).save_pretrained(directory)
    return directory


class HFQwenVL(HFLlava):
    """transformers' Qwen2-VL / Qwen2.5-VL with its image processor; each image's
    `<|image_pad|>` written out once per merged row, as its processor does, and the token
    types its 3-D positions are computed from."""

    def __init__(self, directory: str):
        self._load(directory)
        self.placeholder = self.model.config.image_token_id
        self.merge = self.model.config.vision_config.spatial_merge_size

    def image_inputs(self, images: list) -> dict:
        out = self.processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        grids = iter(self.image_inputs(images)["image_grid_thw"].tolist())
        prompt = []
        for t in ids:
            rows = math.prod(next(grids)) // self.merge ** 2 if t == self.placeholder else 1
            prompt += [t] * rows
        return prompt

    def expand(self, ids: list[int]) -> list[int]:
        raise NotImplementedError("Qwen's rows per image follow the image's size")

    def _inputs(self, ids: list[int], pixels: dict) -> dict:
        types = (torch.tensor([ids]) == self.placeholder).int()
        return {**pixels, "mm_token_type_ids": types} if pixels else pixels


def make_llava_onevision(directory: str, tokenizer) -> str:
    """A LLaVA-OneVision checkpoint: SigLIP's tower over a small Qwen2, one image of a prompt
    cut into tiles as LLaVA-NeXT's are, its grid shrunk past one view's worth of rows
    ("anyres_max_1"); several images of a prompt read whole."""
    import transformers

    tokenizer = llava_tokenizer(tokenizer)
    config = transformers.LlavaOnevisionConfig(
        text_config=small_qwen2(len(tokenizer)),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                           intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=IMAGE_SIZE, patch_size=PATCH),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_grid_pinpoints=GRID, vision_aspect_ratio="anyres_max_1",
        vision_feature_select_strategy="full", vision_feature_layer=-1)
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.LlavaOnevisionImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=GRID).save_pretrained(directory)
    return directory


class HFLlavaOnevision(HFLlava):
    """transformers' LLaVA-OneVision: its image processor given each prompt's images as one
    prompt's, and its processor's own rule for each image's row count (the full processor
    needs torchvision for its video half)."""

    def __init__(self, directory: str):
        import functools
        import types

        from transformers import LlavaOnevisionProcessor

        super().__init__(directory)
        config = self.model.config
        side = config.vision_config.image_size // config.vision_config.patch_size
        counter = types.SimpleNamespace(
            image_processor=self.processor, num_image_tokens=side * side, image_token="x",
            vision_aspect_ratio=config.vision_aspect_ratio,
            vision_feature_select_strategy=config.vision_feature_select_strategy)
        counter._get_unpadded_features = functools.partial(
            LlavaOnevisionProcessor._get_unpadded_features, counter)
        counter._get_number_of_features = functools.partial(
            LlavaOnevisionProcessor._get_number_of_features, counter)
        self.rows = functools.partial(LlavaOnevisionProcessor.replace_image_token, counter)

    def image_inputs(self, images: list) -> dict:
        out = self.processor(images=[images], return_tensors="pt")
        return {name: out[name] for name in ("pixel_values", "image_sizes", "batch_num_images")}

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        inputs, pending, prompt = self.image_inputs(images), 0, []
        for t in ids:
            if t != self.placeholder:
                prompt.append(t)
                continue
            prompt += [t] * len(self.rows(inputs, pending))
            pending += 1
        return prompt


INTERNVL_TOKENS = ("<img>", "<IMG_CONTEXT>", "</img>")


def make_internvl(directory: str, tokenizer) -> str:
    """An InternVL checkpoint: InternViT (7-pixel patches of 28-pixel tiles, RMSNorm with
    q/k norms, as InternViT-6B) over a small Qwen2; an image cut into up to four tiles and a
    thumbnail, each tile's 4 x 4 patches folded into 2 x 2 rows."""
    import transformers

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(INTERNVL_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<image>", "<IMG_CONTEXT>")
    config = transformers.InternVLConfig(
        text_config=small_qwen2(len(tokenizer)),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=[IMAGE_SIZE, IMAGE_SIZE],
                           patch_size=[PATCH, PATCH], norm_type="rms_norm", use_qk_norm=True),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"))
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    transformers.GotOcr2ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, max_patches=4).save_pretrained(directory)
    return directory


class HFInternVL(HFLlava):
    """transformers' InternVL with its image processor cutting tiles as its full processor
    asks; each image written out as `<img>`, 4 rows a tile, `</img>`, as its processor does."""

    def __init__(self, directory: str):
        self._load(directory)
        self.placeholder = self.model.config.image_token_id
        self.start, self.end = self.tokenizer.convert_tokens_to_ids(["<img>", "</img>"])

    def image_inputs(self, images: list) -> dict:
        return {"pixel_values": self.processor(images=images, return_tensors="pt",
                                               crop_to_patches=True)["pixel_values"]}

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        tiles = iter(self.processor(images=images, return_tensors="pt",
                                    crop_to_patches=True)["num_patches"].tolist())
        prompt = []
        for t in ids:
            prompt += [self.start, *[t] * (4 * next(tiles)), self.end] \
                if t == self.placeholder else [t]
        return prompt


IDEFICS_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))


def make_idefics3(directory: str, tokenizer, smolvlm: bool = False) -> str:
    """An Idefics 3 (or SmolVLM) checkpoint: a SigLIP-like tower over a small Llama, an image
    resized to at most 56 pixels and cut into 28-pixel tiles plus the whole shrunk to one,
    each tile's 4 x 4 patches folded into 2 x 2 rows."""
    import transformers

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(IDEFICS_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    kind = "smolvlm" if smolvlm else "idefics3"
    outer = transformers.SmolVLMConfig if smolvlm else transformers.Idefics3Config
    config = outer(
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0),
        vision_config=dict(model_type=f"{kind}_vision", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE_SIZE,
                           patch_size=PATCH),
        scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    make_random_model(directory, config, tokenizer, draw_norms=True,
                      auto_class="AutoModelForImageTextToText")
    processor = transformers.SmolVLMImageProcessorPil if smolvlm else \
        transformers.Idefics3ImageProcessorPil
    processor(size={"longest_edge": 2 * IMAGE_SIZE},
              max_image_size={"longest_edge": IMAGE_SIZE}).save_pretrained(directory)
    return directory


class HFIdefics3(HFLlava):
    """transformers' Idefics 3 / SmolVLM with its image processor; each image written out with
    its processor's own prompt string for its grid of tiles."""

    def __init__(self, directory: str):
        self._load(directory)
        self.placeholder = self.model.config.image_token_id

    def image_inputs(self, images: list) -> dict:
        out = self.processor(images=[images], return_tensors="pt", return_row_col_info=True)
        assert bool(out["pixel_attention_mask"].all())  # whole tiles only
        return {"pixel_values": out["pixel_values"],
                "pixel_attention_mask": out["pixel_attention_mask"]}

    def expand_images(self, ids: list[int], images: list) -> list[int]:
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

        out = self.processor(images=[images], return_tensors="pt", return_row_col_info=True)
        grids, prompt = iter(zip(out["rows"][0], out["cols"][0], strict=True)), []
        for t in ids:
            if t != self.placeholder:
                prompt.append(t)
                continue
            rows, cols = next(grids)
            text = get_image_prompt_string(rows, cols, 4, "<fake_token_around_image>",
                                           "<image>", "<global-img>")
            prompt += self.tokenizer.encode(text, add_special_tokens=False)
        return prompt
