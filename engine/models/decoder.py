"""Decoder-only transformer (Llama, Mistral, Qwen2, Qwen3, Gemma 1/2/3, Cohere, StarCoder 2,
and the mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek's latent attention, ...;
the hybrids Qwen3.5, Granite 4.0-H, Nemotron-H, LFM2) over the paged KV cache.

Parameter names equal Hugging Face's, so checkpoints load without renaming.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.engine.contract.model_shape import (
    gated_queries,
    kimi_linear,
    kv_sources,
    layer_attention_shapes,
    linear_attention_layers,
    mamba1_of,
    mamba2_of,
    sharded_layer_shapes,
    short_conv_of,
)
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import ShardPlan
from tokenmill.engine.layers.activation import XIELU, act_and_mul, ungated_act
from tokenmill.engine.layers.alibi import alibi_slopes, mpt_alibi_slopes
from tokenmill.engine.layers.attention import Scores, attention, store_kv
from tokenmill.engine.layers.attention_metadata import AttentionMetadata
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.linear import MergedLinear
from tokenmill.engine.layers.norm import (
    CohereLayerNorm,
    HeadLayerNorms,
    LayerNorm,
    RMSNorm,
    UnweightedLayerNorm,
    UnweightedRMSNorm,
    unit_rms_norm,
)
from tokenmill.engine.layers.rotary import (
    LAYER_TYPES,
    RopeKernel,
    RopeRows,
    RotaryEmbedding,
    nope_query_scale,
    query_temperature,
    rope_parameters,
    scaled_queries,
)
from tokenmill.engine.layers.sinusoidal import SinusoidalPositions
from tokenmill.engine.layers.state_layer import StateLayer
from tokenmill.engine.layers.vocab_parallel import VocabParallelEmbedding
from tokenmill.engine.models.architecture import (
    XGLM,
    MoeShape,
    activation_of,
    attention_chunk_of,
    classifier_of,
    embedding_multiplier_of,
    flags_of,
    head_layer_norm_of,
    layer_window_of,
    learned_position_offset,
    moe_shape_of,
    output_gate_activation_of,
    output_gate_of,
    parallel_norms_of,
    rms_norm_eps_of,
    rotates_at,
    sandwich_norms_of,
)
from tokenmill.engine.models.dsa_indexer import indexer_kinds
from tokenmill.engine.models.falcon_h1 import FalconH1Layer, FalconH1Mixer
from tokenmill.engine.models.gated_delta_net import GatedDeltaNet
from tokenmill.engine.models.gemma3n import (
    Gemma3nLayer,
    collapse_streams,
    expand_streams,
    stream_projections,
)
from tokenmill.engine.models.gemma4 import (
    Gemma4Experts,
    per_layer_input_width,
    per_layer_inputs,
)
from tokenmill.engine.models.kimi_delta_attention import KimiDeltaAttention
from tokenmill.engine.models.latent_attention import LatentSelfAttention
from tokenmill.engine.models.mamba1_mixer import Mamba1Mixer
from tokenmill.engine.models.mamba2_mixer import Mamba2Mixer
from tokenmill.engine.models.mixer_block import ATTENTION, RECURRENT, MixerBlock
from tokenmill.engine.models.moe import SparseMoeBlock
from tokenmill.engine.models.short_conv import ShortConvMixer
from tokenmill.engine.models.source import ModelLoadError


def head_dim_of(config: Any, layer_type: str | None = None) -> int:
    """The head size of the config, or of its layers of `layer_type` where layers differ
    (Gemma 4's full-attention layers)."""
    shapes = layer_attention_shapes(config) if layer_type else None
    if shapes:
        window_kinds = getattr(config, "layer_types", None) or []
        sizes = [dim for (_, dim), kind in zip(shapes, window_kinds, strict=False)
                 if kind == layer_type]
        if sizes:
            return sizes[0]
    heads = config.num_attention_heads  # none: attention-free (Mamba)
    return getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)


def num_kv_heads_of(config: Any) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def decoder_norm(config: Any, size: int) -> nn.Module:
    """A norm of the residual stream: Cohere's LayerNorm (Command A+'s RMSNorm where it gives
    rms_norm_eps), StarCoder 2's and Nemotron's (torch's, with a bias), OLMo's (without a
    weight), else RMSNorm (Gemma's scales by 1 + weight)."""
    flags = flags_of(config)
    if config.model_type == "olmo":
        return UnweightedLayerNorm()
    if flags.nanochat:
        return UnweightedRMSNorm(rms_norm_eps_of(config))
    if flags.cohere and getattr(config, "rms_norm_eps", None) is None:  # else Command A+'s
        return CohereLayerNorm(size, config.layer_norm_eps)
    if flags.layer_norm:  # StarCoder 2's norm_epsilon, Nemotron's norm_eps (and 1 + weight)
        eps = getattr(config, "norm_epsilon", None) or getattr(config, "layer_norm_eps", None) \
            or config.norm_eps  # Phi's layer_norm_eps
        return LayerNorm(size, eps, unit_offset=config.model_type == "nemotron",
                         bias=not getattr(config, "no_bias", False))  # MPT's no_bias
    return RMSNorm(size, rms_norm_eps_of(config), flags.norms_add_one)


