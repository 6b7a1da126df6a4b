"""This rank's LoRA adapters: the model's projections wrapped with device slot pools, the
adapters' weights written into slots as the core assigns them, and a host cache of adapters
read from disk.

The core decides which adapter sits in which slot (`StepInputs.lora_loads`); every rank reads
the adapter's files itself from the same local directory and writes its own shards: A whole
and B's rows split like the base weight's rows for column-parallel layers (q/k/v, gate/up), A's
columns split like the base weight's input columns for row-parallel ones (o, down), whose
partial deltas join the layer's existing all-reduce. The host cache keeps `capacity` adapters,
least recently used out first; a file changed on disk is read again.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import torch

from tokenmill.engine.layers.lora import LoRAContext, LoRALinear
from tokenmill.engine.models.decoder import CausalLM
from tokenmill.engine.models.lora_adapter import WEIGHTS_FILE, LoRAWeights, load_adapter

# Which wrapped projection serves each adapter target, and its part there.
TARGETS = {"q_proj": ("self_attn", "qkv_proj", 0), "k_proj": ("self_attn", "qkv_proj", 1),
           "v_proj": ("self_attn", "qkv_proj", 2), "o_proj": ("self_attn", "o_proj", 0),
           "gate_proj": ("mlp", "gate_up_proj", 0), "up_proj": ("mlp", "gate_up_proj", 1),
           "down_proj": ("mlp", "down_proj", 0)}
ROW_PARALLEL = {"o_proj", "down_proj"}


def wrap_model(model: CausalLM, context: LoRAContext) -> list[dict[str, LoRALinear]]:
    """Wrap every decoder layer's projections; returns each layer's wrappers by name. A
    mixture-of-experts layer has no dense MLP: only its attention is wrapped."""
    layers = []
    for layer in model.model.layers:
        wrapped = {}
        for block_name, attr, _ in TARGETS.values():
            block = getattr(layer, block_name, None)
            if hasattr(block, attr) and attr not in wrapped:
                wrapped[attr] = LoRALinear(getattr(block, attr), context)
                setattr(block, attr, wrapped[attr])
        layers.append(wrapped)
    return layers


class LoRAHostCache:
    """Adapters read from disk, by directory; at most `capacity`, least recently used out.
    The server checks a new adapter on a worker thread while the engine loop reads adapters
    for its steps: the entries change under a lock, and a read from disk happens outside it."""

    def __init__(self, capacity: int, model_config: Any, max_rank: int):
        self.capacity = capacity
        self.model_config = model_config
        self.max_rank = max_rank
        self._entries: OrderedDict[str, tuple[tuple[int, int], LoRAWeights]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, directory: str, name: str | None = None) -> LoRAWeights:
        """The adapter in `directory`, checked against the model (LoRAAdapterError if not
        servable); `name` is what error messages call it."""
        stamp = _stamp(directory)
        with self._lock:
            entry = self._entries.get(directory)
            if entry is not None and entry[0] == stamp:
                self._entries.move_to_end(directory)
                return entry[1]
        weights = load_adapter(name or os.path.basename(directory.rstrip("/")), directory,
                               self.model_config, self.max_rank)
        with self._lock:
            self._entries[directory] = (stamp, weights)
            self._entries.move_to_end(directory)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return weights

    def __contains__(self, directory: str) -> bool:
        return directory in self._entries


def _stamp(directory: str) -> tuple[int, int]:
    """When and how large the weights file is: a changed file is read again."""
    try:
        st = os.stat(os.path.join(directory, WEIGHTS_FILE))
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


class LoRASlots:
    """The device side of LoRA on one rank: the wrapped model's pools and what is in them."""

    def __init__(self, model: CausalLM, max_loras: int, max_rank: int, cpu_capacity: int,
                 backend: str):
        # The embeddings stay in the model dtype whatever quantization does to the linears.
        self.context = LoRAContext(max_loras, max_rank, backend,
                                   model.model.embed_tokens.weight.dtype)
        self.layers = wrap_model(model, self.context)
        self.plan = model.plan
        self.cache = LoRAHostCache(cpu_capacity, model.config, max_rank)
        self.loads = 0  # adapters written into a slot, for tests and logs

    def apply(self, loads: list[tuple[int, str]]) -> None:
        """Write each (slot, directory) adapter into its slot, before the step runs."""
        for slot, directory in loads:
            self.load(slot, self.cache.get(directory))

    @torch.no_grad()
    def load(self, slot: int, weights: LoRAWeights) -> None:
        for wrapped in self.layers:
            for layer in wrapped.values():
                layer.clear_slot(slot)
        for (index, kind), module in weights.modules.items():
            _, attr, part = TARGETS[kind]
            layer = self.layers[index][attr]
            a, b = module.a.float(), module.b.float() * module.scale
            name = f"layer.{kind}.weight"  # what ShardPlan.shard splits by
            if kind in ROW_PARALLEL:
                a = self.plan.shard(name, a)
            else:
                b = self.plan.shard(name, b)
            dtype = layer.a_pool.dtype
            layer.set_part(slot, part, a.to(dtype), b.to(dtype))
        self.loads += 1

    def set_step(self, token_slots: torch.Tensor, active: bool) -> None:
        self.context.set_step(token_slots, active)
