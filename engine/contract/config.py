"""Engine options: the single source of the CLI flags and of the operator's engine arguments.

This module imports no torch so that the operator (a light image) can derive `tokenmill serve`
flags from it. Names follow vLLM's so users can switch engines by flag name.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from tokenmill.engine.contract.hf_overrides import HFOverridesError, hf_overrides, json_object
from tokenmill.engine.contract.lora import MAX_LORA_RANK, LoRAModule, LoRAModuleError, parse_modules
from tokenmill.engine.contract.mm_limits import parse_mm_limits
from tokenmill.engine.contract.pooling import RUNNERS, PoolerConfigError, parse_overrides
from tokenmill.engine.contract.speculative import SpeculativeConfig, SpeculativeConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
# vLLM's other spellings of the same values, read as those.
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8"}
QUANTIZATIONS = (None, "none", "int8", "fp8", "gguf")
KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e5m2")
SSM_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# How the prefix cache keeps recurrent states (vLLM's --mamba-cache-mode; its "all", a state
# for every block, is not served).
MAMBA_CACHE_MODES = ("align", "none")
# The GPUs per replica the CRD offers; the engine itself runs any size that divides the model.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
BLOCK_SIZES = (8, 16, 32, 64, 128)
SCHEDULING_POLICIES = ("fcfs", "priority")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
# What this engine build runs today, a subset of the values above: the rest are valid option
# values that fail at start-up (engine), and at `kubectl apply` (the CRD's rules are generated
# from these), until the engine implements them.
SUPPORTED = {"quantization": (None, "none", "int8", "fp8", "gguf"),
             "kv_cache_dtype": ("auto", "int8", "fp8", "fp8_e5m2")}
SUPPORTED_SPECULATIVE_METHODS = ("ngram", "draft")
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_CPU_KV_CACHE_MEMORY = 1 << 30


class ConfigError(ValueError):
    """An invalid engine option; the message names the option."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option


def _opt(default: Any, help: str, parse: Any = None, aliases: tuple[str, ...] = ()) -> Any:
    """An option's field: its default, help, the flag's value parser when not its type's,
    and the flag's other names."""
    return field(default=default, metadata={"help": help, "parse": parse, "aliases": aliases})


_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")
_SCALES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
           "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def size_argument(value: str) -> int:
    """An integer flag as vLLM reads its sizes: 8192; 32k (a lowercase suffix multiplies by a
    power of 1000, and may follow a decimal: 25.6k); 32K (uppercase: a power of 1024)."""
    match = _SIZE.fullmatch(value.strip())
    if match is None or ("." in match[1] and not match[2].islower()):
        hint = "; a decimal takes a lowercase suffix (25.6k)" if match else ""
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a size such as 8192, 32k (32,000) or 32K (32,768){hint}")
    number, suffix = match.groups()
    if not suffix:
        return int(number)
    scale = _SCALES[suffix]
    return int(float(number) * scale) if suffix.islower() else int(number) * scale


def is_count(value: object) -> bool:
    """Whether a JSON or Python value is a whole number, 1 or more (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int_argument(value: str) -> int:
    """A flag's count: a whole number, 1 or more."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return int(value)


def context_length_argument(value: str) -> int | None:
    """--max-model-len: a size, or auto (vLLM's -1 too): None, the model's context length as
    far as the KV pool holds it."""
    if value.strip().lower() in ("auto", "-1"):
        return None
    return size_argument(value)