class Attention(nn.Module):
    """This rank's heads; o_proj's partial sums are added across ranks. `window`: the sliding
    window this layer attends over (None: the whole context); `shape`: this layer's (KV heads,
    head size) where layers differ (Gemma 4, on one rank)."""

    def __init__(self, config: Any, plan: ShardPlan, tp: TPGroup, window: int | None = None,
                 shape: tuple[int, int] | None = None, reads_earlier_kv: bool = False,
                 chunk: int | None = None, rotates: bool = True):
        """`reads_earlier_kv`: the layer's keys and values are an earlier layer's (Gemma 4's
        shared KV), in the cache view it is given: it has a query projection only. `chunk`:
        each query sees its own chunk of that many positions (Llama 4); `rotates`: the layer
        turns q and k by position."""
        super().__init__()
        flags = flags_of(config)
        self.tp = tp
        self.reads_earlier_kv = reads_earlier_kv
        self.num_heads, self.config_heads = plan.num_heads, config.num_attention_heads
        self.num_kv_heads, self.head_dim = shape or (plan.num_kv_heads, plan.head_dim)
        # MiMo-V2-Flash's values are narrower than its keys: cached padded to a key's width.
        self.value_dim = plan.value_head_dim or self.head_dim
        self.value_scale = float(config.attention_value_scale or 1.0) if flags.mimo_v2 else None
        # Gemma 4's full-attention layers take their values from the keys' projection.
        self.values_from_keys = flags.gemma4 and window is None and \
            bool(getattr(config, "attention_k_eq_v", False))
        self.value_norm_eps = rms_norm_eps_of(config) if flags.gemma4 or flags.gemma3n else None
        # ERNIE 4.5's use_bias puts a bias on every projection, attention's and the MLP's.
        bias = bool(getattr(config, "attention_bias", False) or getattr(config, "use_bias", False)
                    or flags.phi)
        qkv_bias = bias or flags.qkv_bias or bool(getattr(config, "use_qkv_bias", False))
        hidden = config.hidden_size
        kv_size = self.num_kv_heads * self.head_dim
        # Qwen3.5's q_proj: each head's query, then its output gate.
        self.gated = gated_queries(config)
        queries = self.num_heads * self.head_dim * (2 if self.gated else 1)
        parts = {"q_proj": queries, "k_proj": kv_size,
                 "v_proj": self.num_kv_heads * self.value_dim}
        # AFMoE's, LFM3's and Laguna's gate of attention's output, projected from the layer's
        # input (output_gate_of).
        self.output_gate = output_gate_of(config)
        self.gate_activation = output_gate_activation_of(config)
        if self.output_gate == "element":
            parts["gate_proj"] = self.num_heads * self.value_dim
        elif self.output_gate == "head":
            parts["head_gate_proj"] = self.num_heads
        if self.values_from_keys or reads_earlier_kv:
            del parts["v_proj"]
        if reads_earlier_kv:
            del parts["k_proj"]
        self.qkv_proj = MergedLinear(hidden, parts, bias=qkv_bias)
        # Seed-OSS sets the output projection's bias apart (attention_out_bias); GLM-4 has none.
        out_bias = bool(getattr(config, "attention_out_bias", bias)) and \
            not flags.bias_on_qkv_only
        self.o_proj = nn.Linear(self.num_heads * self.value_dim, hidden, bias=out_bias)
        # GLM-4.5 normalizes q and k per head where its config says use_qk_norm.
        qk_norm = flags.qk_norm or (flags.moe == "deepseek" and
                                    bool(getattr(config, "use_qk_norm", False)))
        head_layer_norm = head_layer_norm_of(config)
        if head_layer_norm:
            self.q_norm, self.k_norm = self._head_layer_norms(config, plan, head_layer_norm)
            qk_norm = True
        elif qk_norm:
            self.q_norm = RMSNorm(self.head_dim, rms_norm_eps_of(config), flags.norms_add_one)
            if not reads_earlier_kv:
                self.k_norm = RMSNorm(self.head_dim, rms_norm_eps_of(config), flags.norms_add_one)
        self.qk_norm = qk_norm
        self.qk_norm_after_rope = flags.qk_norm_after_rope
        self.projection_norm = flags.projection_qk_norm
        # OLMo 2/3 apply the norm's weight in float32, OLMoE after the cast back.
        self.weight_in_float32 = flags.olmo
        # OLMoE's clip_qkv: q, k and v clamped to [-clip, clip] after the norms.
        self.clip = getattr(config, "clip_qkv", None)
        if flags.projection_qk_norm:  # this rank's part of the weights over the whole q and k
            self.q_norm = RMSNorm(self.num_heads * self.head_dim, rms_norm_eps_of(config))
            self.k_norm = RMSNorm(kv_size, rms_norm_eps_of(config))
            heads, kv_heads = config.num_attention_heads, num_kv_heads_of(config)
            self.q_width, self.k_width = heads * self.head_dim, kv_heads * self.head_dim
            # With fewer KV heads than ranks, each KV head's squares arrive from this many.
            self.k_copies = max(tp.size // kv_heads, 1)
        # Gemma 2/3 scale scores by query_pre_attn_scalar ** -0.5 (not always the head size),
        # Granite by its attention_multiplier.
        scaled_by = getattr(config, "query_pre_attn_scalar", None) or self.head_dim
        scale = float(config.attention_multiplier) if flags.granite else scaled_by ** -0.5
        if flags.falcon_h1:  # its keys times key_multiplier: the scores take it
            scale *= float(config.key_multiplier)
        if flags.gemma4 or flags.gemma3n:  # their q and k norms set the scale
            scale = 1.0
        if getattr(config, "softmax_scale", None):  # MPT's, where its config sets one
            scale = float(config.softmax_scale)
        self.scores = Scores(scale, window, getattr(config, "attn_logit_softcapping", None),
                             chunk)
        # Llama 4 and NanoChat: q and k normalized per head, without a weight, after the turn.
        self.l2_qk_norm_eps = rms_norm_eps_of(config) if flags.nanochat or (
            flags.llama4 and rotates and bool(getattr(config, "use_qk_norm", False))) else None
        # GPT-OSS: this rank's heads' sink logits (MiMo-V2-Flash: in its sliding layers).
        sinks = flags.attention_sinks or (flags.mimo_v2 and window is not None)
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if sinks else None
        # BLOOM and MPT: this rank's heads' ALiBi slopes, computed (fill_computed_buffers),
        # not loaded.
        self.mpt_bias_max = float(config.attn_config.alibi_bias_max) \
            if config.model_type == "mpt" else None
        self.first_head = plan.rank * plan.num_heads
        self.register_buffer("alibi", torch.empty(self.num_heads) if flags.alibi else None,
                             persistent=False)

    def fill_computed_buffers(self) -> None:
        """Write the buffers computed from the config, not read from the checkpoint, on the
        device the model was built on; the slopes in float32 whatever the model's dtype."""
        if self.alibi is not None:
            slopes = alibi_slopes(self.config_heads) if self.mpt_bias_max is None else \
                mpt_alibi_slopes(self.config_heads, self.mpt_bias_max)
            slopes = slopes[self.first_head:][:self.num_heads]
            self.alibi = slopes.to(self.alibi.device)

    def forward(self, x: torch.Tensor, rope: RopeRows | RopeKernel | None,
                kv_cache: KVLayer, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        if self.reads_earlier_kv:
            return self._read_earlier_kv(x, rope, kv_cache, meta)
        gate = None
        if self.values_from_keys:
            q, k = self.qkv_proj(x)
            v = k
        elif self.output_gate:
            q, k, v, gate = self.qkv_proj(x)
        else:
            q, k, v = self.qkv_proj(x)
        if self.gated:
            q, gate = q.view(tokens, self.num_heads, 2, self.head_dim).unbind(2)
            q = q.contiguous()
        if self.projection_norm:
            q = self._norm_projection(q, self.q_norm, self.q_width, 1)
            k = self._norm_projection(k, self.k_norm, self.k_width, self.k_copies)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.value_dim)
        if self.value_scale is not None:
            v = v * self.value_scale
        if self.value_dim != self.head_dim:
            v = F.pad(v, (0, self.head_dim - self.value_dim))
        if self.value_norm_eps is not None:  # a new tensor: the keys may turn in place
            v = unit_rms_norm(v, self.value_norm_eps)
        if self.qk_norm and not self.qk_norm_after_rope:
            q, k = self._norm_heads(q, k, meta.backend)
        if rope is not None:  # None: a layer without positional encoding (SmolLM3's NoPE)
            q, k = rope.rotate(q, k)
        if self.qk_norm and self.qk_norm_after_rope:
            q, k = self._norm_heads(q, k, meta.backend)
        if self.l2_qk_norm_eps is not None:
            q, k = (unit_rms_norm(t, self.l2_qk_norm_eps) for t in (q, k))
        store_kv(k, v, kv_cache, meta)
        o = attention(q, kv_cache, meta, self.scores, self.sinks, self.alibi)
        o = o[..., :self.value_dim]
        if gate is not None and self.output_gate == "head":
            o = o * self._gate(gate).unsqueeze(-1)
        o = o.reshape(tokens, -1)
        if gate is not None and self.output_gate != "head":
            o = o * self._gate(gate.reshape(tokens, -1))
        return self.tp.all_reduce(self.o_proj(o))

    def _gate(self, gate: torch.Tensor) -> torch.Tensor:
        """The output gate's factors: its sigmoid, or Laguna's softplus in float32."""
        if self.gate_activation == "softplus":
            return F.softplus(gate.float()).to(gate.dtype)
        return torch.sigmoid(gate)

    def _head_layer_norms(self, config: Any, plan: ShardPlan,
                          kind: str) -> tuple[nn.Module, nn.Module]:
        """q's and k's LayerNorm over each head (head_layer_norm_of): Command R+'s Cohere
        LayerNorm with a weight per head (this rank's heads'), StableLM 2 12B's LayerNorm of
        each head, Persimmon's and Phi's torch LayerNorm shared by the heads."""
        eps = config.layer_norm_eps
        if kind == "cohere":
            return (CohereLayerNorm((self.num_heads, self.head_dim), eps),
                    CohereLayerNorm((self.num_kv_heads, self.head_dim), eps))
        if kind == "per_head":
            return (HeadLayerNorms(config.num_attention_heads, plan.rank * self.num_heads,
                                   self.num_heads, self.head_dim, eps),
                    HeadLayerNorms(num_kv_heads_of(config), plan.first_kv_head,
                                   self.num_kv_heads, self.head_dim, eps))
        return LayerNorm(self.head_dim, eps), LayerNorm(self.head_dim, eps)

    def _read_earlier_kv(self, x: torch.Tensor, rope: RopeRows | RopeKernel | None,
                         kv_cache: KVLayer, meta: AttentionMetadata) -> torch.Tensor:
        """Queries only, over the keys and values an earlier layer stored this step."""
        tokens = x.shape[0]
        q = self.qkv_proj(x)[0].view(tokens, self.num_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q, backend=meta.backend)[0]
        if rope is not None:  # no keys of its own: an empty slice of q stands in
            q, _ = rope.rotate(q, q[:, :0])
        o = attention(q, kv_cache, meta, self.scores, self.sinks)
        return self.tp.all_reduce(self.o_proj(o.reshape(tokens, -1)))

    def _norm_heads(self, q: torch.Tensor, k: torch.Tensor,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head of q and of k through its RMSNorm (Qwen3's q_norm and k_norm)."""
        return self.q_norm(q, backend=backend)[0], self.k_norm(k, backend=backend)[0]

    def _norm_projection(self, x: torch.Tensor, norm: RMSNorm, width: int,
                         copies: int) -> torch.Tensor:
        """OLMo's RMSNorm over a whole projection ([T, width], of which this rank holds a
        slice): the mean of squares is summed across ranks, and computed as transformers'
        Olmo2RMSNorm does (float32, weight applied before the cast back) or OlmoeRMSNorm
        (the weight after)."""
        h = x.float()
        if self.tp.size == 1:
            variance = h.pow(2).mean(-1, keepdim=True)
        else:
            variance = self.tp.all_reduce(h.pow(2).sum(-1, keepdim=True)) / (copies * width)
        normed = h * torch.rsqrt(variance + norm.eps)
        if self.weight_in_float32:
            return (norm.weight * normed).to(x.dtype)
        return norm.weight * normed.to(x.dtype)


class MLP(nn.Module):
    """This rank's slice of the MLP width; down_proj's partial sums are added across ranks."""

    def __init__(self, config: Any, plan: ShardPlan, tp: TPGroup, widen: int = 1):
        """`widen`: times the config's width (Gemma 4's double-wide MLP in shared-KV layers)."""
        super().__init__()
        self.activation = activation_of(config)
        self.tp = tp
        bias = bool(getattr(config, "mlp_bias", False) or getattr(config, "use_bias", False)
                    or flags_of(config).phi or flags_of(config).gpt_neox or flags_of(config).gptj)
        width = plan.intermediate_size * widen
        self.gated = not flags_of(config).ungated_mlp
        if self.gated:
            self.gate_up_proj = MergedLinear(
                config.hidden_size, {"gate_proj": width, "up_proj": width}, bias=bias)
        else:
            self.up_proj = nn.Linear(config.hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=bias)
        if self.activation == "xielu":  # Apertus: an activation with learned parameters
            self.act_fn = XIELU()

    def forward(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        if self.activation == "xielu":
            return self.tp.all_reduce(self.down_proj(self.act_fn(self.up_proj(x))))
        if not self.gated:
            return self.tp.all_reduce(self.down_proj(ungated_act(self.up_proj(x),
                                                                 self.activation)))
        gate, up = self.gate_up_proj(x)
        return self.tp.all_reduce(self.down_proj(act_and_mul(gate, up, self.activation,
                                                             backend)))


class DecoderLayer(nn.Module):
    """One block. The residual stream is carried beside the hidden states (as in vLLM): each
    norm adds the branch output before it to the stream, so the add costs no op of its own
    on the Triton path (one fused kernel) and the final norm takes the last layer's add.

    Gemma 2/3 ("sandwich" norms) also normalize each branch's output before it joins the
    stream: post_attention_layernorm does that to attention's, pre_feedforward_layernorm
    then takes the add, and post_feedforward_layernorm normalizes the MLP's."""

    def __init__(self, config: Any, plan: ShardPlan, tp: TPGroup, sparse: MoeShape | None,
                 window: int | None = None, shape: tuple[int, int] | None = None,
                 reads_earlier_kv: bool = False, linear: bool = False,
                 chunk: int | None = None, rotates: bool = True, indexer: str | None = None):
        """`sparse`: the mixture of experts this layer's feed-forward block is, None: a dense
        MLP. `window`: the sliding window its attention covers, None: the whole context.
        `shape`: its attention's (KV heads, head size) on this rank where layers differ;
        `reads_earlier_kv`: its keys and values are an earlier layer's (Gemma 4); `linear`:
        its token mixer is a gated delta net (Qwen3.5), not attention; `chunk`, `rotates`: as
        Attention's; `indexer`: as LatentSelfAttention's."""
        super().__init__()
        flags = flags_of(config)

        def norm() -> nn.Module:
            return decoder_norm(config, config.hidden_size)

        # OLMo's norms after each branch; OLMo Hybrid's gated delta net layers have Llama's.
        self.post_norms_only = flags.olmo and not linear
        # Attention and the MLP side by side, off one norm or a norm each (parallel_norms_of).
        norms = parallel_norms_of(config)
        self.parallel, self.parallel_norms = norms > 0, norms == 2
        if not self.post_norms_only:
            self.input_layernorm = norm()
        self.linear = linear
        # Its state-keeping token mixer, under the checkpoint's name: Granite 4.0-H's and
        # Bamba's Mamba-2 (mamba), LFM2's convolution (conv), else Qwen3.5's gated delta net
        # (linear_attn).
        self.recurrent_name = "mamba" if mamba2_of(config) or mamba1_of(config) else \
            "conv" if short_conv_of(config) else \
            "self_attn" if kimi_linear(config) else "linear_attn"
        if linear and kimi_linear(config):
            self.self_attn = KimiDeltaAttention(config, tp)
        elif linear and mamba2_of(config):
            self.mamba = Mamba2Mixer(config, tp)
        elif linear and mamba1_of(config):  # Jamba's
            self.mamba = Mamba1Mixer(config, tp)
        elif linear and short_conv_of(config):
            self.conv = ShortConvMixer(config, tp)
        elif linear:
            self.linear_attn = GatedDeltaNet(config, tp)
        else:
            self.self_attn = LatentSelfAttention(config, plan, tp, indexer) \
                if flags.latent_attention \
                else Attention(config, plan, tp, window, shape, reads_earlier_kv, chunk, rotates)
        if not self.parallel or self.parallel_norms:
            self.post_attention_layernorm = norm()
        self.sandwich = sandwich_norms_of(config)
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
        if self.sandwich or self.post_norms_only:
            self.post_feedforward_layernorm = norm()
        # The feed-forward block, under the checkpoint's name (Mixtral: block_sparse_moe).
        self.feed_forward_name = "mlp"
        if sparse is not None:
            self.feed_forward_name = sparse.names.block
            setattr(self, sparse.names.block, SparseMoeBlock(config.hidden_size, sparse, tp))
        else:
            double = reads_earlier_kv and bool(getattr(config, "use_double_wide_mlp", False))
            self.mlp = MLP(config, plan, tp, widen=2 if double else 1)
        # Granite scales each branch's output as it joins the residual stream.
        self.branch_scale = float(config.residual_multiplier) if flags.granite else None
        # Gemma 4 multiplies the stream by a learned scalar at the end of each layer.
        self.layer_scalar = nn.Parameter(torch.ones(1)) if flags.gemma4 else None
        # Gemma 4 26B-A4B: experts beside the MLP, their output added to its normalized one.
        self.moe = Gemma4Experts(config, tp) if flags.gemma4 and \
            getattr(config, "enable_moe_block", False) else None
        if self.moe is not None:
            self.post_feedforward_layernorm_1 = norm()
        # Gemma 4 E2B and E4B: each layer's input embedding, gated by the stream, added to it.
        per_layer = per_layer_input_width(config) if flags.gemma4 else 0
        self.per_layer_input_gate = nn.Linear(config.hidden_size, per_layer, bias=False) \
            if per_layer else None
        if per_layer:
            self.per_layer_projection = nn.Linear(per_layer, config.hidden_size, bias=False)
            self.post_per_layer_input_norm = norm()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                rope: RopeRows | RopeKernel | None, kv_cache: KVLayer | StateLayer,
                meta: AttentionMetadata,
                per_layer_input: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: the previous layer's MLP output, not yet in `residual` (layer 0: the embeddings,
        and no residual yet); kv_cache: a linear-attention layer's states instead. Returns
        this layer's MLP output and the stream before it (Gemma 4: the stream after it, and
        None)."""
        if self.post_norms_only:
            return self._post_norms_forward(x, residual, rope, kv_cache, meta)
        if self.parallel:
            return self._parallel_forward(x, residual, rope, kv_cache, meta)
        x, residual = self.input_layernorm(x, residual, meta.backend)
        x = getattr(self, self.recurrent_name)(x, kv_cache, meta) if self.linear else \
            self.self_attn(x, rope, kv_cache, meta)
        if not self.sandwich:
            x, residual = self.post_attention_layernorm(self._joining(x), residual, meta.backend)
            return self._joining(getattr(self, self.feed_forward_name)(x, meta.backend)), residual
        x, _ = self.post_attention_layernorm(x, None, meta.backend)
        x, residual = self.pre_feedforward_layernorm(self._joining(x), residual, meta.backend)
        x = getattr(self, self.feed_forward_name)(x, meta.backend)
        if self.moe is not None:
            x = self.post_feedforward_layernorm_1(x, None, meta.backend)[0] + \
                self.moe(residual, meta.backend)
        x = self._joining(self.post_feedforward_layernorm(x, None, meta.backend)[0])
        if self.layer_scalar is not None:  # the stream whole, scaled: no residual carried
            stream = residual + x
            if self.per_layer_input_gate is not None:
                stream = stream + self._per_layer_input(stream, per_layer_input, meta.backend)
            return stream * self.layer_scalar, None
        return x, residual

    def _post_norms_forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                            rope: RopeRows | RopeKernel | None, kv_cache: KVLayer,
                            meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """OLMo: each branch reads the stream as it is; its output is normalized and added."""
        residual = x if residual is None else residual + x
        x = self.self_attn(residual, rope, kv_cache, meta)
        residual = residual + self.post_attention_layernorm(x, None, meta.backend)[0]
        x = getattr(self, self.feed_forward_name)(residual, meta.backend)
        return self.post_feedforward_layernorm(x, None, meta.backend)[0], residual

    def _per_layer_input(self, stream: torch.Tensor, per_layer_input: torch.Tensor,
                         backend: str) -> torch.Tensor:
        """Gemma 4's per-layer input: gated by the stream, projected back, normalized."""
        gated = ungated_act(self.per_layer_input_gate(stream), self.mlp.activation)
        projected = self.per_layer_projection(gated * per_layer_input)
        return self.post_per_layer_input_norm(projected, None, backend)[0]

    def _parallel_forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                          rope: RopeRows | RopeKernel | None, kv_cache: KVLayer,
                          meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Cohere: attention and the MLP read the same normalized stream (GPT-NeoX: each its
        own norm of it); attention's output joins it here, the MLP's at the next norm, in
        transformers' order of the adds."""
        x, residual = self.input_layernorm(x, residual, meta.backend)
        attended = self.self_attn(x, rope, kv_cache, meta)
        if self.parallel_norms:
            x = self.post_attention_layernorm(residual, None, meta.backend)[0]
        return getattr(self, self.feed_forward_name)(x, meta.backend), residual + attended

    def _joining(self, branch: torch.Tensor) -> torch.Tensor:
        """A branch's output as it joins the residual stream (Granite scales it)."""
        return branch if self.branch_scale is None else branch * self.branch_scale


def mixer_blocks(config: Any, plan: ShardPlan, tp: TPGroup,
                 moe: MoeShape | None) -> list[MixerBlock]:
    """Nemotron-H's layers, each the one mixer its layer_types name (models/mixer_block.py);
    Mamba-2's, Mamba's and Falcon Mamba's, every one a Mamba layer."""
    def mixer(kind: str) -> nn.Module:
        if kind == RECURRENT:
            return Mamba1Mixer(config, tp) if mamba1_of(config) else Mamba2Mixer(config, tp)
        if kind == ATTENTION:
            return Attention(config, plan, tp, rotates=False)
        if kind == "moe" and moe is not None:
            return SparseMoeBlock(config.hidden_size, moe, tp)
        if kind == "mlp":
            return MLP(config, plan, tp)
        raise ModelLoadError(f"layer kind {kind!r} is not supported (layer_types: "
                             f"{RECURRENT}, {ATTENTION}, mlp, moe)")

    return [MixerBlock(kind, mixer(kind), config.hidden_size, rms_norm_eps_of(config))
            for kind in config.layer_types]


def falcon_h1_layers(config: Any, plan: ShardPlan, tp: TPGroup) -> list[FalconH1Layer]:
    """Falcon-H1's layers: attention and its Mamba-2 layer side by side, then the MLP."""
    return [FalconH1Layer(config, Attention(config, plan, tp), FalconH1Mixer(config, tp),
                          MLP(config, plan, tp)) for _ in range(config.num_hidden_layers)]


def learned_positions(config: Any, offset: int) -> nn.Module:
    """The table of position embeddings added to the tokens': learned (GPT-2's, OPT's), or
    XGLM's fixed sinusoids; `offset` rows before position 0's."""
    rows = config.max_position_embeddings + offset
    if config.model_type == XGLM:
        return SinusoidalPositions(rows, config.hidden_size, config.pad_token_id)
    return nn.Embedding(rows, config.hidden_size)


class DecoderModel(nn.Module):
    def __init__(self, config: Any, max_positions: int, plan: ShardPlan, tp: TPGroup):
        super().__init__()
        flags = flags_of(config)
        self.embed_tokens = VocabParallelEmbedding(plan, config.hidden_size, tp)
        # Gemma multiplies the embeddings by sqrt(hidden_size), rounded to the model dtype;
        # Granite by its embedding_multiplier, as it is.
        self.embed_scale = config.hidden_size ** 0.5 \
            if flags.gemma or flags.gemma4 or flags.gemma3n else None
        self.embed_multiplier = embedding_multiplier_of(config)
        # Granite's multiplier scales transformers' inputs_embeds, Falcon-H1's (and XGLM's
        # scale) only the embeddings it looks up itself.
        self.multiplies_given_embeds = not flags.falcon_h1 and config.model_type != XGLM
        # BLOOM and NanoChat normalize the embeddings.
        self.embed_norm = decoder_norm(config, config.hidden_size) \
            if config.model_type == "bloom" or flags.nanochat else None
        # GPT-2's, GPT-BigCode's and OPT's learned positions, whole on every rank; XGLM's
        # fixed sinusoids, computed at load.
        self.position_offset = learned_position_offset(config)
        self.embed_positions = learned_positions(config, self.position_offset) \
            if flags.learned_positions else None
        moe = moe_shape_of(config)
        windows = [layer_window_of(config, i) for i in range(config.num_hidden_layers)]
        shapes = sharded_layer_shapes(config, tp.size)
        sources = kv_sources(config) or range(config.num_hidden_layers)
        linear = set(linear_attention_layers(config))
        self.rotates = [rotates_at(config, i) for i in range(config.num_hidden_layers)]
        indexers = indexer_kinds(config)
        self.layers = nn.ModuleList(
            mixer_blocks(config, plan, tp, moe) if flags.mixer_blocks else
            falcon_h1_layers(config, plan, tp) if flags.falcon_h1 else
            (Gemma3nLayer(config, Attention(config, plan, tp, windows[i],
                                            reads_earlier_kv=sources[i] != i,
                                            rotates=self.rotates[i]), i)
             for i in range(config.num_hidden_layers)) if flags.gemma3n else
            (DecoderLayer(config, plan, tp, moe if moe is not None and moe.is_sparse(i) else None,
                          windows[i], shapes[i] if shapes else None, sources[i] != i,
                          i in linear, attention_chunk_of(config, i), self.rotates[i],
                          indexers[i])
             for i in range(config.num_hidden_layers)))
        # Gemma 3n's AltUp streams: projected from the embeddings and back (models/gemma3n.py).
        self.altup = flags.gemma3n
        if self.altup:
            self.altup_projections = stream_projections(config)
            self.altup_unembed_projections = stream_projections(config)
        # Gemma 4 E2B and E4B (and Gemma 3n): a small input embedding per layer
        # (models/gemma4.py).
        per_layer = per_layer_input_width(config) if flags.gemma4 or flags.gemma3n else 0
        self.per_layer = per_layer > 0
        if self.per_layer:
            layers = config.num_hidden_layers
            self.embed_tokens_per_layer = nn.Embedding(config.vocab_size_per_layer_input,
                                                       layers * per_layer)
            self.per_layer_model_projection = nn.Linear(config.hidden_size, layers * per_layer,
                                                        bias=False)
            self.per_layer_projection_norm = RMSNorm(per_layer, rms_norm_eps_of(config))
        self.norm = decoder_norm(config, config.hidden_size)
        self.config, self.max_positions = config, max_positions
        # Computed, not loaded: the loader builds them (rotary_tables) on the model's device.
        # Built here, on the meta device, their arithmetic would run through torch's Python
        # references, whose first use imports torch._dynamo.
        self.rotary = self.rotary_local = None
        # Sliding layers rotate with their own base where the config gives one (Gemma 3).
        rotations = self._rotations()
        own_local = rotations is not None and rotations[0] != rotations[1]
        self.local_rope = [window is not None and own_local for window in windows]
        # Ministral 3: queries scaled by position past the pretraining context (Llama 4's).
        self.temperature = query_temperature(rope_parameters(config))
        # Llama 4: the layers without positional encoding scale queries by position.
        self.nope_temperature = (int(config.floor_scale), float(config.attn_scale)) \
            if flags.llama4 and getattr(config, "attn_temperature_tuning", False) else None

    def _rotations(self) -> tuple[tuple[int, dict], tuple[int, dict]] | None:
        """(head size, rope parameters) of full-attention layers and of sliding ones; None for
        a model whose layers do not rotate."""
        full_dim, local_dim = (head_dim_of(self.config, kind) for kind in LAYER_TYPES)
        if not full_dim or not any(self.rotates):
            return None
        full = rope_parameters(self.config)
        local = rope_parameters(self.config, "sliding_attention")
        if flags_of(self.config).nanochat:  # NanoChat turns q and k the other way
            full, local = ({**params, "backward": True} for params in (full, local))
        return (full_dim, full), (local_dim, local)

    def rotary_tables(self) -> tuple[RotaryEmbedding | None, RotaryEmbedding | None]:
        """The rotary tables of full-attention layers, and of sliding ones where they differ
        (else None), each over its layers' head size; none for an attention-free model."""
        rotations = self._rotations()
        if rotations is None:
            return None, None
        full, local = rotations
        return (RotaryEmbedding(full[0], self.max_positions, full[1]),
                None if local == full else RotaryEmbedding(local[0], self.max_positions, local[1]))

    def forward(self, input_ids, positions, kv_caches, meta, image_rows=(), embed_rows=()):
        """image_rows: (row, rows) pairs whose embeddings an image encoder's output replaces
        (after any embedding scale: the encoder's rows are the language model's inputs).
        Rows wider than the model carry, past its width, one more row per early layer that
        joins that layer's output (Qwen3-VL's DeepStack).
        embed_rows: (row, rows) pairs of a prompt given as embeddings, written where
        transformers takes `inputs_embeds`: its embedding module's output (Gemma's scale
        included), before what its model adds (Granite's multiplier, learned positions,
        BLOOM's norm), after what it applies to looked-up tokens only (Falcon-H1's
        multiplier)."""
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype).item()
        if self.embed_multiplier is not None and not self.multiplies_given_embeds:
            x = x * self.embed_multiplier
        for row, rows in embed_rows:
            x[row:row + rows.shape[0]] = rows.to(device=x.device, dtype=x.dtype)
        if self.embed_multiplier is not None and self.multiplies_given_embeds:
            x = x * self.embed_multiplier
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions + self.position_offset)
        if self.embed_norm is not None:
            x = self.embed_norm(x, None, meta.backend)[0]
        width = x.shape[-1]
        deep = []
        for row, rows in image_rows:
            rows = rows.to(device=x.device, dtype=x.dtype)
            x[row:row + rows.shape[0]] = rows[:, :width]
            if rows.shape[1] > width:
                deep.append((row, rows[:, width:]))
        rope = None if self.rotary is None else self.rotary(positions, x.dtype, meta.backend)
        rope_local = (None if self.rotary_local is None
                      else self.rotary_local(positions, x.dtype, meta.backend))
        if self.temperature is not None:
            rope = scaled_queries(rope, positions, x.dtype, self.temperature)
            if rope_local is not None:
                rope_local = scaled_queries(rope_local, positions, x.dtype, self.temperature)
        own = per_layer_inputs(self, input_ids, x) if self.per_layer else None
        nope = None if self.nope_temperature is None else \
            nope_query_scale(positions, *self.nope_temperature)
        if self.altup:
            x = expand_streams(self.altup_projections, x)
        residual = None
        for index, (layer, local, rotates, kv_cache) in enumerate(zip(
                self.layers, self.local_rope, self.rotates, kv_caches, strict=True)):
            turn = (rope_local if local else rope) if rotates else nope
            x, residual = layer(x, residual, turn, kv_cache, meta,
                                None if own is None else own[:, index])
            for row, rows in deep:  # x is the layer's output not yet in the residual stream
                if rows.shape[1] > index * width:
                    x[row:row + rows.shape[0]] += rows[:, index * width:(index + 1) * width]
        if self.altup:
            x = collapse_streams(self.altup_unembed_projections, x)
        return self.norm(x, residual, meta.backend)[0]


