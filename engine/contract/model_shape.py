"""The dimensions tensor parallelism splits, and which sizes can split them.

Free of torch: the operator checks specs against the same rule the engine applies at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def num_experts_of(config: Any) -> int:
    """The routed experts of a mixture-of-experts config (transformers calls them
    num_local_experts or num_experts); 0 for a dense model (a Nemotron-H whose layer_types
    name no expert layer, though its config counts experts)."""
    if getattr(config, "model_type", None) in MIXER_BLOCK_TYPES and \
            "moe" not in config.layer_types:
        return 0
    count = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if isinstance(count, (list, tuple)):  # per layer (Hunyuan's): the same in every layer,
        count = count[0]                  # or refused at load (check_features)
    return int(count or 0)


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention: each token's keys and values are one latent of
    `kv_lora_rank` (expanded per head by kv_b_proj) plus a rotary key of `rope_dim` shared by
    every head. A query head is `nope_dim + rope_dim` wide, a value head `value_dim`.
    DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) adds an indexer whose key, `index_dim`
    wide, is cached beside them (0: no indexer)."""

    kv_lora_rank: int
    q_lora_rank: int | None
    nope_dim: int
    rope_dim: int
    value_dim: int
    index_dim: int = 0

    @property
    def qk_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def latent_dim(self) -> int:
        """What the KV cache keeps per token and layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def cache_dim(self) -> int:
        """A cached row: the latent, the rotary key and the indexer's key, if any."""
        return self.latent_dim + self.index_dim


def latent_attention_of(config: Any) -> LatentAttention | None:
    """A DeepSeek-V2/V3 config's latent attention (it has kv_lora_rank); None for any other."""
    rank = getattr(config, "kv_lora_rank", None)
    if not rank:
        return None
    q_rank = getattr(config, "q_lora_rank", None)
    index_dim = int(config.index_head_dim) if getattr(config, "index_topk", None) else 0
    return LatentAttention(int(rank), int(q_rank) if q_rank else None,
                           int(config.qk_nope_head_dim), int(config.qk_rope_head_dim),
                           int(config.v_head_dim), index_dim)


