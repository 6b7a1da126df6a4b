"""The tokenmill inference engine.

`LLM`, `SamplingParams`, `BeamSearchParams` and `LoRARequest` import torch, so they load
lazily: importing `tokenmill.engine.contract.config` (as the operator does) stays free of
torch.
"""

from typing import TYPE_CHECKING, Any

from tokenmill.engine.contract.config import EngineConfig

__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "LoRARequest", "EngineConfig"]

if TYPE_CHECKING:
    from tokenmill.engine.core.beam_search import BeamSearchParams
    from tokenmill.engine.core.sampling_params import SamplingParams
    from tokenmill.engine.frontend.llm import LLM
    from tokenmill.engine.frontend.lora_request import LoRARequest


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from tokenmill.engine.frontend.llm import LLM

        return LLM
    if name == "SamplingParams":
        from tokenmill.engine.core.sampling_params import SamplingParams

        return SamplingParams
    if name == "LoRARequest":
        from tokenmill.engine.frontend.lora_request import LoRARequest

        return LoRARequest
    if name == "BeamSearchParams":
        from tokenmill.engine.core.beam_search import BeamSearchParams

        return BeamSearchParams
    raise AttributeError(name)
