"""The flags of `tokenmill serve` beyond the engine's: parsed for every command (`tokenmill
bench` too) where FastAPI and uvicorn are not installed, as on a GPU machine, and by the
operator, which checks a spec's `engine.extraArgs` with them; so nothing here imports the
server.

The server flags a user may set; the operator sets --host, --port, --served-model-name and
--shutdown-timeout itself and takes the API key from a Secret.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from tokenmill.engine.contract.config import ConfigError, is_count, positive_int_argument

# The tool-call formats the server parses (server/tool_parsers.py, whose table a test holds to
# these names).
TOOL_CALL_PARSER_NAMES = ("hermes", "llama3_json", "mistral", "pythonic", "granite",
                          "phi4_mini_json", "openai", "glm45", "deepseek_v3", "deepseek_v31",
                          "qwen3_coder", "qwen3_xml", "minimax_m2")
# The reasoning formats the server splits (server/reasoning.py, held to these names likewise).
REASONING_PARSER_NAMES = ("deepseek_r1", "qwen3", "mistral", "granite", "openai_gptoss",
                          "glm45", "deepseek_v3", "minimax_m2", "minimax_m2_append_think")
# apply_chat_template's own parameters, and the template's `messages`: set by the server or by
# the request's own fields, never through chat_template_kwargs (the template's variables).
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs",
})

# The generation-config fields that set a request's defaults, as vLLM reads them: sampling
# settings the request leaves out, and max_new_tokens, the most tokens a request without
# max_tokens gets.
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                          "max_new_tokens")


def add_server_arguments(parser: argparse.ArgumentParser,
                         environ: Mapping[str, str] = os.environ) -> None:
    """The server's flags on `parser`; `environ` holds TOKENMILL_API_KEY, --api-key's default
    (the operator passes none: the key of a pod comes from its Secret)."""
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=_port, default=8000,
                        help="TCP port, 0 to 65535 (0: one the system picks; default 8000).")
    parser.add_argument("--uds", default=None, metavar="PATH",
                        help="Listen on this Unix domain socket instead of --host and --port "
                             "(vLLM's flag).")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="The model's name in the API (default: the --model value). "
                             "Given several, a request's `model` may be any of them; replies "
                             "and metrics use the first (as vLLM).")
    parser.add_argument("--max-waiting-requests", type=positive_int_argument, default=1024,
                        help="Answer 503 with Retry-After once this many requests wait.")
    parser.add_argument("--max-stored-responses", type=_non_negative_int, default=1000,
                        metavar="N",
                        help="Keep the last N responses of /v1/responses in memory, for GET "
                             "/v1/responses/{id}, previous_response_id and background "
                             "responses; the least recently used is forgotten first. 0: keep "
                             "none (store is answered false). Default: 1000.")
    parser.add_argument("--shutdown-timeout", type=seconds_argument, default=30.0,
                        help="Seconds running requests may take to finish after SIGTERM.")
    parser.add_argument("--api-key", type=_api_key, default=environ.get("TOKENMILL_API_KEY"),
                        help="Require `Authorization: Bearer KEY` (or `x-api-key: KEY`, as "
                             "Anthropic's clients send it) on every path but /health, "
                             "/ping, /metrics, /load, /version and the OpenAPI docs (default: "
                             "$TOKENMILL_API_KEY; none: no key needed). The variable keeps the "
                             "key out of the process list.")
    parser.add_argument("--hf-token", nargs="?", const=True, default=None, metavar="TOKEN",
                        help="The hub token for a gated or private hf:// model or adapter "
                             "(vLLM's flag): the value becomes HF_TOKEN for this process's "
                             "downloads; without a value, the token the hub client already "
                             "finds (HF_TOKEN, or `hf auth login`'s) is used, as it always is.")
    parser.add_argument("--max-request-body-bytes", type=positive_int_argument, default=10 << 20,
                        help="Answer 413 to a larger request body, before reading it "
                             "(default 10 MiB).")
    parser.add_argument("--vllm-metrics", action=argparse.BooleanOptionalAction, default=True,
                        help="Also export the load gauges, the LoRA batch info and the "
                             "KV-cache configuration under vLLM's names (vllm:...), which the "
                             "Gateway API inference extension's endpoint picker reads "
                             "unconfigured (docs/gateway-api.md). Default: on.")
    parser.add_argument("--chat-template", default=None,
                        help="The chat template to use instead of the tokenizer's: a file, or "
                             "the Jinja template itself (vLLM's flag). Read at start-up; one "
                             "that does not parse stops the server with exit status 2.")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="Let a chat request's own chat_template (vLLM's field) render its "
                             "messages in place of the server's (vLLM's flag). Off by default: "
                             "a request that carries one is refused with a 400.")
    parser.add_argument("--response-role", default="assistant", metavar="ROLE",
                        help="The role of a chat reply's message (vLLM's flag; default: "
                             "assistant). A request with add_generation_prompt false (one that "
                             "continues its last message) is answered in that message's "
                             "role.")
    parser.add_argument("--default-chat-template-kwargs", type=_template_kwargs, default={},
                        metavar="JSON",
                        help="Variables every chat request's template gets unless the request "
                             "sets them in chat_template_kwargs (vLLM's flag), as JSON: "
                             "'{\"enable_thinking\": false}' serves Qwen3 without thinking.")
    parser.add_argument("--chat-template-content-format", choices=("auto", "string", "openai"),
                        default="auto",
                        help="How the chat template reads a message's content: string, or "
                             "openai (a list of {type: text, text} parts, as LLaVA's templates "
                             "loop over). auto (the default, as in vLLM): the form in which "
                             "the template shows a probe message's text.")
    parser.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                        help="auto (the default, as in vLLM): a request that leaves out "
                             "temperature, top_p, top_k, min_p or repetition_penalty gets the "
                             "value the model's generation_config.json recommends; vllm: "
                             "the API's own defaults (temperature 1, ...) whatever the model "
                             "says; a directory: the values of the generation_config.json "
                             "in it (checked at start-up).")
    parser.add_argument("--override-generation-config", type=_generation_overrides, default={},
                        metavar="JSON",
                        help="Request defaults that win over the model's generation config "
                             "(with --generation-config vllm: the only ones), as JSON: "
                             '{"temperature": 0.6, "max_new_tokens": 1024}; keys: '
                             f"{', '.join(GENERATION_CONFIG_KEYS)}.")
    parser.add_argument("--reasoning-parser", choices=REASONING_PARSER_NAMES, default=None,
                        help="Return a reasoning model's thinking (<think>...</think>) apart "
                             "from its answer, in the chat message's `reasoning` (and "
                             "`reasoning_content`): deepseek_r1 (the template opens the "
                             "thinking), qwen3 (the model does), mistral, granite, glm45, or "
                             "openai_gptoss (GPT-OSS's harmony channels).")
    parser.add_argument("--return-tokens-as-token-ids", action="store_true",
                        help='Logprobs name each token "token_id:ID" instead of its text, so '
                             "tokens with the same text are told apart (vLLM's flag; a "
                             "request's return_tokens_as_token_ids overrides it).")
    parser.add_argument("--enable-force-include-usage", action="store_true",
                        help="Every streamed completion, chat and response ends with a usage "
                             "chunk, as if its stream_options.include_usage were true "
                             "(vLLM's flag).")
    add_tool_arguments(parser)
    add_http_arguments(parser)
    add_request_log_arguments(parser)
    add_vllm_compat_arguments(parser)


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    """CORS, TLS, uvicorn's logging and the API docs, under vLLM's flag names and defaults."""
    parser.add_argument("--allowed-origins", type=_json_strings, default=["*"],
                        help='CORS: origins a browser may call from, a JSON list (default: '
                             '["*"], as vLLM).')
    parser.add_argument("--allowed-methods", type=_json_strings, default=["*"],
                        help='CORS: methods allowed, a JSON list (default: ["*"]).')
    parser.add_argument("--allowed-headers", type=_json_strings, default=["*"],
                        help='CORS: request headers allowed, a JSON list (default: ["*"]).')
    parser.add_argument("--allow-credentials", action="store_true",
                        help="CORS: allow cookies and HTTP authentication from other origins.")
    parser.add_argument("--ssl-keyfile", default=None,
                        help="Serve HTTPS with this private key (PEM); needs --ssl-certfile.")
    parser.add_argument("--ssl-certfile", default=None,
                        help="Serve HTTPS with this certificate chain (PEM); needs "
                             "--ssl-keyfile.")
    parser.add_argument("--ssl-ca-certs", default=None,
                        help="CA certificates (PEM) that client certificates are checked "
                             "against (with --ssl-cert-reqs 2).")
    parser.add_argument("--enable-ssl-refresh", action="store_true",
                        help="Serve a renewed key, certificate or CA file without a restart: "
                             "they are looked at once a second and loaded again when one "
                             "changes (new connections get the new certificate).")
    parser.add_argument("--ssl-ciphers", default=None, metavar="CIPHERS",
                        help="The ciphers HTTPS may use, in OpenSSL's cipher list format "
                             "(default: uvicorn's, TLSv1).")
    parser.add_argument("--ssl-cert-reqs", type=int, choices=(0, 1, 2), default=0,
                        help="Client certificates: 0 not asked for, 1 optional, 2 required "
                             "(Python's ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED).")
    parser.add_argument("--uvicorn-log-level", default=None,
                        choices=("critical", "error", "warning", "info", "debug", "trace"),
                        help="uvicorn's own log level (default: warning, or what "
                             "--log-config-file sets; at info it logs a line per request "
                             "unless --disable-uvicorn-access-log). tokenmill's logs take "
                             "TOKENMILL_LOG_LEVEL.")
    parser.add_argument("--disable-uvicorn-access-log", action="store_true",
                        help="No uvicorn access log lines, whatever its log level.")
    parser.add_argument("--log-config-file", default=None, metavar="FILE",
                        help="A JSON file in logging.config.dictConfig's schema that "
                             "configures tokenmill's loggers and uvicorn's in this process "
                             "(vLLM's flag), in place of the logfmt lines on stderr; its "
                             "formatters may name tokenmill.engine.log.LogfmtFormatter.")
    parser.add_argument("--disable-fastapi-docs", action="store_true",
                        help="Serve no /docs, /redoc or /openapi.json.")
    parser.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                        help="Serve vLLM's GET /tokenizer_info: the tokenizer's settings, "
                             "class and chat template (off by default: it shows the "
                             "template).")
    parser.add_argument("--middleware", action="append", default=[], metavar="IMPORT_PATH",
                        help="vLLM's: an ASGI middleware class, or an async function taking "
                             "(request, call_next), at package.module.name, added outside the "
                             "server's own; repeat the flag for more.")
    parser.add_argument("--h11-max-header-count", type=positive_int_argument, default=256,
                        help="Most headers a request may carry; more is a 431 (vLLM's flag "
                             "and default).")
    parser.add_argument("--h11-max-incomplete-event-size", type=positive_int_argument,
                        default=4 << 20, metavar="BYTES",
                        help="Most bytes of a request's head uvicorn's h11 parser buffers "
                             "(vLLM's flag and default); this install parses with httptools, "
                             "whose own limits apply instead.")
    parser.add_argument("--root-path", default="", metavar="PATH",
                        help="The path prefix a path-based proxy serves this server under "
                             "(vLLM's flag, FastAPI's root_path): requests may come with or "
                             "without it, and the API docs name it.")


def add_request_log_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's request-log flags: one line per generation request, and one per finished
    generation, when asked for."""
    parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction,
                        default=False,
                        help="Log each generation request at admission (INFO, logger "
                             "tokenmill.requests, whatever TOKENMILL_LOG_LEVEL): its id, "
                             "model, prompt length, sampling parameters and prompt (cut to "
                             "--max-log-len).")
    parser.add_argument("--enable-log-outputs", action=argparse.BooleanOptionalAction,
                        default=False,
                        help="Log each generation once it finishes (INFO, logger "
                             "tokenmill.requests, under its request's id): its finish reason, "
                             "text and token ids (cut to --max-log-len).")
    parser.add_argument("--enable-log-deltas", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="With --enable-log-outputs, also log what each step of a stream "
                             "adds (vLLM's default; --no-enable-log-deltas: finished "
                             "generations only).")
    parser.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                        help="Send a span per finished generation request to this "
                             "OpenTelemetry collector (vLLM's flag and span: llm_request, "
                             "with its gen_ai.* token counts and latencies, never the text): "
                             "OTLP over gRPC (http://collector:4317), or over HTTP with "
                             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf "
                             "(http://collector:4318/v1/traces). A request's traceparent "
                             "header puts its span in the caller's trace. The service is "
                             "named tokenmill unless OTEL_SERVICE_NAME says otherwise.")
    parser.add_argument("--collect-detailed-traces", default=None, metavar="MODULES",
                        help="vLLM's: model, worker or all, comma-separated; needs "
                             "--otlp-traces-endpoint. Every span already carries the "
                             "model's prefill, decode and inference times.")
    parser.add_argument("--log-error-stack", action="store_true",
                        help="Log each error response the API raised (4xx and 5xx) with "
                             "the traceback that made it (a WARNING line, logger "
                             "tokenmill.engine.server.errors).")
    parser.add_argument("--max-log-len", type=positive_int_argument, default=None,
                        help="Most characters of a prompt or an output, or token ids of an "
                             "output, that a log line shows (default: all).")


