"""Shapes of the models the operator knows without loading them, and what tensor parallelism
they allow.

Tensor parallelism splits attention heads, KV heads and the MLP's intermediate size across the
ranks, so a size that does not divide them can never start. For the built-in models the shape
is known here, so the CRD refuses such a spec at `kubectl apply` and the operator with
InvalidSpec; any other model is checked by the engine when it loads the model's config.
"""

from __future__ import annotations

from tokenmill.engine.contract.config import DEFAULT_MODEL, TENSOR_PARALLEL_SIZES
from tokenmill.engine.contract.model_shape import ModelShape

# Built-in model names (model.uri) and their shapes, from the models' own config.json.
KNOWN_MODELS = {DEFAULT_MODEL: ModelShape(heads=9, kv_heads=3, intermediate_size=1536)}


def allowed_sizes(shape: ModelShape) -> list[int]:
    """The API's tensorParallelSize values this model can run with."""
    return [tp for tp in TENSOR_PARALLEL_SIZES if shape.allows(tp)]


def tp_problem(uri: str, tp: int) -> str | None:
    """Why tensorParallelSize `tp` cannot shard the model at `uri`, or None (fine, or unknown)."""
    shape = KNOWN_MODELS.get(uri)
    if shape is None or shape.allows(tp):
        return None
    sizes = ", ".join(map(str, allowed_sizes(shape)))
    return (f"spec.engine.tensorParallelSize: {tp} does not divide the attention heads of {uri} "
            f"({shape.describe()}); it runs with tensorParallelSize {sizes}")


def tp_rules() -> list[dict[str, str]]:
    """CEL rules of the spec, one per known model: its tensorParallelSize must be one it allows.

    Guarded with has(): the API server also evaluates the rules on defaults as written; a spec
    without model.uri serves the default model, as the engine does. A size the API does not
    offer is the field's own rule's to report (one message per bad value)."""
    uri = f"(has(self.model) && has(self.model.uri) ? self.model.uri : '{DEFAULT_MODEL}')"
    offered = ", ".join(map(str, TENSOR_PARALLEL_SIZES))
    rules = []
    for name, shape in KNOWN_MODELS.items():
        sizes = allowed_sizes(shape)
        listed = ", ".join(map(str, sizes))
        rules.append({
            "rule": f"!has(self.engine) || !has(self.engine.tensorParallelSize) || "
                    f"!(self.engine.tensorParallelSize in [{offered}]) || "
                    f"self.engine.tensorParallelSize in [{listed}] || {uri} != '{name}'",
            "message": f"engine.tensorParallelSize must divide the attention heads of {name} "
                       f"({shape.describe()}): use {' or '.join(map(str, sizes))}",
        })
    return rules