def layer_attention_shapes(config: Any) -> list[tuple[int, int]] | None:
    """Each decoder layer's (KV heads, head size) where the layers differ (Gemma 4's
    full-attention layers: fewer, wider heads, as transformers' per_layer_config gives them);
    None where every layer has the config's own. MiMo-V2-Flash's sliding layers have twice its
    KV heads."""
    if getattr(config, "model_type", None) == MIMO_V2:
        kv, dim = int(config.num_key_value_heads), int(config.head_dim)
        return [(kv * 2 if kind == "sliding_attention" else kv, dim)
                for kind in config.layer_types]
    if not getattr(config, "per_layer_config", None):
        return None
    shapes = []
    for layer in range(config.num_hidden_layers):
        own = config.per_layer_config[layer]
        heads = getattr(own, "num_attention_heads", 0)  # none: attention-free (Mamba-2)
        shapes.append((int(getattr(own, "num_key_value_heads", None) or heads),
                       int(getattr(own, "head_dim", None) or
                           (own.hidden_size // heads if heads else 0))))
    return None if len(set(shapes)) == 1 else shapes


# Xiaomi's MiMo-V2-Flash: values narrower than keys, twice the KV heads in sliding layers.
MIMO_V2 = "mimo_v2_flash"


def value_head_dim_of(config: Any) -> int | None:
    """A value head's width where it is narrower than a key head's (MiMo-V2-Flash's
    v_head_dim); None where they are the same (latent attention has its own)."""
    if getattr(config, "model_type", None) == MIMO_V2:
        return int(config.v_head_dim)
    return None


def sharded_layer_shapes(config: Any, size: int) -> list[tuple[int, int]] | None:
    """layer_attention_shapes on one of `size` tensor-parallel ranks: each layer's KV heads
    split, or one where there are fewer than ranks (replicated on the ranks that read it)."""
    shapes = layer_attention_shapes(config)
    if shapes is None:
        return None
    return [(max(heads // size, 1), dim) for heads, dim in shapes]


def double_wide_layers(config: Any) -> frozenset[int]:
    """The layers whose MLP is twice intermediate_size wide: Gemma 4's that read an earlier
    layer's keys and values, where use_double_wide_mlp."""
    sources = kv_sources(config)
    if not sources or not getattr(config, "use_double_wide_mlp", False):
        return frozenset()
    return frozenset(i for i, source in enumerate(sources) if source != i)


# Qwen3.5's and Qwen3-Next's model types: their q_proj holds, per head, its query and then a
# gate of attention's output, and their "linear_attention" layers are gated delta nets.
GATED_QUERY_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")


@dataclass(frozen=True)
class LinearAttention:
    """A gated delta net's shape (Qwen3.5's and Qwen3-Next's linear-attention layers): keys
    and queries of `num_k_heads` heads of `key_dim`, values of `num_v_heads` heads of
    `value_dim` (each key head serves num_v_heads // num_k_heads of them), through a causal
    convolution of `conv_kernel` taps. Each sequence carries a state per such layer in place
    of keys and values: the convolution's last conv_kernel - 1 inputs and one
    [key_dim, value_dim] matrix per value head."""

    num_k_heads: int
    num_v_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int

    def sharded(self, size: int) -> LinearAttention:
        """One of `size` tensor-parallel ranks' share: whole key heads, each with the value
        heads it serves."""
        return LinearAttention(self.num_k_heads // size, self.num_v_heads // size,
                               self.key_dim, self.value_dim, self.conv_kernel)

    @property
    def conv_channels(self) -> int:
        """What the convolution mixes: the queries, keys and values side by side."""
        return 2 * self.num_k_heads * self.key_dim + self.num_v_heads * self.value_dim

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One sequence's state per layer: a [key_dim, value_dim] matrix per value head."""
        return self.num_v_heads, self.key_dim, self.value_dim


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 layer's shape (Granite 4.0-H's): `num_heads` heads of `head_dim` channels,
    whose input and output projections B and C (`state_size` wide) are shared by the heads
    of each of `groups` groups, through a causal convolution of `conv_kernel` taps. Each
    sequence carries the convolution's last inputs and a [state_size, head_dim] state per
    head."""

    num_heads: int
    head_dim: int
    groups: int
    state_size: int
    conv_kernel: int

    def sharded(self, size: int) -> Mamba2:
        """One of `size` tensor-parallel ranks' share: its heads, with the B and C of their
        groups (a group split across ranks is on each of them)."""
        return Mamba2(self.num_heads // size, self.head_dim, max(self.groups // size, 1),
                      self.state_size, self.conv_kernel)

    def first_group(self, rank: int, size: int) -> int:
        """The first group whose B and C rank `rank` of `size` holds: its heads' groups."""
        if self.groups >= size:
            return rank * self.groups // size
        return rank // (size // self.groups)

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """What the convolution mixes: the heads' inputs, then B and C of every group."""
        return self.inner + 2 * self.groups * self.state_size

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return self.num_heads, self.state_size, self.head_dim


@dataclass(frozen=True)
class Mamba1:
    """A Mamba (Mamba-1) layer's shape: `channels` channels (expand times the hidden size),
    each with its own `state_size` states, its own decay per state and its own dt (from a
    `dt_rank`-wide projection), through a causal convolution of `conv_kernel` taps. Each
    sequence carries the convolution's last inputs and a [channels, state_size] state."""

    channels: int
    state_size: int
    dt_rank: int
    conv_kernel: int

    def sharded(self, size: int) -> Mamba1:
        """One of `size` tensor-parallel ranks' share: a slice of the channels."""
        return Mamba1(self.channels // size, self.state_size, self.dt_rank, self.conv_kernel)

    @property
    def conv_channels(self) -> int:
        return self.channels

    @property
    def state_shape(self) -> tuple[int, int]:
        return self.channels, self.state_size


# Model types whose recurrent layers are Mamba-1's: Mamba's, Falcon Mamba's, Jamba's.
MAMBA1_TYPES = ("mamba", "falcon_mamba", "jamba")


def mamba1_of(config: Any) -> Mamba1 | None:
    """The Mamba-1 layers of a Mamba, Falcon Mamba or Jamba config (its layer_types name
    them "linear_attention"), None for any other."""
    kind = getattr(config, "model_type", None)
    if kind not in MAMBA1_TYPES or \
            "linear_attention" not in (getattr(config, "layer_types", None) or ()):
        return None
    if kind == "jamba":
        return Mamba1(int(config.mamba_expand * config.hidden_size), int(config.mamba_d_state),
                      int(config.mamba_dt_rank), int(config.mamba_d_conv))
    return Mamba1(int(config.intermediate_size), int(config.state_size),
                  int(config.time_step_rank), int(config.conv_kernel))


# The config fields of a Mamba-2 layer's shape (heads, head size, groups, state size,
# convolution taps), by model type: Granite 4.0-H's and Bamba's, Nemotron-H's, Mamba-2's.
GRANITE_MAMBA2_FIELDS = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                         "mamba_d_conv")
MAMBA2_FIELDS = {"granitemoehybrid": GRANITE_MAMBA2_FIELDS, "bamba": GRANITE_MAMBA2_FIELDS,
                 "nemotron_h": ("mamba_num_heads", "mamba_head_dim", "n_groups",
                                "ssm_state_size", "conv_kernel"),
                 "mamba2": ("num_heads", "head_dim", "n_groups", "state_size", "conv_kernel"),
                 "falcon_h1": ("mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                               "mamba_d_state", "mamba_d_conv")}


def mamba2_of(config: Any) -> Mamba2 | None:
    """The Mamba-2 layers of a Granite 4.0-H, Bamba, Nemotron-H, Mamba-2 or Falcon-H1 config
    (its layer_types name them "linear_attention", Falcon-H1's "hybrid"), None for any
    other."""
    fields = MAMBA2_FIELDS.get(getattr(config, "model_type", None))
    kinds = getattr(config, "layer_types", None) or ()
    if fields is None or not ({"linear_attention", PARALLEL_KIND} & set(kinds)):
        return None
    return Mamba2(*(int(getattr(config, field)) for field in fields))


# Falcon-H1's layers: attention and a Mamba-2 layer side by side, each keeping its cache.
PARALLEL_KIND = "hybrid"

# Nemotron-H's layers are one block each: a Mamba-2 layer, attention, an MLP or a mixture of
# experts, named so in its layer_types.
FEED_FORWARD_KINDS = ("mlp", "moe")
MIXER_BLOCK_TYPES = ("nemotron_h", "mamba2", "mamba", "falcon_mamba")


def feed_forward_layers(config: Any) -> list[int]:
    """The decoder layers that are a feed-forward block alone (Nemotron-H's MLP and expert
    layers): they keep neither keys and values nor a state."""
    if getattr(config, "model_type", None) not in MIXER_BLOCK_TYPES:
        return []
    return [i for i, kind in enumerate(config.layer_types) if kind in FEED_FORWARD_KINDS]


@dataclass(frozen=True)
class ShortConv:
    """LFM2's convolution layers: a gated depthwise causal convolution of `conv_kernel` taps
    over `channels` (the hidden size). A sequence carries the convolution's last inputs and
    no other state."""

    channels: int
    conv_kernel: int

    def sharded(self, size: int) -> ShortConv:
        """One of `size` tensor-parallel ranks' share: a slice of the channels."""
        return ShortConv(self.channels // size, self.conv_kernel)

    @property
    def conv_channels(self) -> int:
        return self.channels

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (1,)  # nothing past the convolution's inputs: one unused number per slot


def short_conv_of(config: Any) -> ShortConv | None:
    """The convolution layers of an LFM2 config (its layer_types name them "conv"), None for
    any other."""
    if getattr(config, "model_type", None) not in ("lfm2", "lfm2_moe", "lfm3") or \
            "conv" not in (getattr(config, "layer_types", None) or ()):
        return None
    return ShortConv(int(config.hidden_size), int(config.conv_L_cache))


def recurrent_shape_of(config: Any) -> LinearAttention | Mamba2 | Mamba1 | ShortConv | None:
    """The shape of the layers that keep a state per sequence instead of keys and values
    (a gated delta net's, Mamba-2's, Mamba-1's or LFM2's convolution's), None for a model
    without any."""
    return linear_attention_of(config) or mamba2_of(config) or mamba1_of(config) or \
        short_conv_of(config)


# The model types whose "linear_attention" layers are gated delta nets: Qwen3.5's and
# Qwen3-Next's, and OLMo Hybrid's; Kimi Linear's decay per key channel.
GATED_DELTA_TYPES = (*GATED_QUERY_TYPES, "olmo_hybrid")
KIMI_LINEAR = "kimi_linear"


def linear_attention_of(config: Any) -> LinearAttention | None:
    """The gated delta net of a Qwen3.5, Qwen3-Next or OLMo Hybrid config, or Kimi Linear's
    delta attention (a key head per value head, its convolutions over queries, keys and
    values), where layer_types name "linear_attention" layers; None for any other: other
    families name their own recurrent layers so (Mamba's), which are not gated delta nets."""
    if "linear_attention" not in (getattr(config, "layer_types", None) or ()):
        return None
    if getattr(config, "model_type", None) == KIMI_LINEAR:
        heads, dim = int(config.linear_num_heads), int(config.linear_head_dim)
        return LinearAttention(heads, heads, dim, dim, int(config.linear_conv_kernel_dim))
    if getattr(config, "model_type", None) not in GATED_DELTA_TYPES:
        return None
    return LinearAttention(int(config.linear_num_key_heads), int(config.linear_num_value_heads),
                           int(config.linear_key_head_dim), int(config.linear_value_head_dim),
                           int(config.linear_conv_kernel_dim))


def kimi_linear(config: Any) -> bool:
    """Whether the config is Kimi Linear's (its "linear_attention" layers are Kimi Delta
    Attention, under self_attn)."""
    return getattr(config, "model_type", None) == KIMI_LINEAR


def gated_queries(config: Any) -> bool:
    """Whether attention's output is multiplied by the sigmoid of a gate q_proj computes
    beside each head's query (Qwen3.5, Qwen3-Next): q_proj is twice as tall."""
    return getattr(config, "model_type", None) in GATED_QUERY_TYPES


# How layer_types name the layers that keep a state per sequence: LFM2 calls them "conv";
# Falcon-H1's "hybrid" layers attend too, beside their Mamba-2 layer.
RECURRENT_KINDS = ("linear_attention", "conv", PARALLEL_KIND)


def linear_attention_layers(config: Any) -> list[int]:
    """The decoder layers that keep a state per sequence (gated delta nets, Mamba-2, LFM2's
    convolutions; Falcon-H1's keys and values too)."""
    if recurrent_shape_of(config) is None:
        return []
    return [i for i, kind in enumerate(config.layer_types) if kind in RECURRENT_KINDS]


def kv_free_layers(config: Any) -> list[int]:
    """The decoder layers that keep no keys and values: a state alone, or a feed-forward block
    alone (Nemotron-H's)."""
    kinds = getattr(config, "layer_types", None) or ()
    return sorted([i for i in linear_attention_layers(config) if kinds[i] != PARALLEL_KIND] +
                  feed_forward_layers(config))


def kv_sources(config: Any) -> list[int] | None:
    """Each decoder layer's source of keys and values where some layers read an earlier one's
    (Gemma 4 E2B and E4B: the last num_kv_shared_layers layers read the last layer of their
    kind before them); None where every layer has its own."""
    shared = int(getattr(config, "num_kv_shared_layers", 0) or 0)
    if not shared:
        return None
    layers = config.num_hidden_layers
    first = layers - shared
    kinds = list(config.layer_types)
    sources = list(range(layers))
    for layer in range(first, layers):
        earlier = [i for i in range(first) if kinds[i] == kinds[layer]]
        if not earlier:
            raise ValueError(f"layer {layer} reads the keys and values of an earlier "
                             f"{kinds[layer]} layer, and there is none")
        sources[layer] = earlier[-1]
    return sources


def lfm2_mlp_width(config: Any) -> int:
    """LFM2's MLP width: with block_auto_adjust_ff_dim, two thirds of intermediate_size,
    times block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of."""
    width = int(config.intermediate_size)
    if not getattr(config, "block_auto_adjust_ff_dim", False):
        return width
    width = int(2 * width / 3)
    multiplier = getattr(config, "block_ffn_dim_multiplier", None)
    if multiplier is None:
        return width
    width = int(multiplier * width)
    step = int(config.block_multiple_of)
    return step * ((width + step - 1) // step)


@dataclass(frozen=True)
class ModelShape:
    heads: int
    kv_heads: int
    intermediate_size: int
    expert_intermediate_size: int = 0         # a mixture of experts' routed expert width
    shared_expert_intermediate_size: int = 0  # and its shared expert's (Qwen2-MoE)
    linear_key_heads: int = 0  # a gated delta net's key heads (Qwen3.5), 0 without one
    mamba_heads: int = 0   # a Mamba-2 layer's heads and groups of B and C (Granite 4.0-H,
    mamba_groups: int = 0  # Nemotron-H), 0 without one
    # The KV heads of the layers whose heads differ from kv_heads (Gemma 4's full layers).
    other_kv_heads: tuple[int, ...] = ()
    mamba1_channels: int = 0  # a Mamba-1 layer's channels (Mamba), 0 without one

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """The shape of a transformers config."""
        heads = getattr(config, "num_attention_heads", 0)  # none: attention-free (Mamba-2)
        expert_width = 0
        if num_experts_of(config):  # Qwen's experts are moe_intermediate_size wide, Mixtral's
            expert_width = getattr(config, "moe_intermediate_size", None) or \
                getattr(config, "intermediate_size", 0)
        # Qwen2-MoE gives its shared expert's width; GLM-4.5 (as DeepSeek), ERNIE 4.5 and
        # K-EXAONE a count of routed-expert-wide shared experts.
        shared = getattr(config, "shared_expert_intermediate_size", None) or \
            expert_width * int(getattr(config, "n_shared_experts", None) or
                               getattr(config, "moe_num_shared_experts", None) or
                               getattr(config, "num_shared_experts", None) or 0)
        dense = getattr(config, "intermediate_size", 0)
        if getattr(config, "model_type", None) == "granitemoehybrid":
            # Granite 4.0-H: its shared MLP is the dense one where it has no experts.
            width = int(config.shared_intermediate_size)
            dense, shared = width, width if expert_width else 0
        if getattr(config, "model_type", None) == "nemotron_h":
            shared = int(config.moe_shared_expert_intermediate_size) if expert_width else 0
        if getattr(config, "model_type", None) == "granitemoeshared":  # 0: none
            shared = int(config.shared_intermediate_size or 0)
        if getattr(config, "model_type", None) == "hunyuan_v1_moe":  # as wide as an expert
            shared = expert_width
        if getattr(config, "model_type", None) == "lfm2":
            dense = lfm2_mlp_width(config)
        if getattr(config, "model_type", None) == "cohere2_moe":  # its first, dense layers'
            dense = getattr(config, "prefix_dense_intermediate_size", None) or dense
        if getattr(config, "model_type", None) == "llama4_text":
            # Llama 4: intermediate_size is an expert's width and its shared expert's, the
            # dense layers' MLP is intermediate_size_mlp wide.
            dense, shared = int(config.intermediate_size_mlp), expert_width
        linear, mamba = linear_attention_of(config), mamba2_of(config)
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        others = sorted({layer_heads for layer_heads, _ in layer_attention_shapes(config) or ()
                         if layer_heads != kv_heads})
        return cls(heads, kv_heads, dense, expert_width, shared,
                   linear.num_k_heads if linear else 0, mamba.num_heads if mamba else 0,
                   mamba.groups if mamba else 0, tuple(others),
                   mamba1.channels if (mamba1 := mamba1_of(config)) else 0)

    def problems(self, tp: int) -> list[str]:
        """What `tp` ranks cannot split: every rank needs whole attention heads and an equal
        slice of the MLP; KV heads are split, or replicated when there are fewer than ranks."""
        found = []
        if self.heads % tp:
            found.append(f"{self.heads} attention heads")
        for kv_heads in (self.kv_heads, *self.other_kv_heads):
            if kv_heads % tp and tp % kv_heads:
                found.append(f"{kv_heads} KV heads (a size must divide them or be a multiple "
                             "of them)")
        if self.intermediate_size % tp:
            found.append(f"an MLP width of {self.intermediate_size}")
        if self.expert_intermediate_size % tp:
            found.append(f"an expert MLP width of {self.expert_intermediate_size}")
        if self.shared_expert_intermediate_size % tp:
            found.append(f"a shared expert MLP width of {self.shared_expert_intermediate_size}")
        if self.linear_key_heads % tp:
            found.append(f"{self.linear_key_heads} linear-attention key heads")
        if self.mamba_heads % tp:
            found.append(f"{self.mamba_heads} Mamba-2 heads")
        if self.mamba1_channels % tp:
            found.append(f"{self.mamba1_channels} Mamba channels")
        if self.mamba_groups and self.mamba_groups % tp and tp % self.mamba_groups:
            found.append(f"{self.mamba_groups} Mamba-2 groups (a size must divide them or be "
                         "a multiple of them)")
        return found

    def allows(self, tp: int) -> bool:
        return not self.problems(tp)

    def describe(self) -> str:
        text = (f"{self.heads} attention heads, {self.kv_heads} KV heads, intermediate size "
                f"{self.intermediate_size}")
        if self.expert_intermediate_size:
            text += f", expert intermediate size {self.expert_intermediate_size}"
        return text