# vLLM's on/off flags that change nothing here, and why.
_NO_EFFECT_SWITCHES = (
    ("--disable-log-requests", "requests are not logged unless --enable-log-requests"),
    ("--disable-log-stats", "tokenmill logs no periodic statistics (they are on /metrics)"),
    ("--enable-server-load-tracking",
     "GET /load always answers {\"server_load\": the API calls in flight} here"),
    ("--enable-prompt-tokens-details",
     "usage always carries prompt_tokens_details.cached_tokens here"),
    ("--disable-frontend-multiprocessing",
     "the HTTP server and the engine share one process here"),
    ("--enable-expert-parallel",
     "a mixture of experts is split over the --tensor-parallel-size ranks by expert width "
     "(every rank holds a slice of every expert; the output is the same)"),
    ("--disable-custom-all-reduce",
     "tensor-parallel ranks all-reduce through torch.distributed only"),
    ("--enable-request-id-headers",
     "every response carries X-Request-Id here (the client's, or a new one)"),
    ("--exclude-tools-when-tool-choice-none",
     'tool_choice "none" renders no tools into the prompt here'),
    ("--use-tqdm-on-load", "loading the weights always shows its progress"),
    ("--disable-cascade-attn",
     "attention has no cascade path for shared prefixes to turn off here"),
    ("--fully-sharded-loras",
     "under tensor parallelism an adapter is split as its layer is (B's rows with a "
     "column-parallel layer's, A's columns with a row-parallel one's); the output is the same "
     "as with vLLM's fully sharded layout"),
    ("--disable-mm-preprocessor-cache",
     "each request's images are prepared as it arrives; there is no cache of processed "
     "images to turn off"),
    # vLLM's older engine's flags, still on many deployments' command lines.
    ("--use-v2-block-manager", "the KV cache has one block manager here"),
    ("--disable-async-output-proc",
     "each step's outputs are made as it ends (--async-scheduling overlaps a step's host work "
     "with the device's)"),
    ("--multi-step-stream-outputs",
     "a stream sends what each step added (--stream-interval sets how often)"),
    ("--enable-reasoning", "--reasoning-parser alone splits a reply's thinking off"),
    ("--calculate-kv-scales",
     "an int8 or fp8 KV cache stores each token's K and V rows with their own scale, taken "
     "as they are written; there are no per-layer scales to calculate"),
)


