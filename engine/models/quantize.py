"""Weight quantization at load (`--quantization int8|fp8`) and the bytes the weights take.

Quantized: the q/k/v, o, gate/up and down projections, which hold most of a model's weights
and most of the bytes a decode step reads. Kept in the model dtype: embeddings, norms and the
LM head. The LM head writes the logits directly; in small models with large vocabularies
(SmolLM2: 49152 x 576, a fifth of its weights) its error dominates the logits' error, and
vLLM keeps it unquantized too.
"""

from __future__ import annotations

from torch import nn

from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.layers.fp8_matmul import FP8_DTYPE
from tokenmill.engine.layers.quantized_linear import WEIGHT_DTYPES, quantize_linear
from tokenmill.engine.models.decoder import CausalLM


def check_quantization(method: str | None) -> None:
    """ConfigError for a method this torch can never run, before any weight is loaded."""
    if method is not None and method not in WEIGHT_DTYPES:
        raise ConfigError("quantization", f"{method!r} is not one of {sorted(WEIGHT_DTYPES)}")
    if method == "fp8" and FP8_DTYPE is None:
        raise ConfigError("quantization", "fp8 needs torch's float8 dtypes, which this torch "
                                          "build lacks; use int8 or a newer torch")


def quantize_model(model: CausalLM, method: str) -> None:
    """Replace the decoder layers' projections by their quantized twins, one at a time.

    Each full-precision weight is released as its replacement takes its place, so memory
    peaks near the unquantized model's size plus one quantized projection.
    """
    for parent in list(model.model.layers.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, quantize_linear(child, method))


def weight_bytes(module: nn.Module) -> int:
    """Bytes of the weights in memory: parameters and persistent buffers at their stored
    size (quantized weights and their scales included), a tied tensor counted once. Tables
    computed at load (rotary cos/sin, non-persistent) are not weights."""
    sizes = {t.data_ptr(): t.nbytes for t in module.state_dict(keep_vars=True).values()}
    return sum(sizes.values())
