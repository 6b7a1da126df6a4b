"""--runner and --pooler-config: which API a model is served for, and how an embedding model
turns a prompt's hidden states into one vector (a classifier's: into its labels' scores).
vLLM's names and JSON shape, checked without torch (the operator refuses a bad value at
`kubectl apply` with the same rules).

  {"pooling_type": "LAST" | "MEAN" | "CLS", "normalize": true | false}

Keys left out keep the model's own setting (its sentence-transformers files), else LAST and
normalized, as vLLM embeds a decoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

RUNNERS = ("auto", "generate", "pooling")
# What a model serves (vLLM's task names), in the words a refusal uses: what it is served
# for, and what it lacks for a request of another task.
TASK_SERVED = {"generate": "generation (--runner generate)",
               "embed": "embeddings (--runner pooling)",
               "classify": "classification (--runner pooling, a sequence classifier)"}
TASK_LACKS = {"generate": "generates no text", "embed": "makes no embeddings",
              "classify": "has no classification head"}
POOLING_TYPES = ("LAST", "MEAN", "CLS")
KEYS = {"pooling_type", "normalize"}


class PoolerConfigError(ValueError):
    """What is wrong with --pooler-config, in its own keys' terms."""


@dataclass(frozen=True)
class Classifier:
    """A sequence classifier's head (reward models, cross-encoder rerankers, text
    classifiers): one score per label, from the pooled hidden state. Probabilities are the
    softmax over the labels, or each label's sigmoid where there is one label or the labels
    are independent (transformers' multi_label_classification)."""

    labels: tuple[str, ...]
    multi_label: bool = False
    # A cross-encoder's pair is read as the two texts joined into one (a causal LM made a
    # reranker: vLLM's use_pad_token false), not through the tokenizer's pair encoding.
    joins_pairs: bool = False
    # vLLM's classifier_from_token: the head is the LM head's rows of these tokens (each a
    # label), or with `two_way` the second's row less the first's (one label: the second
    # token's share of the two's softmax, as Qwen3-Reranker answers yes against no).
    from_tokens: tuple[str, ...] = ()
    two_way: bool = False
    # BERT's cross-encoders read a pair's second text as token type 1 (segment embeddings),
    # as the tokenizer's pair encoding marks it.
    token_types: bool = False

    @property
    def sigmoid(self) -> bool:
        return self.multi_label or len(self.labels) == 1


@dataclass(frozen=True)
class Pooler:
    """How a prompt becomes its embedding: which hidden states (the last token's, the mean of
    all, or the first token's), and whether the vector is scaled to unit length. A
    classifier's pooled state goes through its head instead (`classifier`)."""

    pooling_type: str = "LAST"
    normalize: bool = True
    classifier: Classifier | None = None

    @property
    def task(self) -> str:
        """vLLM's name of what the model serves: embed, or classify."""
        return "embed" if self.classifier is None else "classify"

    def updated(self, overrides: dict[str, Any]) -> Pooler:
        return Pooler(overrides.get("pooling_type", self.pooling_type),
                      overrides.get("normalize", self.normalize), self.classifier)


def parse_overrides(text: str | dict[str, Any] | None) -> dict[str, Any]:
    """The keys --pooler-config sets (JSON text or its decoded object); PoolerConfigError if
    invalid."""
    if text is None:
        return {}
    data = text
    if isinstance(text, str):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PoolerConfigError(f"is not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(data, dict):
        raise PoolerConfigError("must be a JSON object")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise PoolerConfigError(f"unknown keys {unknown} (known: {sorted(KEYS)})")
    kind = data.get("pooling_type")
    if kind is not None:
        if not isinstance(kind, str) or kind.upper() not in POOLING_TYPES:
            raise PoolerConfigError(f"pooling_type {kind!r} is not one of "
                                    f"{', '.join(POOLING_TYPES)}")
        data = {**data, "pooling_type": kind.upper()}
    else:
        data = {k: v for k, v in data.items() if k != "pooling_type"}
    if "normalize" in data and not isinstance(data["normalize"], bool):
        raise PoolerConfigError(f"normalize must be true or false, got {data['normalize']!r}")
    return data