def add_vllm_compat_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM flags a deployment's command line often carries that have nothing to change here,
    accepted so the line runs unchanged; a value tokenmill cannot honour is refused by
    check_server_flags."""
    for flag, why in _NO_EFFECT_SWITCHES:
        parser.add_argument(flag, action="store_true",
                            help=f"Accepted for vLLM's command lines: {why}.")
    parser.add_argument("--distributed-executor-backend", choices=("mp",), default="mp",
                        help="Accepted for vLLM's command lines: tensor-parallel ranks are "
                             "local processes (mp).")
    parser.add_argument("--pipeline-parallel-size", type=positive_int_argument, default=1,
                        help="Accepted for vLLM's command lines with 1 only: a replica shards "
                             "its model with --tensor-parallel-size.")
    parser.add_argument("--data-parallel-size", type=positive_int_argument, default=1,
                        help="Accepted for vLLM's command lines with 1 only: more replicas "
                             "(the operator's replicas and autoscaling) serve in parallel.")
    parser.add_argument("--api-server-count", type=positive_int_argument, default=1,
                        help="Accepted for vLLM's command lines with 1 only: one HTTP server "
                             "shares the engine's process.")
    parser.add_argument("--max-parallel-loading-workers", type=positive_int_argument, default=None,
                        help="Accepted for vLLM's command lines: the weights are read by the "
                             "serving process itself, file by file.")
    # Mistral's recipes ask for its own formats; its repositories carry Hugging Face's too.
    for flag, choices, what in (
            ("--tokenizer-mode", ("auto", "hf", "slow", "mistral"),
             "the tokenizer is read from the model's Hugging Face files (tokenizer.json, which "
             "Mistral's repositories carry beside tekken.json)"),
            ("--config-format", ("auto", "hf", "mistral"),
             "the config is read from config.json (which Mistral's repositories carry beside "
             "params.json)"),
            ("--load-format", ("auto", "safetensors", "pt", "mistral", "gguf"),
             "the weights are read from the safetensors files in Hugging Face's layout "
             "(Mistral's consolidated copy is passed over), from PyTorch's pickled files "
             "(pytorch_model*.bin) where a model has no safetensors weights, or from the "
             "GGUF file given")):
        parser.add_argument(flag, choices=choices, default="auto",
                            help=f"Accepted for vLLM's command lines: {what}.")
    gib = {"type": _non_negative_float, "metavar": "GIB"}
    steps = {"type": positive_int_argument, "metavar": "N"}
    # Flags whose value changes nothing here: (flag, argparse options, why).
    for flag, options, why in (
            ("--swap-space", {"type": float, "metavar": "GIB"},
             "a preempted request's KV cache is recomputed, not swapped (--kv-offloading-size "
             "keeps a CPU tier of evicted prefix blocks)"),
            ("--preemption-mode", {"choices": ("recompute", "swap")},
             "a preempted request's KV cache is recomputed when it resumes, whichever mode is "
             "named (the flag is from its older engine)"),
            ("--num-lookahead-slots", {"type": _non_negative_int, "metavar": "N"},
             "speculative decoding (--speculative-config) reserves the KV slots of its draft "
             "tokens itself (the flag is from its older engine)"),
            ("--prefix-caching-hash-algo",
             {"choices": ("builtin", "sha256", "sha256_cbor", "sha256_cbor_64bit", "xxhash",
                          "xxhash_cbor")},
             "a cached block is used only once its tokens are compared, so no hash collision "
             "can serve another prompt's KV, whatever the hash"),
            ("--num-scheduler-steps", {**steps, "default": 1},
             "every step is scheduled on its own here (the flag is its older multi-step "
             "scheduling's); --async-scheduling overlaps the host's work with the device's"),
            *((partial, steps,
               "each step fills its token budget with prompt chunks, of as many prompts as it "
               "holds; --long-prefill-token-threshold caps a long prompt's share of a step")
              for partial in ("--max-num-partial-prefills", "--max-long-partial-prefills")),
            ("--mm-processor-cache-gb", gib,
             "each request's images are prepared as it arrives (no cache of processed "
             "images)")):
        parser.add_argument(flag, **{"default": None, **options},
                            help=f"Accepted for vLLM's command lines: {why}.")
    parser.add_argument("--cpu-offload-gb", type=_non_negative_float, default=0.0,
                        metavar="GIB",
                        help="Accepted for vLLM's command lines with 0 only: the weights stay "
                             "whole on the device; a model larger than its memory is split "
                             "with --tensor-parallel-size or made smaller with "
                             "--quantization.")
    parser.add_argument("--kv-offloading-backend", choices=("native", "lmcache"),
                        default="native",
                        help="Accepted for vLLM's command lines with native only: "
                             "--kv-offloading-size's host tier is tokenmill's own.")
    parser.add_argument("--mm-encoder-tp-mode", choices=("weights", "data"), default=None,
                        help="Accepted for vLLM's command lines: under tensor parallelism the "
                             "image encoder runs whole on rank 0.")
    parser.add_argument("--model-impl", default="auto",
                        choices=("auto", "vllm", "transformers", "terratorch"),
                        help="auto or vllm (vLLM's flag): tokenmill runs its own implementation "
                             "of each architecture it supports; transformers and terratorch "
                             "exit 2.")
    parser.add_argument("--show-hidden-metrics-for-version", default=None, metavar="VERSION",
                        help="Accepted for vLLM's command lines: no metric is hidden here.")
    parser.add_argument("--code-revision", default=None, metavar="REVISION",
                        help="Accepted for vLLM's command lines: no code from a model's "
                             "repository is ever run.")
    parser.add_argument("--max-seq-len-to-capture", type=positive_int_argument, default=None,
                        help="Accepted for vLLM's command lines: CUDA graphs capture decode "
                             "steps, whatever the context length.")
    parser.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                        help="vLLM's: file:// image URLs are read from under this directory "
                             "(default: none are).")
    parser.add_argument("--allowed-media-domains", nargs="+", default=None, metavar="HOST",
                        help="vLLM's: http(s) image URLs are fetched only from these hosts, "
                             "redirects included (default: any host).")
    parser.add_argument("--guided-decoding-backend", choices=("auto", "xgrammar"),
                        default="auto", help="Accepted for vLLM's command lines: structured "
                                             "outputs always run on xgrammar.")
    parser.add_argument("--structured-outputs-config", type=_structured_outputs_config,
                        default=None, metavar="JSON",
                        help="Newer vLLM's name for the backend: accepted with "
                             '{"backend": "auto"} or "xgrammar" (and disable_fallback, which '
                             "changes nothing: there is no other backend to fall back to).")
    parser.add_argument("--convert", choices=("auto", "none", "embed", "classify"),
                        default=None, action=_RunnerAlias,
                        help="vLLM's: embed and classify are --runner pooling (a generative "
                             "checkpoint served for embeddings; a classifier's head is read "
                             "from the checkpoint, or made with --hf-overrides' "
                             "classifier_from_token).")
    parser.add_argument("--task", choices=("auto", "generate", "embed", "classify", "score"),
                        default=None, action=_RunnerAlias,
                        help="Older vLLM's: generate is --runner generate; embed, classify "
                             "and score are --runner pooling.")
    parser.add_argument("-O", "--optimization-level", type=_optimization_level, default=None,
                        metavar="0-3", action=_GraphOptions,
                        help="vLLM's: 0 runs every step eagerly, as --enforce-eager; 1 to 3 "
                             "keep the decode CUDA graphs (there are no compiler passes to "
                             "choose between here).")
    parser.add_argument("--compilation-config", type=_compilation_config, default=None,
                        metavar="JSON", action=_GraphOptions,
                        help='vLLM\'s: {"cudagraph_mode": "NONE"} runs every step eagerly, as '
                             "--enforce-eager; cudagraph_capture_sizes and "
                             "max_cudagraph_capture_size are --cuda-graph-sizes; its other keys "
                             "(compiler passes) and a bare level are accepted and change "
                             "nothing: the decode step is captured uncompiled.")


class _RunnerAlias(argparse.Action):
    """vLLM's --convert and --task, which pick the runner: stored, and copied to --runner."""

    RUNNERS = {"embed": "pooling", "classify": "pooling", "score": "pooling",
               "generate": "generate"}

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        if values in self.RUNNERS:
            namespace.runner = self.RUNNERS[values]


