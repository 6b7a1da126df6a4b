"""Rows of q_proj and k_proj (weights, biases, a LoRA adapter's B, the weights of q's and k's
norms over each head) reordered from rotary pairs of adjacent dimensions (2i, 2i+1) to the two
halves (i, i + rotated / 2) each head's rotary turns in the engine. llama.cpp stores Llama's
rows so; ERNIE 4.5, GLM-4, Cohere and Llama 4 rotate adjacent pairs. q and k reordered alike
keep their dot product."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.engine.layers.rotary import rope_parameters, rotary_dim
from tokenmill.engine.models.decoder import head_dim_of, num_kv_heads_of

# The tensors whose rows a rotary embedding over interleaved pairs reorders.
ROTATED = ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias", "q_norm.weight",
           "k_norm.weight")


def pairs_to_halves(w: torch.Tensor, num_heads: int,
                       rotated: int | None = None) -> torch.Tensor:
    """Each head's rows from interleaved rotary pairs (2i, 2i+1) to the two halves (i,
    i + rotated / 2) that the engine's rotary turns: llama.cpp stores Q/K rows interleaved, and
    ERNIE 4.5 and GLM-4 rotate interleaved pairs (GLM-4 over the first `rotated` rows of a head
    only; None: all). q and k reordered alike keep their dot product."""
    rest = w.shape[1:]
    heads = w.reshape(num_heads, w.shape[0] // num_heads, *rest)
    rotated = rotated or heads.shape[1]
    turned = (heads[:, :rotated].reshape(num_heads, rotated // 2, 2, *rest).transpose(1, 2)
              .reshape(num_heads, rotated, *rest))
    return torch.cat([turned, heads[:, rotated:]], dim=1).reshape(w.shape)



def rotary_halves(config: Any, kind: str, rows: torch.Tensor) -> torch.Tensor:
    """`rows` of q_proj or k_proj (`kind`) of a model rotating adjacent pairs, reordered per
    head over its rotated dimensions; or the weight of q's or k's norm over each head, [heads,
    head size] (Command R+'s) or one for every head, reordered as the rows it scales."""
    rotated = rotary_dim(head_dim_of(config), rope_parameters(config))
    if kind in ("q_norm", "k_norm"):
        heads = rows.shape[0] if rows.dim() == 2 else 1
        return pairs_to_halves(rows.reshape(-1), heads, rotated).reshape(rows.shape)
    heads = config.num_attention_heads if kind == "q_proj" else num_kv_heads_of(config)
    return pairs_to_halves(rows, heads, rotated)
