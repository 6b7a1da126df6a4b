"""The vision transformer that turns an image into patch features: CLIP's (a class token and a
norm before the first layer) and SigLIP's (neither; biased patch projection). Modules carry the
checkpoints' names (`embeddings.patch_embedding`, `encoder.layers.N.self_attn.q_proj`, ...),
so a tower's tensors load by name. Only the layers up to the one whose output is read are
built: LLaVA reads the second-to-last."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.models.source import ModelLoadError

CLIP = "clip_vision_model"
SIGLIP = "siglip_vision_model"
TOWERS = (CLIP, SIGLIP)
# Towers that are SigLIP's under other names (Idefics 3's, SmolVLM's).
SIGLIP_LIKE = ("idefics3_vision", "smolvlm_vision")


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {"quick_gelu": _quick_gelu,
               "gelu": F.gelu,
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "silu": F.silu}


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x over the root mean square of its last dimension, in float32 (the norms' weights
    apply after, each model its own way)."""
    h = x.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """weight * x over its root mean square, normalized in float32 (the vision towers' and
    their projectors' norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalized(x, self.eps).to(x.dtype)


def activation(name: str, where: str) -> Any:
    """The activation a config names; ModelLoadError naming the setting otherwise."""
    if name not in ACTIVATIONS:
        raise ModelLoadError(f"{where} {name!r} is not supported; tokenmill runs "
                             f"{', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def pixel_shuffle(features: torch.Tensor, fold: int) -> torch.Tensor:
    """[n, side, side, C] -> [n, side / fold, side / fold, C * fold^2]: each fold x fold block
    of patch features folded into one, in the order InternVL and Idefics 3 concatenate the
    block's channels."""
    n, side, _, channels = features.shape
    x = features.reshape(n, side, side // fold, channels * fold).permute(0, 2, 1, 3)
    x = x.reshape(n, side // fold, side // fold, channels * fold * fold)
    return x.permute(0, 2, 1, 3)


class PatchEmbeddings(nn.Module):
    def __init__(self, config: Any, class_token: bool):
        super().__init__()
        dim, patch = config.hidden_size, config.patch_size
        self.patch_size = patch
        self.class_embedding = nn.Parameter(torch.empty(dim)) if class_token else None
        self.patch_embedding = nn.Conv2d(config.num_channels, dim, kernel_size=patch,
                                         stride=patch, bias=not class_token)
        positions = (config.image_size // patch) ** 2 + int(class_token)
        self.position_embedding = nn.Embedding(positions, dim)

    def forward(self, pixel_values: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """positions: each patch's row of the position table (default: its index)."""
        weight = self.patch_embedding.weight
        x = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        if x.shape[1] != self.position_embedding.num_embeddings:
            raise ValueError(f"an image of {x.shape[1]} patches; the tower was trained on "
                             f"{self.position_embedding.num_embeddings}")
        if positions is not None:
            return x + self.position_embedding(positions.to(x.device))
        return x + self.position_embedding.weight


class VisionAttention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim)
                                                                for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)),
                                             heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))


class VisionMLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.act = activation(config.hidden_act, "vision hidden_act")
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionLayer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        eps = config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    """`encoder.layers` holds the first `num_layers` layers of the checkpoint's."""

    def __init__(self, config: Any, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(config) for _ in range(num_layers))


class VisionTransformer(nn.Module):
    """`forward` returns the hidden states (after the embeddings, then after each layer) at
    the indices asked for, as transformers numbers them in `hidden_states` (0: the embeddings,
    -1: the last layer's output, before the final norm unless `final_norm`)."""

    def __init__(self, config: Any, read_layers: list[int], final_norm: bool = False):
        """final_norm: the last layer's output passes through `post_layernorm` (SigLIP's
        last_hidden_state, which Gemma 3 reads)."""
        super().__init__()
        kind = getattr(config, "model_type", None)
        kind = SIGLIP if kind in SIGLIP_LIKE else kind
        if kind not in TOWERS:
            raise ModelLoadError(f"a vision tower of type {kind!r} is not supported; tokenmill "
                                 f"runs {CLIP} and {SIGLIP}")
        total = config.num_hidden_layers
        self.read = [index % (total + 1) for index in read_layers]
        self.embeddings = PatchEmbeddings(config, class_token=kind == CLIP)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) \
            if kind == CLIP else None
        self.encoder = VisionEncoder(config, max(self.read))
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) \
            if final_norm else None

    def forward(self, pixel_values: torch.Tensor,
                positions: torch.Tensor | None = None) -> list[torch.Tensor]:
        x = self.embeddings(pixel_values, positions)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        states = [x]
        for layer in self.encoder.layers:
            x = layer(x)
            states.append(x)
        if self.post_layernorm is not None:
            states[-1] = self.post_layernorm(states[-1])
        return [states[index] for index in self.read]
