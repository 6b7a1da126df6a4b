"""One layer's view of the paged KV pool, as attention reads and writes it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayer:
    """K and V of one layer, [blocks, block_size, kv_heads, head_dim] each.

    A quantized pool (int8, fp8) also holds float32 scales [blocks, block_size, kv_heads], one
    per stored row; an unquantized one has None there, so the model dtype path stays as it is.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None