class _GraphOptions(argparse.Action):
    """vLLM's -O and --compilation-config: stored, and the engine options they imply
    (graph_options) set."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        for name, value in graph_options(values).items():
            setattr(namespace, name, value)


def graph_options(setting: int | dict[str, Any] | None) -> dict[str, Any]:
    """The engine options vLLM's optimization level (an int) or compilation config (a dict)
    implies: enforce_eager at level 0 or with cudagraph_mode NONE; cuda_graph_sizes from
    cudagraph_capture_sizes, or max_cudagraph_capture_size as its one value."""
    if not isinstance(setting, dict):
        return {"enforce_eager": True} if setting == 0 else {}
    options: dict[str, Any] = {}
    if str(setting.get("cudagraph_mode", "")).upper() == "NONE":
        options["enforce_eager"] = True
    if setting.get("cudagraph_capture_sizes"):
        options["cuda_graph_sizes"] = tuple(setting["cudagraph_capture_sizes"])
    elif setting.get("max_cudagraph_capture_size"):
        options["cuda_graph_sizes"] = (setting["max_cudagraph_capture_size"],)
    return options


def add_tool_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's names, so a serving command moves between the two unchanged."""
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='Let the model decide to call tools (tool_choice "auto"); '
                             "needs --tool-call-parser.")
    parser.add_argument("--tool-call-parser", choices=TOOL_CALL_PARSER_NAMES, default=None,
                        help="The model's tool-call format: hermes (Hermes, Qwen: "
                             "<tool_call>...</tool_call>), llama3_json (Llama 3.x JSON), "
                             "mistral ([TOOL_CALLS]...) or pythonic (Llama 3.2 and 4: "
                             "[f(x=1), g()]).")


