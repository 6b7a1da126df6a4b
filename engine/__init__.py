"""The tokenmill inference engine.

`LLM` and `SamplingParams` import torch, so they load lazily: importing
`tokenmill.engine.config` (as the operator does) stays free of torch.
"""

from typing import TYPE_CHECKING, Any

from tokenmill.engine.config import EngineConfig

__all__ = ["LLM", "SamplingParams", "EngineConfig"]

if TYPE_CHECKING:
    from tokenmill.engine.llm import LLM
    from tokenmill.engine.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from tokenmill.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from tokenmill.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
