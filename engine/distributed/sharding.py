"""Which part of each weight a tensor-parallel rank holds (Megatron-style).

Column-parallel (rows of the weight split across ranks): q/k/v, gate/up, the embedding and the
LM head (split over the vocabulary). Row-parallel (input columns split, outputs summed by an
all-reduce): o_proj and down_proj; their bias is held by rank 0 only, so the sum adds it once.
A mixture-of-experts layer splits every expert's width the same way (Mixtral's w1/w3 are
gate/up, w2 is down); its router is replicated.
KV heads are split like the query heads; with fewer KV heads than ranks each KV head is
replicated on the ranks whose query heads read it. Norms and rotary tables are replicated.
DeepSeek's latent attention splits its heads the same way (q_proj or q_b_proj, kv_b_proj,
o_proj); the latent's own projections (q_a_proj, kv_a_proj_with_mqa) and the one latent per
token its cache keeps are whole on every rank.
A Mamba-2 layer splits its heads: each rank's rows of in_proj (the gate and the inputs of its
heads, the B and C of their groups, their dt), of the convolution, A_log, D and dt_bias, its
part of the gated norm's weight, and out_proj's columns (row-parallel); where there are fewer
groups than ranks, each group's B and C are on every rank holding heads of it. LFM2's
convolution layers split their channels the same way, and so do Mamba-1 layers (x_proj, which
reads the channels, is row-parallel as out_proj is).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.contract.model_shape import (
    LinearAttention,
    Mamba1,
    Mamba2,
    ModelShape,
    ShortConv,
    double_wide_layers,
    gated_queries,
    kimi_linear,
    latent_attention_of,
    layer_attention_shapes,
    linear_attention_layers,
    linear_attention_of,
    mamba1_of,
    mamba2_of,
    short_conv_of,
    value_head_dim_of,
)

COLUMN_PARALLEL = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3",
                   "q_b_proj", "kv_b_proj", "head_gate_proj"}
ROW_PARALLEL = {"o_proj", "down_proj", "w2"}
VOCAB_PARALLEL = {"embed_tokens", "lm_head"}


def _heads(config: Any) -> tuple[int, int, int]:
    """(attention heads, KV heads, head size); none of them for an attention-free model."""
    heads = getattr(config, "num_attention_heads", 0)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    return heads, kv_heads, head_dim


def check_tensor_parallel(config: Any, size: int) -> None:
    """ConfigError naming --tensor-parallel-size when the model can't be split `size` ways."""
    if size == 1:
        return
    if getattr(config, "model_type", None) == "gemma3n_text":
        raise ConfigError("tensor_parallel_size", f"{size}: Gemma 3n is served on one device "
                          "(its sparse activations cut each MLP row at statistics of the whole "
                          "row); use 1")
    problems = ModelShape.of(config).problems(size)
    if problems:
        raise ConfigError("tensor_parallel_size",
                          f"{size} does not divide this model's {' and '.join(problems)}; "
                          "pick a size that does (or 1)")