class CausalLM(nn.Module):
    """Embeddings, decoder stack and LM head; `forward` returns hidden states, not logits,
    so only the rows that will be sampled pay for the vocabulary projection.

    Under tensor parallelism (`tp`, `plan`) it holds one rank's shard; every rank computes
    the full logits (the LM head's vocabulary slices gathered).
    """

    def __init__(self, config: Any, max_positions: int, plan: ShardPlan | None = None,
                 tp: TPGroup | None = None):
        super().__init__()
        self.config = config
        self.plan = plan or ShardPlan.for_model(config)
        self.tp = tp or TPGroup()
        self.model = DecoderModel(config, max_positions, self.plan, self.tp)
        self.lm_head = nn.Linear(config.hidden_size, self.plan.vocab_per_rank,
                                 bias=flags_of(config).phi or flags_of(config).gptj or
                                 bool(getattr(config, "lm_head_bias", False)))
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        # A sequence classifier's head: one row per label, whole on every rank.
        classifier = classifier_of(config)
        self.score = None if classifier is None else \
            nn.Linear(config.hidden_size, len(classifier.labels), bias=False)
        # Gemma 2: logits pass through softcap * tanh(logits / softcap).
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        # Granite divides its logits by logits_scaling (HyperCLOVA X multiplies them).
        self.logits_divisor = (float(config.logits_scaling) if flags_of(config).granite
                               and not flags_of(config).logits_times_scaling else None)
        # Cohere multiplies them by logit_scale, Falcon-H1 by lm_head_multiplier.
        self.logit_scale = float(config.logit_scale) if flags_of(config).cohere else \
            float(config.lm_head_multiplier) if flags_of(config).falcon_h1 else \
            float(config.logits_scaling) if flags_of(config).logits_times_scaling else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVLayer], meta: AttentionMetadata,
                image_rows: list[tuple[int, torch.Tensor]] = (),
                embed_rows: list[tuple[int, torch.Tensor]] = ()) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta, image_rows, embed_rows)


    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.tp.size > 1:
            logits = self.tp.all_gather_last(logits)[:, :self.plan.vocab_size]
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        if self.logits_divisor is not None:
            logits = logits / self.logits_divisor
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        return logits


def prompt_embeds_refusal(config: Any) -> str | None:
    """Why this model cannot take a prompt given as embeddings (None: it can)."""
    if (flags_of(config).gemma4 or flags_of(config).gemma3n) and \
            per_layer_input_width(config):
        return ("it reads an embedding per layer from each prompt token's id (Gemma 4's "
                "per-layer inputs), which embeddings do not give")
    return None