def check_server_flags(args: argparse.Namespace) -> None:
    """ConfigError for server flags that cannot work together."""
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ConfigError("--enable-auto-tool-choice", "needs --tool-call-parser "
                          f"({' or '.join(TOOL_CALL_PARSER_NAMES)})")
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        given, missing = (("--ssl-keyfile", "--ssl-certfile") if args.ssl_certfile is None
                          else ("--ssl-certfile", "--ssl-keyfile"))
        raise ConfigError(given, f"needs {missing}: HTTPS takes a key and its certificate")
    for flag, size, how in (
            ("--pipeline-parallel-size", args.pipeline_parallel_size,
             "a replica shards its model with --tensor-parallel-size"),
            ("--data-parallel-size", args.data_parallel_size,
             "run more replicas (the operator's replicas and autoscaling)"),
            ("--api-server-count", args.api_server_count,
             "one HTTP server shares the engine's process; run more replicas")):
        if size != 1:
            raise ConfigError(flag, f"{size} is not supported; {how}")
    if args.cpu_offload_gb:
        raise ConfigError("--cpu-offload-gb", f"{args.cpu_offload_gb:g} is not supported; the "
                          "weights stay whole on the device: split a larger model with "
                          "--tensor-parallel-size, or shrink it with --quantization")
    if args.kv_offloading_backend != "native":
        raise ConfigError("--kv-offloading-backend", f"{args.kv_offloading_backend} is not "
                          "available; the host tier of --kv-offloading-size is tokenmill's "
                          "own (native)")
    if args.ssl_cert_reqs and args.ssl_keyfile is None:
        raise ConfigError("--ssl-cert-reqs", "client certificates need HTTPS (--ssl-keyfile "
                                             "and --ssl-certfile)")
    if args.enable_ssl_refresh and args.ssl_keyfile is None:
        raise ConfigError("--enable-ssl-refresh", "needs HTTPS (--ssl-keyfile and "
                                                  "--ssl-certfile)")
    if args.model_impl not in ("auto", "vllm"):
        raise ConfigError("--model-impl", f"{args.model_impl} is not available: tokenmill runs "
                          "its own implementation of each architecture it supports (auto)")
    if args.enable_reasoning and args.reasoning_parser is None:
        raise ConfigError("--enable-reasoning", "needs --reasoning-parser "
                          f"({' or '.join(REASONING_PARSER_NAMES)})")
    if args.collect_detailed_traces is not None:
        modules = set(args.collect_detailed_traces.split(","))
        if not modules <= {"model", "worker", "all"}:
            raise ConfigError("--collect-detailed-traces", f"{args.collect_detailed_traces!r} "
                              "is not a comma-separated list of model, worker and all")
        if args.otlp_traces_endpoint is None:
            raise ConfigError("--collect-detailed-traces", "needs --otlp-traces-endpoint")
    if args.ssl_ciphers is not None and args.ssl_keyfile is None:
        raise ConfigError("--ssl-ciphers", "ciphers need HTTPS (--ssl-keyfile and "
                                           "--ssl-certfile)")