@dataclass
class EngineConfig:
    """Every engine option. Invalid values and combinations raise ConfigError at construction."""

    model: str = _opt(
        DEFAULT_MODEL,
        "Hugging Face model directory, a .gguf file, a built-in name "
        f"({DEFAULT_MODEL}), hf://ORG/NAME[@REVISION] (or a bare ORG/NAME that is no local "
        "path, as vLLM takes it; the hub's client: HF_TOKEN, "
        "HF_ENDPOINT, HF_HUB_OFFLINE) or s3://BUCKET/PREFIX (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for S3-compatible stores). A hf:// or s3:// "
        "model is downloaded into --download-dir first, once.",
    )
    revision: str | None = _opt(
        None, "The revision (branch, tag or commit) of a hub model (hf://ORG/NAME or a bare "
              "ORG/NAME), as hf://ORG/NAME@REVISION gives it (vLLM's flag).")
    tokenizer: str | None = _opt(
        None, "Take the tokenizer (and chat template) from here instead of from the model: a "
              "directory with tokenizer files, or anything --model takes (vLLM's flag, e.g. "
              "for a GGUF model). Its vocabulary must fit the model's.")
    hf_config_path: str | None = _opt(
        None, "Read the model's config.json from here instead of from the model (vLLM's flag): "
              "a directory holding it, or anything --model takes. A model directory of "
              "weights without a config.json then loads, and a GGUF file is built from this "
              "config instead of its own metadata.")
    skip_tokenizer_init: bool = _opt(
        False, "Load no tokenizer (vLLM's flag, as reinforcement-learning rollouts use it): "
               "prompts come as token ids and replies carry token ids with empty text; what "
               "needs text (text prompts, chat, stop strings, bad words, structured outputs, "
               "images) is refused naming it. The model then needs no tokenizer files.")
    tokenizer_revision: str | None = _opt(
        None, "The revision of a hub tokenizer (--tokenizer ORG/NAME, or the model's own "
              "tokenizer when --tokenizer is not given), as hf://ORG/NAME@REVISION gives it "
              "(vLLM's flag).")
    runner: str = _opt(
        "auto", "What the model is served for: generate (completions, chat, responses) or "
                "pooling (embeddings: POST /v1/embeddings and LLM.embed; a sequence "
                "classifier's probabilities: POST /classify and LLM.classify; both score and "
                "rerank). auto: pooling for an embedding checkpoint (a bare decoder such as "
                "Qwen3Model or MistralModel, or one that ships sentence-transformers' "
                "modules.json) or a classifier (such as Qwen3ForSequenceClassification), "
                "generate otherwise (vLLM's flag; vLLM's --convert embed|classify and "
                "--task embed|classify|score also select pooling).")
    pooler_config: str | None = _opt(
        None, "How an embedding is made from the prompt, as JSON in vLLM's shape: "
              "{\"pooling_type\": \"LAST\" | \"MEAN\" | \"CLS\", \"normalize\": true | "
              "false}. Keys left out keep the model's sentence-transformers settings, else "
              "LAST and normalized. MEAN and CLS read every prompt token's hidden state, so "
              "they turn the prefix cache off. vLLM's older --override-pooler-config is the "
              "same flag.", aliases=("--override-pooler-config",))
    download_dir: str | None = _opt(
        None, "Cache that hf:// and s3:// models are downloaded into and loaded from; "
              "`tokenmill download` fills the same one. Default: the hub's cache for hf:// "
              "($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub) and "
              "$XDG_CACHE_HOME/tokenmill (~/.cache/tokenmill) for s3://.",
    )
    ignore_patterns: tuple[str, ...] = _opt(
        (), "Files of a hf:// or s3:// model (and of a draft model) not to download: "
            "shell-style patterns over each file's path in the repository or under the "
            "prefix, where * crosses directories (vLLM's flag), e.g. 'original/*' for Llama's "
            "copy in Meta's format or '*.pth'. A LoRA adapter is always downloaded whole. "
            "`tokenmill download` takes the same patterns.")
    dtype: str = _opt("auto", "Weight and activation dtype: auto (bfloat16 on CUDA and on "
                              "CPUs with native bfloat16: AVX512-BF16, AMX or Arm BF16; "
                              "float32 on other CPUs), float32, bfloat16, float16 (vLLM's "
                              "half and float are read as float16 and float32).")
    device: str = _opt("auto", "auto, cpu, cuda or cuda:N.")
    max_model_len: int | None = _opt(
        None, "Longest sequence (prompt + output) in tokens: 8192, 32k (32,000) or 32K "
              "(32,768), as vLLM reads it. Default (or auto, -1): the model's context length, "
              "lowered to what the KV-cache pool holds for one sequence where that is less "
              "(logged at start-up). A length the pool cannot hold stops the start-up, "
              "naming the longest that fits.", parse=context_length_argument)
    cuda_graph_sizes: tuple[int, ...] | None = _opt(
        None, "Decode batch sizes captured as CUDA graphs (vLLM's flag): one value N captures "
              "1, 2, 4, 8, 16, 24, ... up to N; several capture exactly those. Larger batches "
              "run eagerly. Default: up to --max-num-seqs (at most 512). vLLM's "
              "--max-cudagraph-capture-size N is one value; its --compilation-config's "
              "cudagraph_capture_sizes and max_cudagraph_capture_size set it too.",
        parse=positive_int_argument,
        aliases=("--max-cudagraph-capture-size",))
    disable_sliding_window: bool = _opt(
        False, "vLLM's: a model with sliding-window layers (Mistral 7B v0.1, Gemma 2 and 3) "
               "gets its window as the context length, within which sliding and full "
               "attention are the same. Other models are unchanged.")
    max_num_seqs: int = _opt(256, "Most sequences in one batch.")
    max_num_batched_tokens: int = _opt(
        2048, "Token budget of one engine step (prompt chunks plus decodes); 8k or 8K as "
              "for --max-model-len.", parse=size_argument)
    enable_chunked_prefill: bool = _opt(
        True, "Split a prompt longer than what is left of a step's --max-num-batched-tokens "
              "over several steps, next to running decodes (vLLM's default). "
              "--no-enable-chunked-prefill: every prompt is prefilled in one step, so "
              "--max-num-batched-tokens must be at least the context length.")
    max_logprobs: int = _opt(
        20, "Most log-probabilities a request may ask for per token (completions' logprobs "
            "and prompt_logprobs, chat's top_logprobs); -1: the whole vocabulary (vLLM's "
            "flag and default).")
    logprobs_mode: str = _opt(
        "raw_logprobs",
        "What a request's logprobs report (vLLM's flag): raw_logprobs (the default: the "
        "log-softmax of the model's logits), raw_logits (the logits), processed_logprobs or "
        "processed_logits (those the token was drawn from: after logit_bias, penalties and "
        "masks, and for a sampled token temperature, top-k, top-p and min-p, a token they rule "
        "out at -inf, which replies show as -9999.0). Prompt logprobs stay raw log-softmax.")
    scheduling_policy: str = _opt(
        "fcfs", "Which request runs first: fcfs (first come, first served) or priority (each "
                "request's `priority`, lower first, then arrival; a waiting request preempts "
                "running ones of lower priority when it finds no room). Under fcfs a request "
                "with a priority other than 0 is refused (vLLM's flag and field).")
    long_prefill_token_threshold: int = _opt(
        0, "The most prompt tokens one request computes in a step (vLLM's flag; 0: as many as "
           "the budget leaves). A long prompt then takes several steps, and other prompts "
           "start beside it instead of waiting for it. Needs chunked prefill.")
    block_size: int = _opt(16, "Tokens per KV-cache block.")
    kv_cache_memory: int | None = _opt(
        None,
        "Bytes for the KV-cache pool: 4G (4 GiB) or 4g (4,000,000,000) as vLLM's "
        "--kv-cache-memory-bytes, its other name. Default on CPU: 1 GiB; on CUDA: what "
        "--gpu-memory-utilization leaves. When given it wins and nothing is profiled.",
        parse=size_argument, aliases=("--kv-cache-memory-bytes",))
    num_gpu_blocks_override: int | None = _opt(
        None, "KV-cache blocks in each device's pool, whatever --kv-cache-memory or the "
              "profile says (vLLM's flag: a small pool, to see preemption); nothing is "
              "profiled. The pool must still fit the device's memory.")
    enable_sleep_mode: bool = _opt(
        False, "vLLM's sleep mode: the engine may give its device memory back while idle "
               "(LLM.sleep(), or the server's POST /sleep) and take it again (wake_up, "
               "POST /wake_up). Asleep, the weights are in host memory and the KV cache "
               "is freed; requests are refused until it wakes.")
    gpu_memory_utilization: float = _opt(
        0.9, "Fraction of each GPU's memory the engine may use. At start-up a profiling step "
             "runs the largest batch (max-num-batched-tokens, max-num-seqs) and measures the "
             "weights and activations; these, memory outside torch (CUDA context, NCCL) and "
             "512 MiB for CUDA graphs come off, and the KV cache gets the rest."
    )
    seed: int = _opt(0, "Seed of the engine's random state (requests without their own seed).")
    tensor_parallel_size: int = _opt(
        1, "Devices one replica shards the model over, one process each (GPUs cuda:0..N-1 on "
           "CUDA; CPU processes otherwise). N must divide the attention heads and MLP width, "
           "and divide or be a multiple of the KV heads. On CPU, --kv-cache-memory is per rank.")
    quantization: str | None = _opt(
        None, "Weight quantization of the decoder's linear layers. Unset: the checkpoint's "
              "own where this device runs it (gguf for a GGUF file on the CPU), else none. "
              "none: full precision (GGUF dequantized at load); int8 (weights only) or fp8 "
              "(e4m3; fp8 matmuls on CUDA with compute capability 8.9 or newer, dequantized "
              "weights elsewhere), one scale per output channel, embeddings and LM head "
              "unquantized; gguf: keep a GGUF file's Q4_0/Q4_1 (int4) and Q8_0 (int8) "
              "tensors, LM head included, for the CPU's int4/int8 kernels (CPU, one rank).")
    kv_cache_dtype: str = _opt(
        "auto",
        "KV-cache dtype: auto (the model dtype), int8, fp8 (e4m3; vLLM's fp8_e4m3 is the "
        "same) or fp8_e5m2 (wider range, one mantissa bit less), each with a float32 scale "
        "per token and KV head: about 2x the tokens of bfloat16 in the same memory. fp8 and "
        "fp8_e5m2 with the Triton backend need a GPU of compute capability 8.9 or newer.",
    )
    mamba_ssm_cache_dtype: str = _opt(
        "auto",
        "dtype of the recurrent state a linear-attention layer (Qwen3.5's, Qwen3-Next's gated "
        "delta nets) keeps per sequence: auto (float32, as transformers keeps it), float32, "
        "bfloat16 or float16 (half the memory per --max-num-seqs slot).",
    )
    mamba_cache_mode: str = _opt(
        "align",
        "How the prefix cache keeps the per-sequence states of a model with linear-attention "
        "or Mamba-2 layers (which cached keys and values cannot rebuild): align (at block "
        "boundaries where a prompt's chunk is cut: its last block, and where a cached prefix "
        "it found ended) or none (no state kept: such a model's prompts are computed whole).",
    )
    enable_prefix_caching: bool = _opt(
        True, "Reuse the KV cache of earlier requests that share a prompt prefix."
    )
    kv_offloading_size: float = _opt(
        0.0, "GiB of host memory for a second tier of KV-cache blocks under the prefix cache "
             "(summed over tensor-parallel ranks; 0: off). Cached prefix blocks evicted from "
             "the device pool are copied there instead of dropped, and a later prompt that "
             "shares the prefix copies them back instead of recomputing them. Pinned memory "
             "on CUDA; the engine refuses to start if the host has less memory available. "
             "Needs --enable-prefix-caching.",
    )
    enable_prompt_embeds: bool = _opt(
        False, "Take prompts given as embeddings (vLLM's prompt_embeds: a tensor [tokens, "
               "hidden size], in place of the token embeddings the model would look up) "
               "besides text and token ids: offline as {\"prompt_embeds\": tensor}, on "
               "/v1/completions as `prompt_embeds`, a base64 torch.save of the tensor.")
    attention_backend: str = _opt(
        "auto", "Paged-attention kernels: auto (Triton on CUDA when triton is installed, torch "
                "otherwise), torch, or triton (on CPU only in Triton's interpreter, "
                "TRITON_INTERPRET=1).",
    )
    speculative_config: str | None = _opt(
        None, "Speculative decoding, as JSON in vLLM's shape: {\"method\": \"ngram\", "
              "\"num_speculative_tokens\": K, \"prompt_lookup_max\": N, "
              "\"prompt_lookup_min\": M} proposes the K tokens that followed the latest "
              "earlier occurrence of the sequence's last N..M tokens (prompt lookup); every "
              "step verifies each sequence's proposals in one forward pass, so greedy output "
              "is unchanged and sampling keeps its distribution. {\"model\": DRAFT, "
              "\"num_speculative_tokens\": K} proposes with a smaller model sharing the "
              "target's tokenizer (anything --model accepts; run whole on rank 0's device, its "
              "KV pool as many blocks as the target's, out of the same budget). "
              "\"disable_by_batch_size\": B turns it off while B or more sequences run "
              "(default on a CPU: 8, measured; on CUDA: never; 0: never).")
    enable_lora: bool = _opt(
        False, "Serve LoRA adapters over the base model (PEFT format: adapter_config.json and "
               "adapter_model.safetensors, on the attention and MLP projections). A request "
               "selects one by its name in `model`; one batch mixes the base and up to "
               "--max-loras adapters.")
    lora_modules: tuple[str, ...] = _opt(
        (), "Adapters loaded at start-up: NAME=PATH or {\"name\": NAME, \"path\": PATH}, "
            "space-separated. PATH is an adapter directory, hf://ORG/NAME[@REVISION] or "
            "s3://BUCKET/PREFIX (downloaded like --model). Needs --enable-lora.")
    max_loras: int = _opt(1, "Most adapters in one batch (device slots for adapter weights).")
    max_lora_rank: int = _opt(16, "Largest adapter rank served; a higher-rank adapter is "
                                  "refused when it is loaded.")
    max_cpu_loras: int | None = _opt(
        None, "Most adapters kept in host memory (least recently used evicted, read again "
              "from their path when next asked for); default: --max-loras. At least "
              "--max-loras.")
    allow_runtime_lora_updating: bool = _opt(
        False, "Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's shapes, "
               "behind the API key): adapters added and removed while serving.")
    hf_overrides: str | dict[str, Any] | None = _opt(
        None, "Changes to the model's Hugging Face config, as a JSON object of its keys "
              "(vLLM's flag), e.g. '{\"max_position_embeddings\": 65536}'. They apply to the "
              "config the engine runs (a multimodal checkpoint's text_config; a \"text_config\" "
              "key is read as that too), before the context length is derived from it. The "
              "offline LLM also takes a dict, as vLLM's does.")
    rope_scaling: str | None = _opt(
        None, "Replace the model's rotary scaling, as a JSON object in the config's shape "
              "(vLLM's older flag), e.g. Qwen's '{\"rope_type\": \"yarn\", \"factor\": 4.0, "
              "\"original_max_position_embeddings\": 32768}' for 128K tokens; the rotary "
              "base stays the model's unless --rope-theta is given.")
    rope_theta: float | None = _opt(None, "Replace the model's rotary base (vLLM's older flag).")
    limit_mm_per_prompt: str | dict[str, Any] | None = _opt(
        None, "vLLM's: the most images one prompt may carry, as '{\"image\": 4}' (or "
              "image=4); default: as many as fit the context. image 0 serves a checkpoint "
              "that reads images text only, without loading its vision tower. Other "
              "modalities (video, audio) must be 0.")
    mm_processor_kwargs: str | dict[str, Any] | None = _opt(
        None, "vLLM's: settings of the checkpoint's image processor, as a JSON object that "
              "overrides its preprocessor_config.json, e.g. Qwen-VL's '{\"min_pixels\": 3136, "
              "\"max_pixels\": 1003520}' to bound the tokens an image takes. A key the "
              "processor has no setting for is refused at start.")
    trust_remote_code: bool = _opt(
        False, "Accepted for vLLM's command lines and LLM(...) calls, with no effect: "
               "tokenmill runs its own implementation of each architecture it supports and "
               "never code from a model's repository.")
    enforce_eager: bool = _opt(
        False, "Run every step eagerly. By default, on CUDA with the Triton attention kernels, "
               "the decode step is captured as a CUDA graph per batch-size bucket at start-up "
               "and replayed (fewer kernel launches from the host).")
    async_scheduling: bool = _opt(
        False, "Schedule each step before the previous step's tokens are read back: the next "
               "step's input ids take them on the device, and the host detokenizes, checks "
               "stops and builds outputs while the device computes. A sequence that a token "
               "stops costs one wasted row. Not with speculative decoding.")

    stream_interval: int = _opt(
        1, "A request that asks for deltas (a stream) gets its tokens this many at a time: "
           "its first output and its last at once, the others once they hold this many new "
           "tokens (vLLM's and SGLang's flag; 1: every step). A larger value cuts the work "
           "per token of building, sending and rendering outputs when hundreds of streams "
           "share a server, for a less smooth stream.")

    def __post_init__(self) -> None:
        _check(bool(self.model), "model", "must name a model")
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        self.kv_cache_dtype = KV_CACHE_DTYPE_ALIASES.get(self.kv_cache_dtype,
                                                         self.kv_cache_dtype)
        _check(self.dtype in DTYPES, "dtype", f"{self.dtype!r} is not one of {DTYPES}")
        _check(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device", f"{self.device!r} is not auto, cpu, cuda or cuda:N",
        )
        if self.max_model_len == -1:  # vLLM's spelling of auto
            self.max_model_len = None
        _check(self.max_model_len is None or self.max_model_len >= 1,
               "max_model_len", f"must be at least 1, got {self.max_model_len}")
        _check(self.max_num_seqs >= 1, "max_num_seqs",
               f"must be at least 1, got {self.max_num_seqs}")
        _check(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens",
            f"({self.max_num_batched_tokens}) must be at least max_num_seqs "
            f"({self.max_num_seqs}): every running sequence needs one token per step",
        )
        _check(self.enable_chunked_prefill or self.max_model_len is None
               or self.max_num_batched_tokens >= self.max_model_len, "max_num_batched_tokens",
               f"({self.max_num_batched_tokens}) must be at least max_model_len "
               f"({self.max_model_len}) without chunked prefill, where a prompt is prefilled "
               "in one step")
        _check(self.stream_interval >= 1, "stream_interval",
               f"must be at least 1, got {self.stream_interval}")
        _check(self.max_logprobs >= -1, "max_logprobs",
               f"must be -1 (the whole vocabulary) or at least 0, got {self.max_logprobs}")
        _check(self.logprobs_mode in LOGPROBS_MODES, "logprobs_mode",
               f"{self.logprobs_mode!r} is not one of {LOGPROBS_MODES}")
        _check(self.scheduling_policy in SCHEDULING_POLICIES, "scheduling_policy",
               f"{self.scheduling_policy!r} is not one of {SCHEDULING_POLICIES}")
        _check(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold",
               f"must be at least 0, got {self.long_prefill_token_threshold}")
        _check(not self.long_prefill_token_threshold or self.enable_chunked_prefill,
               "long_prefill_token_threshold", "splits prompts over steps; it needs "
               "enable_chunked_prefill")
        _check(self.block_size in BLOCK_SIZES, "block_size",
               f"{self.block_size} is not one of {BLOCK_SIZES}")
        _check(self.kv_cache_memory is None or self.kv_cache_memory > 0,
               "kv_cache_memory", f"must be a positive number of bytes, got {self.kv_cache_memory}")
        _check(self.num_gpu_blocks_override is None or self.num_gpu_blocks_override > 0,
               "num_gpu_blocks_override",
               f"must be a positive number of blocks, got {self.num_gpu_blocks_override}")
        if self.cuda_graph_sizes is not None:
            _check(all(is_count(n) for n in self.cuda_graph_sizes), "cuda_graph_sizes",
                   f"must be positive batch sizes, got {list(self.cuda_graph_sizes)}")
            self.cuda_graph_sizes = tuple(sorted(set(self.cuda_graph_sizes)))
        if isinstance(self.ignore_patterns, str):  # LLM(ignore_patterns="original/*")
            self.ignore_patterns = (self.ignore_patterns,)
        self.ignore_patterns = tuple(self.ignore_patterns)
        _check(all(isinstance(p, str) and p for p in self.ignore_patterns), "ignore_patterns",
               f"must be non-empty patterns, got {list(self.ignore_patterns)}")
        _check(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
               f"must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(self.tensor_parallel_size >= 1, "tensor_parallel_size",
               f"must be at least 1, got {self.tensor_parallel_size}")
        _check(self.quantization in QUANTIZATIONS, "quantization",
               f"{self.quantization!r} is not one of none, int8, fp8, gguf (or unset)")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype",
               f"{self.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
        _check(self.mamba_ssm_cache_dtype in SSM_CACHE_DTYPES, "mamba_ssm_cache_dtype",
               f"{self.mamba_ssm_cache_dtype!r} is not one of {SSM_CACHE_DTYPES}")
        _check(self.mamba_cache_mode in MAMBA_CACHE_MODES, "mamba_cache_mode",
               f"{self.mamba_cache_mode!r} is not one of {MAMBA_CACHE_MODES} (all, a state "
               "for every block, is not served)")
        _check(self.kv_offloading_size >= 0, "kv_offloading_size",
               f"must be a number of GiB >= 0, got {self.kv_offloading_size}")
        _check(not self.kv_offloading_size or self.enable_prefix_caching, "kv_offloading_size",
               "the host tier holds blocks the prefix cache evicts; it needs "
               "enable_prefix_caching")
        if self.speculative_config is not None:
            speculative = self.speculative()  # raises ConfigError naming the option
            _check(not self.skip_tokenizer_init or speculative.method != "draft",
                   "skip_tokenizer_init", "a draft model is checked against the target's "
                   "tokenizer, which is not loaded (n-gram speculation needs none)")
        _check(not self.async_scheduling or self.speculative_config is None, "async_scheduling",
               "does not combine with speculative_config: verifying proposals reads every "
               "token on the host before the next step")
        _check(self.attention_backend in ATTENTION_BACKENDS, "attention_backend",
               f"{self.attention_backend!r} is not one of {ATTENTION_BACKENDS}")
        self._check_lora()
        self._check_pooling()
        self.config_overrides()  # raises ConfigError naming the option
        self.image_limit()  # raises ConfigError naming the option
        self.image_processor_options()  # raises ConfigError naming the option

    def image_limit(self) -> int | None:
        """The most images a prompt may carry (--limit-mm-per-prompt), None for no limit."""
        if self.limit_mm_per_prompt is None:
            return None
        try:
            limits = parse_mm_limits(self.limit_mm_per_prompt)
        except ValueError as exc:
            raise ConfigError("limit_mm_per_prompt", str(exc)) from None
        for kind, count in limits.items():
            _check(kind == "image" or count == 0, "limit_mm_per_prompt",
                   f"{kind}: {count} is not supported; tokenmill reads text and images (set "
                   "every other modality to 0)")
        return limits.get("image")

    def image_processor_options(self) -> dict[str, Any]:
        """The image processor settings --mm-processor-kwargs asks for."""
        if not self.mm_processor_kwargs:
            return {}
        try:
            return json_object(self.mm_processor_kwargs, "mm_processor_kwargs")
        except HFOverridesError as e:
            raise ConfigError(e.option, str(e)) from None

    def _check_pooling(self) -> None:
        _check(self.runner in RUNNERS, "runner", f"{self.runner!r} is not one of {RUNNERS}")
        self.pooler_overrides()  # raises ConfigError naming the option
        if self.runner == "pooling":
            self.check_pooling_options()

    def check_pooling_options(self) -> None:
        """ConfigError for an option an embedding model cannot run with (the engine calls it
        again once runner auto has resolved to pooling)."""
        for option, what in (("speculative_config", "speculative decoding"),
                             ("enable_lora", "LoRA adapters")):
            _check(not getattr(self, option), option,
                   f"{what} serve generation; the pooling runner (embeddings) has none")

    def pooler_overrides(self) -> dict[str, Any]:
        """The keys --pooler-config sets."""
        try:
            return parse_overrides(self.pooler_config)
        except PoolerConfigError as e:
            raise ConfigError("pooler_config", str(e)) from None

    def _check_lora(self) -> None:
        if isinstance(self.lora_modules, str):
            self.lora_modules = (self.lora_modules,)
        self.lora_modules = tuple(self.lora_modules)
        self.lora_adapters()  # raises ConfigError naming the option
        if not self.enable_lora:
            for option in ("lora_modules", "allow_runtime_lora_updating"):
                _check(not getattr(self, option), option, "needs enable_lora")
        _check(self.max_loras >= 1, "max_loras", f"must be at least 1, got {self.max_loras}")
        _check(1 <= self.max_lora_rank <= MAX_LORA_RANK, "max_lora_rank",
               f"must be in 1..{MAX_LORA_RANK}, got {self.max_lora_rank}")
        _check(self.max_cpu_loras is None or self.max_cpu_loras >= self.max_loras,
               "max_cpu_loras", f"({self.max_cpu_loras}) must be at least max_loras "
               f"({self.max_loras})")

    def lora_adapters(self) -> list[LoRAModule]:
        """The parsed --lora-modules, in order."""
        try:
            return parse_modules(self.lora_modules)
        except LoRAModuleError as e:
            raise ConfigError("lora_modules", str(e)) from None

    @property
    def cpu_lora_capacity(self) -> int:
        """Adapters kept in host memory: --max-cpu-loras, else --max-loras."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    def check_supported(self) -> None:
        """ConfigError naming the first option whose value this engine build cannot run yet."""
        for option, values in SUPPORTED.items():
            value = getattr(self, option)
            _check(value in values, option,
                   f"{value} is not supported by this engine version yet (supported: "
                   f"{', '.join('none' if v is None else str(v) for v in values)})")
        speculative = self.speculative()
        _check(speculative is None or speculative.method in SUPPORTED_SPECULATIVE_METHODS,
               "speculative_config", f"method {speculative and speculative.method!r} is not "
               "supported by this engine version yet (supported: "
               f"{', '.join(SUPPORTED_SPECULATIVE_METHODS)})")

    def speculative(self) -> SpeculativeConfig | None:
        """The parsed --speculative-config (None: no speculation)."""
        if self.speculative_config is None:
            return None
        try:
            return SpeculativeConfig.parse(self.speculative_config)
        except SpeculativeConfigError as e:
            raise ConfigError("speculative_config", str(e)) from None

    def config_overrides(self) -> dict[str, Any]:
        """The model config changes --hf-overrides, --rope-scaling and --rope-theta ask for."""
        try:
            return hf_overrides(self.hf_overrides, self.rope_scaling, self.rope_theta)
        except HFOverridesError as e:
            raise ConfigError(e.option, str(e)) from None

    def tokenizer_source(self) -> str | None:
        """Where the tokenizer is read from when not from the model's files: --tokenizer, or
        the model itself when --tokenizer-revision alone pins its tokenizer (vLLM's)."""
        return self.tokenizer or (self.model if self.tokenizer_revision else None)

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)