@dataclass(frozen=True)
class ShardPlan:
    """The local sizes of one rank and the slice of every checkpoint tensor it loads."""

    rank: int
    size: int
    num_heads: int           # query heads on this rank
    num_kv_heads: int        # KV heads on this rank
    first_kv_head: int       # global index of this rank's first KV head
    head_dim: int
    intermediate_size: int   # MLP width on this rank
    vocab_size: int          # the model's vocabulary
    vocab_per_rank: int      # rows of the embedding and LM head on this rank (padded)
    expert_size: int = 0         # each routed expert's MLP width on this rank
    shared_expert_size: int = 0  # the shared expert's (Qwen2-MoE) on this rank
    # Latent attention (DeepSeek): a value head's width where it differs from head_dim (the
    # query's), and the rows of kv_b_proj per head; the cache's one "KV head" is the latent.
    value_head_dim: int = 0
    kv_b_rows_per_head: int = 0
    # Qwen3.5: q_proj's rows per head are its query's and its output gate's.
    gated_queries: bool = False
    # A gated delta net's heads on this rank (Qwen3.5), None without one.
    linear: LinearAttention | None = None
    # A Mamba-2 layer's whole shape (Granite 4.0-H, Nemotron-H), None without one.
    mamba: Mamba2 | None = None
    # Each layer's whole (KV heads, head size) where layers differ (Gemma 4), and the layers
    # whose MLP is twice as wide: for_layer() is then a layer's own plan.
    layer_shapes: tuple[tuple[int, int], ...] | None = None
    wide_layers: frozenset[int] = frozenset()
    # LFM2's convolution layers' whole shape, None without them.
    short_conv: ShortConv | None = None
    # A Mamba-1 layer's whole shape (Mamba, Falcon Mamba), None without one.
    mamba1: Mamba1 | None = None
    # Kimi Linear's delta attention layers, whose self_attn splits by its own heads (`linear`).
    delta_layers: frozenset[int] = frozenset()

    @classmethod
    def for_model(cls, config: Any, rank: int = 0, size: int = 1) -> ShardPlan:
        check_tensor_parallel(config, size)
        heads, kv_heads, head_dim = _heads(config)
        local_kv, first_kv = _kv_split(kv_heads, rank, size)
        vocab = getattr(config, "vocab_size", 0)
        shape = ModelShape.of(config)
        latent = latent_attention_of(config)
        linear = linear_attention_of(config)
        if latent is not None:
            local_kv, first_kv, head_dim = 1, 0, latent.qk_dim
        return cls(rank, size, heads // size, local_kv, first_kv, head_dim,
                   shape.intermediate_size // size, vocab, -(-vocab // size),
                   shape.expert_intermediate_size // size,
                   shape.shared_expert_intermediate_size // size,
                   latent.value_dim if latent else value_head_dim_of(config) or 0,
                   latent.nope_dim + latent.value_dim if latent else 0,
                   gated_queries(config), linear.sharded(size) if linear else None,
                   mamba2_of(config), _tuple(layer_attention_shapes(config)),
                   double_wide_layers(config), short_conv_of(config), mamba1_of(config),
                   frozenset(linear_attention_layers(config)) if kimi_linear(config)
                   else frozenset())

    def for_layer(self, layer: int) -> ShardPlan:
        """Decoder layer `layer`'s plan: its own KV heads and head size, and MLP width, where
        layers differ (Gemma 4); this plan where they do not."""
        if self.layer_shapes is None and not self.wide_layers:
            return self
        local, first, head_dim = self.num_kv_heads, self.first_kv_head, self.head_dim
        if self.layer_shapes is not None:
            heads, head_dim = self.layer_shapes[layer]
            local, first = _kv_split(heads, self.rank, self.size)
        wide = 2 if layer in self.wide_layers else 1
        return replace(self, num_kv_heads=local, first_kv_head=first, head_dim=head_dim,
                       intermediate_size=self.intermediate_size * wide, layer_shapes=None,
                       wide_layers=frozenset())

    @property
    def output_head_dim(self) -> int:
        """The width of one head's attention output, as o_proj reads it."""
        return self.value_head_dim or self.head_dim

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    def shard(self, name: str, tensor: Any) -> torch.Tensor:
        """This rank's part of checkpoint tensor `name`.

        `tensor` is a torch tensor or a safetensors slice (indexing it reads only the part);
        the result is a tensor of the local parameter's shape.
        """
        if self.size == 1:
            return _read(tensor)
        parts = name.split(".")
        layer = _layer_index(parts)
        if layer is not None and (self.layer_shapes is not None or self.wide_layers):
            return self.for_layer(layer).shard(name, tensor)
        kind, attr = parts[-2], parts[-1]
        if kind in VOCAB_PARALLEL:
            return self._vocab_rows(tensor)
        if self.linear is not None and "linear_attn" in parts:
            return self._linear_attention_part(kind, attr, tensor)
        if layer in self.delta_layers and "self_attn" in parts:
            return self._delta_attention_part(kind, attr, tensor)
        if self.mamba is not None and _in_mamba_layer(parts):
            return self._mamba_part(kind, attr, tensor)
        if self.mamba1 is not None and _in_mamba_layer(parts, MAMBA1_KINDS, MAMBA1_ATTRS):
            return self._mamba1_part(kind, attr, tensor)
        if self.short_conv is not None and len(parts) > 2 and parts[-3] == "conv":
            return self._short_conv_part(kind, attr, tensor)
        if kind in COLUMN_PARALLEL:
            start, stop = self._output_rows(kind, parts)
            return tensor[start:stop]
        if attr == "sinks":  # one per query head: this rank's heads'
            return tensor[self.rank * self.num_heads:(self.rank + 1) * self.num_heads]
        if kind in ROW_PARALLEL:
            per = self.num_heads * self.output_head_dim if kind == "o_proj" else \
                self._width(parts)
            return self._input_columns(tensor, attr, per)
        if kind in ("q_norm", "k_norm") and len(_shape(tensor)) == 2:
            # Command R+'s: a weight per head, [heads, head size]; this rank's heads'.
            first, count = (self.rank * self.num_heads, self.num_heads) if kind == "q_norm" \
                else (self.first_kv_head, self.num_kv_heads)
            return tensor[first:first + count]
        if kind in ("q_norm", "k_norm") and _length(tensor) > self.head_dim:
            # OLMo's norms over the whole projection: the rows of q_proj's or k_proj's output.
            start, stop = self._output_rows(kind.replace("norm", "proj"), parts)
            return tensor[start:stop]
        return _read(tensor)

    def _output_rows(self, kind: str, parts: list[str]) -> tuple[int, int]:
        if kind in ("q_proj", "q_b_proj", "kv_b_proj"):
            per = self.num_heads * (self.kv_b_rows_per_head if kind == "kv_b_proj"
                                    else self.head_dim * (2 if self.gated_queries else 1))
            return self.rank * per, (self.rank + 1) * per
        if kind == "gate_proj" and "self_attn" in parts:  # AFMoE's gate of the output
            per = self.num_heads * self.output_head_dim
            return self.rank * per, (self.rank + 1) * per
        if kind == "head_gate_proj":  # LFM3's and Laguna's: one row per head
            return self.rank * self.num_heads, (self.rank + 1) * self.num_heads
        if kind in ("k_proj", "v_proj"):
            width = self.output_head_dim if kind == "v_proj" else self.head_dim
            return self.first_kv_head * width, (self.first_kv_head + self.num_kv_heads) * width
        per = self._width(parts)  # gate_proj, up_proj (w1, w3)
        return self.rank * per, (self.rank + 1) * per

    def _linear_attention_part(self, kind: str, attr: str, tensor: Any) -> torch.Tensor:
        """A gated delta net's tensor on this rank: its key heads' queries and keys and
        their value heads' values (rows of in_proj_qkv and of the convolution, each kind
        from its own block), its value heads' gates, write strengths and decays, and
        out_proj's columns for them; the norm over a value head is whole on every rank."""
        local, rank = self.linear, self.rank
        keys, values = local.num_k_heads * local.key_dim, local.num_v_heads * local.value_dim
        if kind in ("in_proj_qkv", "conv1d"):
            all_keys = keys * self.size
            starts = (rank * keys, all_keys + rank * keys, 2 * all_keys + rank * values)
            return torch.cat([tensor[start:start + rows]
                              for start, rows in zip(starts, (keys, keys, values), strict=True)])
        # OLMo Hybrid keeps each of q, k, v and the gate apart.
        if kind in ("q_proj", "k_proj", "q_conv1d", "k_conv1d"):
            return tensor[rank * keys:(rank + 1) * keys]
        if kind in ("in_proj_z", "v_proj", "g_proj", "v_conv1d"):
            return tensor[rank * values:(rank + 1) * values]
        heads = local.num_v_heads
        if kind in ("in_proj_b", "in_proj_a", "b_proj", "a_proj") or \
                attr in ("A_log", "dt_bias"):
            return tensor[rank * heads:(rank + 1) * heads]
        if kind in ("out_proj", "o_proj"):
            return self._input_columns(tensor, attr, values)
        return _read(tensor)

    def _delta_attention_part(self, kind: str, attr: str, tensor: Any) -> torch.Tensor:
        """A Kimi Delta Attention tensor on this rank: its heads' rows of the q, k, v, decay
        and gate projections, convolutions and decay biases, their write strengths and decay
        rates, and o_proj's columns for them; the low-rank halves (f_a_proj, g_a_proj) and
        the norm over a head are whole on every rank."""
        heads = self.linear.num_v_heads
        width = heads * self.linear.value_dim
        if kind in ("q_proj", "k_proj", "v_proj", "f_b_proj", "g_b_proj", "q_conv1d",
                    "k_conv1d", "v_conv1d") or attr == "dt_bias":
            return tensor[self.rank * width:(self.rank + 1) * width]
        if kind == "b_proj":
            return tensor[self.rank * heads:(self.rank + 1) * heads]
        if attr == "A_log":  # [1, 1, heads, 1]
            return _read(tensor)[:, :, self.rank * heads:(self.rank + 1) * heads]
        if kind == "o_proj":
            return self._input_columns(tensor, attr, width)
        return _read(tensor)

    def _mamba_part(self, kind: str, attr: str, tensor: Any) -> torch.Tensor:
        """A Mamba-2 layer's tensor on this rank (the class docstring's split)."""
        whole, rank = self.mamba, self.rank
        local = whole.sharded(self.size)
        inner, heads = local.inner, local.num_heads
        group_rows = local.groups * whole.state_size
        first_b = whole.first_group(rank, self.size) * whole.state_size
        all_b = whole.groups * whole.state_size
        # (start, rows) of each part of the convolution's channels: x, B, C.
        mixed = ((rank * inner, inner), (whole.inner + first_b, group_rows),
                 (whole.inner + all_b + first_b, group_rows))
        if kind == "in_proj":  # z, then the convolution's channels, then dt
            parts = ((rank * inner, inner),
                     *((whole.inner + start, rows) for start, rows in mixed),
                     (2 * whole.inner + 2 * all_b + rank * heads, heads))
        elif kind == "conv1d":
            parts = mixed
        elif kind == "norm":
            parts = ((rank * inner, inner),)
        elif kind == "out_proj":
            return self._input_columns(tensor, attr, inner)
        elif attr in ("A_log", "D", "dt_bias"):
            parts = ((rank * heads, heads),)
        else:
            return _read(tensor)
        return torch.cat([tensor[start:start + rows] for start, rows in parts])

    def _mamba1_part(self, kind: str, attr: str, tensor: Any) -> torch.Tensor:
        """A Mamba-1 layer's tensor on this rank: its channels' rows of in_proj's two halves
        (the inputs, the gate), of the convolution, dt_proj, A_log and D; x_proj's and
        out_proj's columns for them (row-parallel)."""
        whole, per = self.mamba1.channels, self.mamba1.sharded(self.size).channels
        start = self.rank * per
        if kind == "in_proj":
            return torch.cat([tensor[start:start + per],
                              tensor[whole + start:whole + start + per]])
        if kind in ("conv1d", "dt_proj") or attr in MAMBA1_ATTRS:
            return tensor[start:start + per]
        if kind in ("x_proj", "out_proj"):
            return self._input_columns(tensor, attr, per)
        return _read(tensor)

    def _short_conv_part(self, kind: str, attr: str, tensor: Any) -> torch.Tensor:
        """An LFM2 convolution layer's tensor on this rank: its channels' rows of each of
        in_proj's three parts (B, C, x) and of the convolution, out_proj's columns for
        them."""
        whole, rank = self.short_conv.channels, self.rank
        local = whole // self.size
        if kind == "in_proj":
            return torch.cat([tensor[part * whole + rank * local:part * whole + (rank + 1) * local]
                              for part in range(3)])
        if kind == "conv":
            return tensor[rank * local:(rank + 1) * local]
        if kind == "out_proj":
            return self._input_columns(tensor, attr, local)
        return _read(tensor)

    def _input_columns(self, tensor: Any, attr: str, per: int) -> torch.Tensor:
        """A row-parallel projection's part on this rank: its `per` input columns, or its
        bias on rank 0 only (zeros elsewhere), so the sum across ranks adds it once."""
        if attr == "bias":
            full = _read(tensor)
            return full if self.rank == 0 else torch.zeros_like(full)
        return tensor[:, self.rank * per:(self.rank + 1) * per]

    def _width(self, parts: list[str]) -> int:
        """The local width of the MLP a tensor belongs to: a routed expert's, the shared
        expert's, or the dense MLP's."""
        if "experts" in parts:
            return self.expert_size
        if {"shared_expert", "shared_experts", "shared_mlp"} & set(parts):
            return self.shared_expert_size  # Qwen2-MoE's, GLM-4.5's, Granite's, Hunyuan's
        return self.intermediate_size

    def _vocab_rows(self, tensor: Any) -> torch.Tensor:
        start = self.vocab_start
        stop = min(start + self.vocab_per_rank, self.vocab_size)
        rows = tensor[start:stop]
        missing = self.vocab_per_rank - rows.shape[0]
        if missing:  # the last rank's padding rows: zero, never sampled (logits are cut)
            rows = torch.cat([rows, rows.new_zeros(missing, *rows.shape[1:])])
        return rows