def _api_key(value: str) -> str:
    # Never echoed: an error names what is wrong with the key, not the key.
    if not value:
        raise argparse.ArgumentTypeError("the API key (--api-key or TOKENMILL_API_KEY) is "
                                         "empty; unset it to serve without a key")
    if not all("!" <= c <= "~" for c in value):
        raise argparse.ArgumentTypeError(
            "the API key (--api-key or TOKENMILL_API_KEY) has a character other than visible "
            "ASCII (a trailing newline from the Secret?), which no client can send in a header")
    return value


def _json_or_none(value: str) -> object:
    try:
        return json.loads(value)
    except ValueError:
        return None


def _json_strings(value: str) -> list[str]:
    items = _json_or_none(value)
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise argparse.ArgumentTypeError(f'must be a JSON list of strings (["*"] or '
                                         f'["https://example.com"]), got {value!r}')
    return items


def _template_kwargs(value: str) -> dict[str, Any]:
    variables = _json_or_none(value)
    if not isinstance(variables, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as "
                                         f'{{"enable_thinking": false}}, got {value!r}')
    reserved = sorted(set(variables) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise argparse.ArgumentTypeError(f"{reserved[0]!r} is not a template variable a "
                                         "server may set")
    return variables


def _generation_overrides(value: str) -> dict[str, float]:
    overrides = _json_or_none(value)
    if not isinstance(overrides, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as "
                                         f'{{"temperature": 0.6}}, got {value!r}')
    for key, number in overrides.items():
        if key not in GENERATION_CONFIG_KEYS:
            raise argparse.ArgumentTypeError(
                f"{key!r} is not one of {', '.join(GENERATION_CONFIG_KEYS)}")
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise argparse.ArgumentTypeError(f"{key} must be a number, got {number!r}")
    if overrides.get("max_new_tokens", 1) < 1:
        raise argparse.ArgumentTypeError("max_new_tokens must be at least 1")
    return overrides


def _optimization_level(value: str) -> int:
    if value.strip() not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(f"must be 0, 1, 2 or 3 (vLLM's levels), got {value!r}")
    return int(value)


def _compilation_config(value: str) -> dict[str, Any] | int:
    config = _json_or_none(value)
    if isinstance(config, int) and not isinstance(config, bool) and 0 <= config <= 3:
        return config  # older vLLM's bare level
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object such as {{"cudagraph_mode": '
                                         f'"NONE"}} or a level 0 to 3, got {value!r}')
    sizes = config.get("cudagraph_capture_sizes", [])
    largest = config.get("max_cudagraph_capture_size", 1)
    if not isinstance(sizes, list) or not all(is_count(n) for n in [*sizes, largest]):
        raise argparse.ArgumentTypeError("cudagraph_capture_sizes must be a list of positive "
                                         "integers and max_cudagraph_capture_size one")
    return config


def _structured_outputs_config(value: str) -> dict[str, Any]:
    config = _json_or_none(value)
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object such as {{"backend": '
                                         f'"xgrammar"}}, got {value!r}')
    unknown = sorted(set(config) - {"backend", "disable_fallback"})
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not supported here (accepted: "
                                         "backend, disable_fallback)")
    if config.get("backend", "auto") not in ("auto", "xgrammar"):
        raise argparse.ArgumentTypeError(f"backend {config['backend']!r} is not available: "
                                         "structured outputs run on xgrammar (auto or xgrammar)")
    return config


def _port(value: str) -> int:
    # Checked here: the socket layer takes a larger number modulo 65536 and listens elsewhere.
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number, 0 to 65535, got {value!r}")
    return int(value)


def seconds_argument(value: str) -> float:
    """A flag's duration: a finite number of seconds, 0 or more."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got "
                                         f"{value!r}")
    return seconds


def _non_negative_int(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {value!r}")
    return int(value)


def _non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"must be a number, 0 or more, got {value!r}")
    return number