def _check(ok: bool, option: str, message: str) -> None:
    if not ok:
        raise ConfigError(option, message)


def cli_flag(option: str) -> str:
    """The flag of an EngineConfig option, vLLM style: max_num_seqs -> --max-num-seqs."""
    return "--" + option.replace("_", "-")


def engine_args(**options: Any) -> list[str]:
    """Command-line arguments for `tokenmill serve` from option values (None values are skipped).

    Booleans become `--flag` / `--no-flag`. Unknown option names raise ConfigError, so a caller
    (the operator) can never emit a flag the engine does not have.
    """
    known = {f.name: f for f in dataclasses.fields(EngineConfig)}
    args: list[str] = []
    for name, value in options.items():
        if name not in known:
            raise ConfigError(name, "is not an engine option")
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(cli_flag(name) if value else "--no-" + cli_flag(name)[2:])
        elif isinstance(value, list | tuple):
            if value:
                args += [cli_flag(name), *map(str, value)]
        else:
            args += [cli_flag(name), str(value)]
    return args


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field, with its type, default and help."""
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        base, parse = _base_type(hints[f.name]), f.metadata.get("parse")
        flags = (cli_flag(f.name), *f.metadata.get("aliases", ()))
        help_text = f.metadata.get("help", "")
        if base is bool:
            parser.add_argument(*flags, dest=f.name, default=f.default,
                                action=argparse.BooleanOptionalAction, help=help_text)
        elif base is tuple:  # one or more values after the flag, each parsed
            parser.add_argument(*flags, dest=f.name, nargs="+", default=f.default,
                                type=parse or str, help=help_text)
        else:
            parser.add_argument(*flags, dest=f.name, type=parse or base, default=f.default,
                                help=f"{help_text} (default: {f.default})")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)})


def _base_type(hint: Any) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _base_type(next(a for a in typing.get_args(hint) if a is not type(None)))
    return typing.get_origin(hint) or hint