# A Mamba-2 layer's tensors: under `mamba` (Granite 4.0-H, Bamba), or these under `mixer`
# (Nemotron-H, whose attention and MLP blocks are `mixer` too).
MAMBA_KINDS = ("in_proj", "conv1d", "out_proj", "norm")
MAMBA_ATTRS = ("A_log", "D", "dt_bias")


# A Mamba-1 layer's (Mamba's, Falcon Mamba's, under `mixer`).
MAMBA1_KINDS = ("in_proj", "conv1d", "x_proj", "dt_proj", "out_proj")
MAMBA1_ATTRS = ("A_log", "D")


def _in_mamba_layer(parts: list[str], kinds: tuple[str, ...] = MAMBA_KINDS,
                    attrs: tuple[str, ...] = MAMBA_ATTRS) -> bool:
    if "mamba" in parts:
        return True
    return len(parts) > 2 and (parts[-3] == "mixer" and parts[-2] in kinds or
                               parts[-2] == "mixer" and parts[-1] in attrs)


def _kv_split(kv_heads: int, rank: int, size: int) -> tuple[int, int]:
    """(KV heads on rank `rank` of `size`, the first one's index): with fewer KV heads than
    ranks, size // kv_heads consecutive ranks share one; none for an attention-free model."""
    if kv_heads >= size or not kv_heads:
        return kv_heads // size, rank * kv_heads // size
    return 1, rank // (size // kv_heads)


def _layer_index(parts: list[str]) -> int | None:
    """The decoder layer a tensor name's parts put it in (layers.{i}), None outside one."""
    for before, part in zip(parts, parts[1:], strict=False):
        if before == "layers" and part.isdigit():
            return int(part)
    return None


def _tuple(shapes: list[tuple[int, int]] | None) -> tuple[tuple[int, int], ...] | None:
    return None if shapes is None else tuple(shapes)


def _shape(tensor: Any) -> tuple[int, ...]:
    """The shape of a tensor or of a safetensors slice (which has no .shape)."""
    return tuple(tensor.shape if hasattr(tensor, "shape") else tensor.get_shape())


def _length(tensor: Any) -> int:
    """The first dimension of a tensor or of a safetensors slice."""
    return _shape(tensor)[0]


def _read(tensor: Any) -> torch.Tensor:
    """The whole tensor (a safetensors slice reads it only now)."""
    return tensor if isinstance(tensor, torch.Tensor) else tensor[:]
