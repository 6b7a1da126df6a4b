"""Mixture-of-experts math: the router's choice and the experts' weighted sum.

Each token row goes to `top_k` of the layer's experts (the router's softmax, as Hugging Face
computes it, renormalized over the chosen ones where the model asks). The rows are grouped by
expert, so every expert runs once per step on the rows that chose it, whatever kind of
linear layers it holds (plain, int8, fp8, int4).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def route(logits: torch.Tensor, top_k: int,
          renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [rows, top_k] float32, expert ids [rows, top_k]) from the router's logits:
    the softmax over all experts, its top_k, and those divided by their sum if `renormalize`."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def route_sparsemixer(logits: torch.Tensor,
                      jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's sparsemixer at inference: the best expert, weighted by its share of a softmax
    over the experts whose logits lie within 2 * jitter_eps (relative to the larger of the
    two magnitudes) of its; then the best of the others, likewise (float32 weights)."""
    scores = logits.float()
    weights, ids = [], []
    rest = scores
    for _ in range(2):
        top, chosen = rest.max(dim=-1, keepdim=True)
        far = (top - scores) / scores.abs().clamp(min=top) > 2 * jitter_eps
        shares = torch.softmax(rest.masked_fill(far, float("-inf")), dim=-1)
        weights.append(shares.gather(-1, chosen))
        ids.append(chosen)
        rest = rest.scatter(-1, chosen, float("-inf"))
    return torch.cat(weights, dim=-1), torch.cat(ids, dim=-1)


def route_top_sigmoid(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's routing: the top_k logits, each weighted by its sigmoid (float32)."""
    values, ids = torch.topk(logits, top_k, dim=-1)
    return torch.sigmoid(values.float()), ids


def route_grouped(logits: torch.Tensor, correction: torch.Tensor | None, top_k: int,
                  groups: int, topk_group: int, renormalize: bool, scale: float,
                  softmax: bool = False, group_top: int = 2,
                  bias_on_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's routing (GLM-4.5's), as transformers computes it: each expert's sigmoid
    score plus its correction bias ranks it; the experts are in `groups` groups, each group
    ranked by the sum of its `group_top` best (two), and only the topk_group best groups'
    experts may be chosen. The weights are the chosen experts' scores (without the bias),
    divided by their sum where `renormalize`, times `scale`.

    DeepSeek-V2's (`softmax`, `group_top` 1): the scores are the softmax over all experts,
    with no bias, and a group ranks by its best; ERNIE 4.5's adds its correction bias to the
    softmax; Mistral 4's ranks a group of softmax scores by its two best, as V3. Kolibri's
    (`bias_on_logits`) adds its bias to the logits, not to their sigmoids, to choose."""
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32) if softmax else \
        torch.sigmoid(logits.float())
    ranked = logits.float() if bias_on_logits else scores
    choice = ranked if correction is None else ranked + correction.float().reshape(-1)
    rows, experts = choice.shape
    per_group = choice.view(rows, groups, experts // groups)
    group_scores = per_group.amax(dim=-1) if group_top == 1 else \
        per_group.topk(group_top, dim=-1).values.sum(dim=-1)
    best_groups = group_scores.topk(topk_group, dim=-1).indices
    allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    allowed = allowed.unsqueeze(-1).expand(-1, -1, experts // groups).reshape(rows, experts)
    ids = choice.masked_fill(~allowed, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale, ids


def experts_sum(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                num_experts: int,
                run: Callable[[int, torch.Tensor], torch.Tensor],
                scale_inputs: bool = False) -> torch.Tensor:
    """For every row of x: the sum over its chosen experts of weight * expert(row) (with
    `scale_inputs`, Llama 4's, of expert(weight * row), the product in x's dtype), in x's
    dtype; `run(e, rows)` is expert e's output for those rows. The rows are sorted by expert
    once and the per-expert counts read on the host (one copy per call), so an expert no row
    chose costs nothing."""
    tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    rows = order // top_k
    chosen_weights = weights.reshape(-1)[order]
    out = torch.zeros(tokens, x.shape[-1], dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            stop = start + count
            picked = rows[start:stop]
            weight = chosen_weights[start:stop, None]
            if scale_inputs:
                y = run(expert, x.index_select(0, picked) * weight.to(x.dtype)).float()
            else:
                y = run(expert, x.index_select(0, picked)).float() * weight
            out.index_add_(0, picked, y)
            start = stop
    return out.to(x.dtype)
