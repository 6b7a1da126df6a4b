"""Shape and storage of the paged KV pool, so that sizing, allocation and reports agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.contract.model_shape import (
    kv_free_layers,
    kv_sources,
    latent_attention_of,
    sharded_layer_shapes,
)
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.layers.kv_quant import is_quantized, kv_storage_dtype

SCALE_DTYPE = torch.float32


@dataclass(frozen=True)
class KVCacheLayout:
    """Values: [layers, 2 (K, V), blocks, block_size, kv_heads, head_dim] in `dtype`. A
    quantized pool adds scales [layers, 2, blocks, block_size, kv_heads] in float32, one per
    (token, K/V head), so a token costs head_dim bytes plus 4 per head in int8 or fp8.
    Under tensor parallelism it is one rank's pool: that rank's KV heads only.

    A model whose keys and values are one stored row (DeepSeek's latent attention: the values
    are the latent's first part) has one plane instead of two, K and V views of it
    (`planes` 1).

    Where layers differ in KV heads and head size (Gemma 4), `layer_shapes` lists each
    layer's; the pool's rows are the widest layer's (kv_heads, head_dim), and a narrower
    layer uses the first part of each row (runner's per-layer views)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    planes: int = 2
    layer_shapes: tuple[tuple[int, int], ...] | None = None
    # Each model layer's layer of the pool, where some read an earlier layer's keys and values
    # (Gemma 4's shared KV) or keep none (None: a linear-attention layer, whose state lives
    # beside the pool, execution/recurrent_states.py, or a feed-forward block alone,
    # Nemotron-H's): the pool holds `num_layers` layers, the storing ones.
    pool_layers: tuple[int | None, ...] | None = None

    @classmethod
    def for_model(cls, model_config: Any, block_size: int, model_dtype: torch.dtype,
                  kv_cache_dtype: str = "auto", tp_size: int = 1) -> KVCacheLayout:
        dtype = kv_storage_dtype(kv_cache_dtype, model_dtype)
        latent = latent_attention_of(model_config)
        layers = model_config.num_hidden_layers
        keeping_none = set(kv_free_layers(model_config))
        if latent is not None:  # Kimi Linear's latent layers among delta attention ones
            storing = [i for i in range(layers) if i not in keeping_none]
            pool = tuple(None if i in keeping_none else storing.index(i)
                         for i in range(layers)) if keeping_none else None
            return cls(len(storing), 1, latent.cache_dim, block_size, dtype, planes=1,
                       pool_layers=pool)
        plan = ShardPlan.for_model(model_config, 0, tp_size)
        shapes = sharded_layer_shapes(model_config, tp_size)
        sources = kv_sources(model_config)
        if not (shapes or sources or keeping_none):
            return cls(layers, plan.num_kv_heads, plan.head_dim, block_size, dtype)
        if not (shapes or sources):  # layers without keys and values: one shape
            storing = [i for i in range(layers) if i not in keeping_none]
            pool = tuple(None if i in keeping_none else storing.index(i)
                         for i in range(layers))
            return cls(len(storing), plan.num_kv_heads, plan.head_dim, block_size, dtype,
                       pool_layers=pool)
        shapes = shapes or [(plan.num_kv_heads, plan.head_dim)] * layers
        heads, dim = max(shapes, key=lambda shape: (shape[0] * shape[1], shape[0]))
        storing = sorted(set(sources or range(layers)))
        pool = tuple(storing.index(source) for source in sources) if sources else None
        return cls(len(storing), heads, dim, block_size, dtype, layer_shapes=tuple(shapes),
                   pool_layers=pool)

    def layer_shape(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s (KV heads, head size)."""
        if self.layer_shapes is None:
            return self.num_kv_heads, self.head_dim
        return self.layer_shapes[layer]

    @property
    def model_layers(self) -> int:
        """The model's decoder layers (more than the pool's where some share)."""
        return self.num_layers if self.pool_layers is None else len(self.pool_layers)

    def pool_layer(self, layer: int) -> int | None:
        """The pool layer holding model layer `layer`'s keys and values (None: it keeps
        none, a linear-attention or feed-forward layer)."""
        return layer if self.pool_layers is None else self.pool_layers[layer]

    @property
    def quantized(self) -> bool:
        return is_quantized(self.dtype)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def scale_heads(self) -> int:
        """KV heads of the layer with the most: a quantized pool's scales per token."""
        if self.layer_shapes is None:
            return self.num_kv_heads
        return max(heads for heads, _ in self.layer_shapes)

    @property
    def bytes_per_token(self) -> int:
        """K and V of every layer for one token, scales included."""
        per_layer = self.num_kv_heads * self.head_dim * self.dtype.itemsize
        if self.quantized:
            per_layer += self.scale_heads * SCALE_DTYPE.itemsize
        return self.planes * self.num_layers * per_layer

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def values_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, self.planes, num_blocks, self.block_size, self.num_kv_heads,
                self.head_dim)

    def scales_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, self.planes, num_blocks, self.block_size, self.scale_heads)
