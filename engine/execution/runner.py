"""Model runner: owns the model and the KV pool tensors, turns a scheduled step into logits."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from tokenmill.engine.contract.model_shape import linear_attention_layers, recurrent_shape_of
from tokenmill.engine.execution.decode_graphs import (
    DecodeGraphs,
    graph_batch_sizes,
    graph_decode_splits,
)
from tokenmill.engine.execution.kv_layout import SCALE_DTYPE, KVCacheLayout
from tokenmill.engine.execution.kv_offload import KVOffload
from tokenmill.engine.execution.lora_slots import LoRASlots
from tokenmill.engine.execution.pooled_rows import sum_spans
from tokenmill.engine.execution.prompt_scores import score_rows
from tokenmill.engine.execution.recurrent_states import RecurrentStates
from tokenmill.engine.execution.step_buffers import StepBuffers
from tokenmill.engine.execution.step_inputs import StepInputs
from tokenmill.engine.execution.weight_offload import DroppedWeights, HostWeights
from tokenmill.engine.execution.zeroed import zeroed
from tokenmill.engine.layers.kv_layer import KVLayer
from tokenmill.engine.layers.state_layer import KVAndState, StateLayer
from tokenmill.engine.layers.to_device import list_to_device
from tokenmill.engine.models.decoder import CausalLM
from tokenmill.engine.models.images import encode_images
from tokenmill.engine.models.loader import (
    checkpoint_tensors,
    load_named_weights,
    reload_weights,
)
from tokenmill.engine.models.source import ModelSource


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, layout: KVCacheLayout,
                 device: torch.device, attention_backend: str = "torch",
                 num_host_blocks: int = 0, lora: LoRASlots | None = None,
                 state_slots: int = 0, state_dtype: torch.dtype = torch.float32):
        """`state_slots`: sequences whose recurrent states the pool holds at once, for a
        model with linear-attention layers (--max-num-seqs; execution/recurrent_states.py),
        in `state_dtype` (--mamba-ssm-cache-dtype)."""
        self.model = model
        self.state_slots, self.state_dtype = state_slots, state_dtype
        self.attention_backend = attention_backend  # "torch" or "triton", already resolved
        self.device = device
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = layout.block_size
        self.num_host_blocks = num_host_blocks
        self._allocate_kv()
        # Called with each step's inputs before it runs: rank 0 sends them to the other ranks.
        self.on_step: Callable[[StepInputs], None] | None = None
        self.buffers = StepBuffers(device)
        self.graphs: DecodeGraphs | None = None
        # The LoRA adapters' device slots (--enable-lora), set before graphs are captured.
        self.lora = lora
        self.verify_graphs: DecodeGraphs | None = None  # speculative verify steps' graphs
        # What capture_decode_graphs was given, to capture again after sleep mode.
        self._graph_shape: tuple[int, ...] | None = None
        # Sleep mode: the weights while they are in host memory (weight_offload.py).
        self.host_weights: HostWeights | None = None
        # Sleep level 2's freed weights, read again from `weights_source` when woken.
        self.dropped_weights: DroppedWeights | None = None
        self.weights_source: ModelSource | None = None  # the checkpoint the weights are from
        # The latest step's prompt-token scores (prompt_scores.py), None without any.
        self.prompt_scores: torch.Tensor | None = None
        # The latest step's pooled hidden states, [len(pool_spans), hidden] float32 on the host
        # (pool_spans of StepInputs); None without any.
        self.pooled: torch.Tensor | None = None
        # The latest step's sampled tokens on the device, which the next step's input ids may
        # name (StepInputs.sampled_ids); set by the core after it samples.
        self.sampled: torch.Tensor | None = None
        # Seconds of each start-up phase on this rank, set by build_runner (rank.py).
        self.startup_seconds: dict[str, float] = {}
        # The image encoder of a checkpoint that reads images (models/images.py), rank 0's.
        self.image_encoder: torch.nn.Module | None = None

    def _allocate_kv(self) -> None:
        """The KV pool (with its scales when quantized), its per-layer views and host tier."""
        layout, num_blocks, device = self.layout, self.num_blocks, self.device
        # Zeroed, not empty: attention reads masked-out slots too (0 * NaN would be NaN).
        self.kv_pool = zeroed(layout.values_shape(num_blocks), layout.dtype, device)
        self.kv_scales = (zeroed(layout.scales_shape(num_blocks), SCALE_DTYPE, device)
                          if layout.quantized else None)
        linear = linear_attention_layers(self.model.config)
        ranks = self.model.tp.size if linear else 1
        self.states = RecurrentStates(recurrent_shape_of(self.model.config).sharded(ranks),
                                      len(linear),
                                      max(self.state_slots, 1), self.model.lm_head.weight.dtype,
                                      device, self.state_dtype) if linear else None
        self.kv_caches = [self._layer_caches(i, linear) for i in range(layout.model_layers)]
        self.offload = KVOffload(self._pool_tensors(), self.num_host_blocks, device) \
            if self.num_host_blocks else None

    def _layer_caches(self, layer: int, linear: list[int]) -> KVLayer | StateLayer | \
            KVAndState | None:
        """Layer `layer`'s view of the KV pool, of the state pool (a state-keeping layer's),
        both (Falcon-H1's) or none (a feed-forward block alone)."""
        kv = None if self.layout.pool_layer(layer) is None else self._layer_view(layer)
        if layer not in linear:
            return kv
        state = self.states.layer(linear.index(layer))
        return state if kv is None else KVAndState(kv, state)

    # ---- sleep mode: each call comes to every tensor-parallel rank ------------------------

    def release_kv(self) -> None:
        """Free the KV pool, its host tier and the graphs that address them; the contents are
        gone (the prefix cache must have forgotten every block)."""
        self.graphs = self.verify_graphs = None
        self.kv_pool = self.kv_scales = self.offload = self.states = None
        self.kv_caches = []
        self._free_device_cache()

    def restore_kv(self) -> None:
        """A zeroed pool of the same size; graphs again once the weights are back too."""
        if self.kv_pool is None:
            self._allocate_kv()
        self._capture_again()

    def offload_weights(self) -> None:
        """Move the weights (LoRA slots and an image encoder included) to host memory; a CPU
        model's already are (nothing changes)."""
        if self.device.type == "cpu" or self.host_weights is not None:
            return
        self.graphs = self.verify_graphs = None
        # An image encoder, where the checkpoint has one, is a module of its own.
        modules = [m for m in (self.model, self.image_encoder) if m is not None]
        self.host_weights = HostWeights(modules, self.device)
        self._free_device_cache()

    def drop_weights(self) -> None:
        """Sleep level 2: free the checkpoint's weights with no copy kept (on the CPU too);
        restore_weights reads them from `weights_source` again."""
        if self.dropped_weights is not None or self.host_weights is not None:
            return
        self.graphs = self.verify_graphs = None
        self.dropped_weights = DroppedWeights(checkpoint_tensors(self.model).values())
        self._free_device_cache()

    def restore_weights(self) -> None:
        if self.host_weights is not None:
            self.host_weights.restore()
            self.host_weights = None
        if self.dropped_weights is not None:
            self.dropped_weights.restore()
            self.dropped_weights = None
            reload_weights(self.model, self.weights_source)
        self._capture_again()

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors named as the checkpoint names them into the weights, in place."""
        load_named_weights(self.model, weights)

    def reload_weights(self, source: ModelSource) -> None:
        """Read another checkpoint of the same shapes into the weights, in place (graphs
        captured over them stay valid); later level-2 wake-ups read it too."""
        reload_weights(self.model, source)
        self.weights_source = source

    def _capture_again(self) -> None:
        """Capture the decode graphs again, over the new addresses, once weights and pool are
        both on the device (a runner that never captured any captures none)."""
        if self._graph_shape is None or self.graphs is not None or self.kv_pool is None \
                or self.host_weights is not None or self.dropped_weights is not None:
            return
        self.buffers.frozen = False
        self.capture_decode_graphs(*self._graph_shape)

    def _free_device_cache(self) -> None:
        """Hand what torch's allocator caches back to the device, for another process."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def encode_images(self, pixels: list[torch.Tensor],
                      sizes: list[tuple[int, int] | None]) -> list[torch.Tensor]:
        """The image encoder's rows [rows, hidden] of each image (its pixel values, and its
        size before processing)."""
        return encode_images(self.image_encoder, [p.to(self.device) for p in pixels], sizes)

    def _layer_view(self, layer: int) -> KVLayer:
        """K and V of one layer; one plane (latent attention) is both. A layer narrower than
        the pool's rows (Gemma 4's) sees the first part of each row as its heads; a layer that
        reads an earlier one's keys and values (Gemma 4's shared KV) sees that one's."""
        pooled = self.layout.pool_layer(layer)  # an earlier layer's, where they share
        k, v = self.kv_pool[pooled].expand(2, *self.kv_pool.shape[2:])
        heads, dim = self.layout.layer_shape(layer)
        if (heads, dim) != tuple(k.shape[-2:]):
            k, v = (t.flatten(-2)[..., :heads * dim].unflatten(-1, (heads, dim)) for t in (k, v))
        if self.kv_scales is None:
            return KVLayer(k, v)
        k_scale, v_scale = self.kv_scales[pooled].expand(2, *self.kv_scales.shape[2:])
        return KVLayer(k, v, k_scale[..., :heads], v_scale[..., :heads])

    def _pool_tensors(self) -> list[torch.Tensor]:
        """The pool's values (as bytes when quantized: index kernels do not cover float8
        everywhere) and scales, each [layers, 2, blocks, ...]."""
        pool = self.kv_pool.view(torch.uint8) if self.layout.quantized else self.kv_pool
        return [pool] if self.kv_scales is None else [pool, self.kv_scales]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of shared blocks (values and scales), before the step that writes into
        the copies."""
        if copies:
            src = list_to_device([s for s, _ in copies], torch.long, self.device)
            dst = list_to_device([d for _, d in copies], torch.long, self.device)
            for pool in self._pool_tensors():
                pool[:, :, dst] = pool[:, :, src]

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Hand the step to the other ranks (on_step), then run it here; return each sequence's
        logit rows, in order (StepInputs.num_logits: its last new token's where it samples;
        every new token's with all_logits)."""
        if inputs.sampled_ids:
            inputs.num_sampled = self.sampled.shape[0]
        if self.on_step is not None:
            self.on_step(inputs)
        return self.run(inputs)

    @torch.inference_mode()
    def capture_decode_graphs(self, max_num_seqs: int, max_num_batched_tokens: int,
                              max_model_len: int, verify_query_len: int = 0,
                              verify_max_seqs: int = 0,
                              sizes: tuple[int, ...] | None = None) -> None:
        """Capture the decode step for every batch-size bucket (decode_graphs.py), and with
        verify_query_len (K+1 of speculative decoding) the verify step for buckets up to
        verify_max_seqs sequences. The input buffers are sized for the largest step first:
        graphs keep their addresses."""
        if self.attention_backend != "triton":
            raise ValueError("decode graphs need the Triton attention backend")
        self._graph_shape = (max_num_seqs, max_num_batched_tokens, max_model_len,
                             verify_query_len, verify_max_seqs, sizes)
        max_blocks = -(-max_model_len // self.block_size) + 1
        verify_sizes = graph_batch_sizes(verify_max_seqs) if verify_query_len > 1 else []
        verify_tokens = verify_sizes[-1] * verify_query_len if verify_sizes else 0
        self.buffers.reserve(max(max_num_batched_tokens, verify_tokens), max_num_seqs,
                             max_blocks)
        kv_heads = min((cache.k.shape[2] for cache in (
            c.kv if isinstance(c, KVAndState) else c for c in self.kv_caches)
            if isinstance(cache, KVLayer)), default=1)  # 1: attention-free, nothing to split

        def forward(num_seqs: int, query_len: int) -> torch.Tensor:
            views = self.buffers.views(num_seqs * query_len, num_seqs)
            if self.lora is not None:  # a graph always computes the delta: the slots vary
                self.lora.set_step(views.lora_slots, active=True)
            meta = self.buffers.metadata(views, [query_len] * num_seqs, [query_len] * num_seqs,
                                         self.attention_backend, max_seq_len=max_model_len,
                                         decode_splits=graph_decode_splits(
                                             num_seqs, kv_heads, max_model_len),
                                         unowned_rows=query_len > 1)
            return self.model(views.input_ids, views.positions, self.kv_caches, meta)

        decode_sizes = graph_batch_sizes(max_num_seqs, sizes)
        self.graphs = DecodeGraphs(self.buffers, forward, decode_sizes, self.device) \
            if decode_sizes else None
        if verify_sizes:
            self.buffers.frozen = False  # the verify graphs' views lie in the same buffers
            self.verify_graphs = DecodeGraphs(self.buffers, forward, verify_sizes, self.device,
                                              query_len=verify_query_len)

    def _sampled_tokens(self, count: int) -> torch.Tensor:
        """The previous step's sampled tokens on this rank's device: rank 0 sampled them, the
        other ranks receive them from it (a broadcast queued on the device: no host wait)."""
        tp = getattr(self.model, "tp", None)
        if tp is not None and tp.size > 1:
            if tp.rank != 0:
                self.sampled = torch.empty(count, dtype=torch.long, device=self.device)
            tp.broadcast(self.sampled)
        return self.sampled

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        if self.offload is not None:
            self.offload.run(inputs.kv_to_host, inputs.kv_to_device)
        self.copy_blocks(inputs.block_copies)
        states = None
        if self.states is not None:  # sequences starting in this step start from zero
            states = inputs.state_slots
            self.states.prepare([slot for slot, context, new in zip(
                states, inputs.seq_lens, inputs.query_lens, strict=True)
                if context == new], inputs.state_copies)
        if self.lora is not None:
            self.lora.apply(inputs.lora_loads)
        lora_slots = inputs.token_lora_slots()
        sampled = self._sampled_tokens(inputs.num_sampled) if inputs.sampled_ids else None
        self.prompt_scores = self.pooled = None
        # Every row is its sequence's last and samples (an embedding's row samples nothing).
        decode_only = all(n == 1 for n in inputs.query_lens) and \
            all(n == 1 for n in inputs.num_logits)
        hidden = last_rows = None
        if not (inputs.all_logits or inputs.prompt_rows.rows or inputs.pool_spans
                or inputs.image_rows or inputs.embed_rows or inputs.visible_until
                or inputs.grid_positions):
            graphs = self.graphs if decode_only else self.verify_graphs
            if graphs is not None:
                hidden = graphs.run(inputs.input_ids, inputs.positions, inputs.slots,
                                    inputs.seq_lens, inputs.query_lens, inputs.block_tables,
                                    lora_slots, sampled, states)
        if hidden is None:
            views = self.buffers.fill(inputs.input_ids, inputs.positions, inputs.slots,
                                      inputs.seq_lens, inputs.query_lens, inputs.block_tables,
                                      lora_slots, sampled, states)
            if self.lora is not None:
                self.lora.set_step(views.lora_slots, active=lora_slots is not None)
            meta = self.buffers.metadata(views, inputs.seq_lens, inputs.query_lens,
                                         self.attention_backend)
            if inputs.visible_until:
                meta.visible_until = list_to_device(inputs.visible_until, torch.long,
                                                    self.device)
            meta.state_slots_list = inputs.state_slots
            typed = {} if not inputs.token_types else {"token_types": list_to_device(
                inputs.token_types, torch.long, self.device)}
            if inputs.image_rows:
                typed["image_rows"] = inputs.image_rows
            if inputs.embed_rows:
                typed["embed_rows"] = inputs.embed_rows
            positions = views.positions if not inputs.grid_positions else list_to_device(
                inputs.grid_positions, torch.long, self.device)
            hidden = self.model(views.input_ids, positions, self.kv_caches, meta, **typed)
            last_rows = views.query_start[1:] - 1
        if inputs.prompt_rows.rows:
            self.prompt_scores = score_rows(self.model, hidden, inputs.prompt_rows)
        if inputs.pool_spans:
            self.pooled = sum_spans(hidden, inputs.pool_spans, self.model.score)
        if inputs.all_logits or decode_only:  # decode: every row is its sequence's last
            return self.model.logits(hidden)
        rows = inputs.logit_rows()
        if rows is None and last_rows is not None:
            return self.model.logits(hidden[last_rows])
        if rows is None:  # each sequence's last row
            rows = list(itertools.accumulate(inputs.query_lens, initial=-1))[1:]
        return self.model.logits(hidden[list_to_device(rows, torch.long, hidden.device)])
