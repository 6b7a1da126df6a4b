"""vLLM's LLM() options beyond EngineConfig's, so a vLLM script's constructor runs unchanged:
those that change nothing here (the values accepted; `tokenmill serve` takes the same as
flags), those that pick the runner, and those that set the default sampling parameters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.contract.server_flags import GENERATION_CONFIG_KEYS, graph_options
from tokenmill.engine.core.generation_config import checked_source, sampling_defaults

ANY = None
# Option: the values that change nothing here (ANY: every value).
NO_EFFECT: dict[str, Any] = {
    "disable_log_stats": ANY,          # no periodic statistics are logged
    "disable_custom_all_reduce": ANY,  # tensor-parallel ranks use torch.distributed only
    "enable_expert_parallel": ANY,     # experts are split by width over the TP ranks
    "fully_sharded_loras": ANY,        # adapters are split over the TP ranks as their layers
    "swap_space": ANY,                 # a preempted request is recomputed, not swapped
    "max_seq_len_to_capture": ANY,     # decode graphs capture steps whatever the length
    "allowed_local_media_path": ANY,   # LLM.chat reads the local images it is given
    "use_tqdm_on_load": ANY,           # loading shows its progress under show_progress
    "tokenizer_mode": {"auto", "hf", "slow", "mistral"},  # Hugging Face's files are read
    "load_format": {"auto", "safetensors", "pt", "mistral", "gguf"},
    "distributed_executor_backend": {None, "mp"},  # TP ranks are local processes
    "cpu_offload_gb": {0},
    "pipeline_parallel_size": {1},
    "data_parallel_size": {1},
}
# vLLM's names of options EngineConfig calls otherwise.
RENAMED = {"kv_cache_memory_bytes": "kv_cache_memory", "override_pooler_config": "pooler_config"}
# vLLM's older --task and newer --convert name the runner.
RUNNER_OF = {"auto": None, "generate": "generate", "none": None, "embed": "pooling",
             "classify": "pooling", "score": "pooling", "reward": "pooling"}


@dataclass
class Defaults:
    """How LLM samples when given no SamplingParams: vLLM's generation_config ("auto": the
    model's generation_config.json; "vllm": the API's defaults) and its overrides."""

    generation_config: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], Defaults]:
    """EngineConfig's options (vLLM's runner names resolved) and the sampling defaults;
    ValueError naming a vLLM option whose value cannot be honoured here."""
    options = dict(options)
    for name, accepted in NO_EFFECT.items():
        if name in options:
            value = options.pop(name)
            if accepted is not ANY and value not in accepted:
                raise ValueError(f"{name}={value!r} is not supported; this engine takes "
                                 f"{' or '.join(repr(v) for v in sorted(accepted, key=str))}")
    # The step runs eagerly or as a decode CUDA graph: these settings turn graphs off, or
    # choose the batch sizes captured.
    for name in ("compilation_config", "optimization_level"):
        options.update(graph_options(options.pop(name, None)))
    for vllm_name, name in RENAMED.items():
        if vllm_name in options:
            options[name] = options.pop(vllm_name)
    for name in ("task", "convert"):
        if name in options:
            value = options.pop(name)
            if value not in RUNNER_OF:
                raise ValueError(f"{name}={value!r} is not one of {sorted(RUNNER_OF)}")
            if RUNNER_OF[value] is not None:
                options.setdefault("runner", RUNNER_OF[value])
    defaults = Defaults(options.pop("generation_config", "auto"),
                        dict(options.pop("override_generation_config", None) or {}))
    checked_source(defaults.generation_config)
    unknown = sorted(set(defaults.overrides) - set(GENERATION_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"override_generation_config: {unknown[0]!r} is not one of "
                         f"{', '.join(GENERATION_CONFIG_KEYS)}")
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(EngineConfig)})
    if unknown:
        raise TypeError(f"LLM() got an unexpected option {unknown[0]!r}: it takes EngineConfig's "
                        "options (tokenmill serve's flags, in vLLM's names) and vLLM's "
                        "options listed in tokenmill.engine.frontend.llm_options")
    return options, defaults


def sampling_settings(defaults: Defaults, model_settings: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams' keywords for a call given none: the model's recommended settings
    (generation_config "auto"; none under "vllm"; a directory's generation_config.json) with
    the overrides over them; max_new_tokens becomes max_tokens."""
    settings = sampling_defaults(defaults.generation_config, model_settings)
    settings.update(defaults.overrides)
    if "max_new_tokens" in settings:
        settings["max_tokens"] = int(settings.pop("max_new_tokens"))
    return settings
