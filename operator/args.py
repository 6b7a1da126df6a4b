"""The `tokenmill serve` command line of an InferenceService.

Flags come from the engine's own option table (`engine_args`, `EngineConfig`), never retyped
here, so the operator cannot emit a flag or a value the engine would reject at start-up.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
from typing import Any

from pydantic.alias_generators import to_camel

from tokenmill.engine.contract.config import (
    ConfigError,
    EngineConfig,
    add_engine_arguments,
    cli_flag,
    engine_args,
    engine_config_from_args,
)
from tokenmill.engine.contract.server_flags import add_server_arguments, check_server_flags
from tokenmill.engine.contract.speculative import KEYS as SPECULATIVE_KEYS

from .pod_layout import ADAPTER_PVC_MOUNT, CACHE_MOUNT, DRAFT_PVC_MOUNT, PVC_MOUNT
from .spec import ADAPTERS, SPECULATIVE, InferenceServiceSpec, SpecError

PORT = 8000

# Options the spec sets through its own fields; extraArgs may not set them again.
_SPEC_OPTIONS = {
    "model": "spec.model.uri",
    "revision": "spec.model.uri (hf://ORG/NAME@REVISION)",
    "download_dir": "spec.model (the operator's model cache)",
    "device": "spec.resources.gpus",
    "tensor_parallel_size": "spec.engine.tensorParallelSize",
    "quantization": "spec.engine.quantization",
    "kv_cache_dtype": "spec.engine.kvCacheDtype",
    "enable_prefix_caching": "spec.engine.prefixCaching",
    "max_model_len": "spec.engine.maxModelLen",
    "max_num_seqs": "spec.engine.maxNumSeqs",
    "max_num_batched_tokens": "spec.engine.maxNumBatchedTokens",
    "gpu_memory_utilization": "spec.engine.gpuMemoryUtilization",
    "kv_offloading_size": "spec.engine.kvOffloadingSize",
    "speculative_config": SPECULATIVE,
    "enable_lora": ADAPTERS,
    "lora_modules": ADAPTERS,
    "max_loras": "spec.engine.maxLoras",
    "max_lora_rank": "spec.engine.maxLoraRank",
    "max_cpu_loras": "spec.engine.maxCpuLoras",
}
_SERVER_FLAGS = ("host", "port", "served-model-name", "shutdown-timeout")
# Server flags that cannot work in a pod, and why: the kubelet's probes, the Service's clients
# and the autoscaler's scrapes speak plain HTTP to the pod's port, and the pod has only the
# files the operator mounts.
_PLAIN_HTTP = ("the pod's probes, its Service and the autoscaler speak plain HTTP to the "
               "engine; terminate TLS at a Gateway or a service mesh")
_REFUSED_FLAGS = {
    "config": "the pod has no such file; put its flags in extraArgs",
    "tokenizer-revision": "the pod reads its tokenizer from the files the operator mounts or "
                          "downloads; pin the model with spec.model.uri hf://ORG/NAME@REVISION",
    "uds": f"the pod's probes, its Service and the autoscaler reach the engine on port {PORT}",
    **dict.fromkeys(("ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "ssl-cert-reqs",
                     "ssl-ciphers", "enable-ssl-refresh"),
                    _PLAIN_HTTP),
}


def _server_option_names() -> frozenset[str]:
    """The server's own options (--enable-auto-tool-choice, --chat-template, ...), which
    extraArgs may set too, apart from those the operator sets or keeps out of the spec."""
    parser = argparse.ArgumentParser(add_help=False)
    add_server_arguments(parser, environ={})
    operator_set = {flag.replace("-", "_") for flag in (*_SERVER_FLAGS, *_REFUSED_FLAGS)}
    return frozenset(vars(parser.parse_args([]))) - operator_set - {"api_key"}


_USER_SERVER_OPTIONS = _server_option_names()


def model_path(uri: str, pvc_mount: str = PVC_MOUNT) -> str:
    """Where the engine finds the model: pvc://claim/path is mounted under `pvc_mount`; an
    s3:// model is the directory `tokenmill download` filled (DIR/s3/BUCKET/PREFIX), so the
    engine neither lists the store (network, credentials) nor takes the download's lock (a
    write); hf:// stays a URI the engine resolves in the cache, offline (see manifests)."""
    if uri.startswith("pvc://"):
        _, _, path = uri.removeprefix("pvc://").partition("/")
        return f"{pvc_mount}/{path}".rstrip("/")
    if uri.startswith("s3://"):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        return posixpath.join(CACHE_MOUNT, "s3", bucket,
                              *prefix.strip("/").split("/")).rstrip("/")
    return uri


def hub_sources(spec: InferenceServiceSpec) -> bool:
    """Whether the engine resolves a hf:// model or adapter in the cache (offline, see
    manifests)."""
    return any(uri.startswith("hf://") for uri in spec.downloads)


def download_dir(spec: InferenceServiceSpec) -> str | None:
    """The engine's --download-dir: the cache, for the sources it resolves there (hf://)."""
    return CACHE_MOUNT if hub_sources(spec) else None


def _claim(uri: str) -> str | None:
    return uri.removeprefix("pvc://").partition("/")[0] if uri.startswith("pvc://") else None


def draft_claim(spec: InferenceServiceSpec) -> str | None:
    """The claim of a draft model that needs a volume of its own (one on the served model's
    claim is read through that model's mount)."""
    speculative = spec.engine.speculative
    claim = _claim(speculative.model) if speculative and speculative.model else None
    return claim if claim and claim != _claim(spec.model.uri) else None


def adapter_claims(spec: InferenceServiceSpec) -> list[str]:
    """The claims of pvc:// adapters that need a volume of their own, each once, in the spec's
    order (one the model or the draft model is on is read through their mount)."""
    shared = {_claim(spec.model.uri), draft_claim(spec)}
    claims = [_claim(a.uri) for a in spec.adapters]
    return [c for c in dict.fromkeys(claims) if c and c not in shared]


def _claim_mount(spec: InferenceServiceSpec, claim: str) -> str:
    """Where the pod mounts a claim the spec reads from."""
    if claim == _claim(spec.model.uri):
        return PVC_MOUNT
    if claim == draft_claim(spec):
        return DRAFT_PVC_MOUNT
    return f"{ADAPTER_PVC_MOUNT}/{claim}"


def lora_modules(spec: InferenceServiceSpec) -> tuple[str, ...]:
    """--lora-modules NAME=PATH, each adapter where the engine finds it, as the model is: a
    pvc:// one under its claim's mount, an s3:// one in the directory the init container filled,
    a hf:// one as its URI resolved offline in the cache, a path in the image as it is."""
    modules = []
    for adapter in spec.adapters:
        claim = _claim(adapter.uri)
        mount = _claim_mount(spec, claim) if claim else PVC_MOUNT
        modules.append(f"{adapter.name}={model_path(adapter.uri, mount)}")
    return tuple(modules)


def speculative_config(spec: InferenceServiceSpec) -> str | None:
    """--speculative-config: spec.engine.speculative as JSON with vLLM's keys (the fields'
    own names), the draft model where the pod finds it; None when not set."""
    speculative = spec.engine.speculative
    if speculative is None:
        return None
    config = speculative.model_dump(exclude_none=True)
    if speculative.model is not None:
        mount = DRAFT_PVC_MOUNT if draft_claim(spec) else PVC_MOUNT
        config["model"] = model_path(speculative.model, mount)
    return json.dumps(config, separators=(",", ":"))


def _speculative_problem(message: str) -> str:
    """The contract's message about --speculative-config in the spec's terms: vLLM's keys
    become the fields of spec.engine.speculative, and the one field it names leads."""
    quoted = {key: re.compile(f"['\"]{key}['\"]") for key in SPECULATIVE_KEYS}
    named = [key for key, pattern in quoted.items() if pattern.search(message)]
    for key in named:
        message = quoted[key].sub(to_camel(key), message)
    field = f"{SPECULATIVE}.{to_camel(named[0])}" if len(named) == 1 else SPECULATIVE
    return f"{field}: {message}"


def engine_options(spec: InferenceServiceSpec) -> dict[str, Any]:
    """EngineConfig option values of a spec (None: the engine's default)."""
    engine = spec.engine
    return {
        "model": model_path(spec.model.uri),
        "download_dir": download_dir(spec),
        "device": "cpu" if spec.gpus == 0 else None,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "quantization": None if engine.quantization == "auto" else engine.quantization,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "enable_prefix_caching": engine.prefix_caching,
        "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "kv_offloading_size": float(engine.kv_offloading_size) or None,
        "speculative_config": speculative_config(spec),
        "enable_lora": bool(spec.adapters) or None,
        "lora_modules": lora_modules(spec) or None,
        "max_loras": spec.max_loras if spec.adapters else None,
        "max_lora_rank": engine.max_lora_rank,
        "max_cpu_loras": engine.max_cpu_loras,
    }


class _ExtraArgsParser(argparse.ArgumentParser):
    """The engine's own flag parser, failing with a SpecError instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise SpecError(f"spec.engine.extraArgs: {message}")


def _serve_parser() -> argparse.ArgumentParser:
    """`tokenmill serve`'s flags, failing with a SpecError."""
    parser = _ExtraArgsParser(prog="tokenmill serve", add_help=False)
    add_engine_arguments(parser)
    add_server_arguments(parser, environ={})
    return parser


def check_engine(spec: InferenceServiceSpec) -> None:
    """SpecError if the engine would reject these options, an extra flag or its value, exactly
    as `tokenmill serve` parses and checks them at start-up."""
    parser = _serve_parser()
    # Every name of every flag (--no-X, vLLM's other names) -> its option.
    options = {name: a.dest for a in parser._actions for name in a.option_strings}
    for arg in spec.engine.extra_args:
        if not arg.startswith("--"):
            continue
        flag = arg[2:].partition("=")[0]
        option = options.get(f"--{flag}", flag.removeprefix("no-").replace("-", "_"))
        if flag == "hf-token":
            raise SpecError("spec.engine.extraArgs: --hf-token would show the token to anyone "
                            "who can read the Deployment; use spec.model.credentialsSecretRef")
        if flag == "api-key":
            raise SpecError("spec.engine.extraArgs: --api-key would show the key to anyone who "
                            "can read the Deployment; use spec.auth.apiKeySecretRef")
        if flag in _SERVER_FLAGS:
            raise SpecError(f"spec.engine.extraArgs: --{flag} is set by the operator")
        if flag in _REFUSED_FLAGS:
            raise SpecError(f"spec.engine.extraArgs: --{flag}: {_REFUSED_FLAGS[flag]}")
        if option in _SPEC_OPTIONS:
            raise SpecError(f"spec.engine.extraArgs: --{flag} is set by {_SPEC_OPTIONS[option]}")
        if option not in EngineConfig.option_names() and option not in _USER_SERVER_OPTIONS:
            raise SpecError(f"spec.engine.extraArgs: --{flag} is not a tokenmill engine flag")
    args = parser.parse_args([*engine_args(**engine_options(spec)), *spec.engine.extra_args])
    if args.tokenizer is not None and not args.tokenizer.startswith("/"):
        raise SpecError(f"spec.engine.extraArgs: --tokenizer {args.tokenizer}: the pod has only "
                        f"the files the operator mounts or downloads; give an absolute path "
                        f"in the pod (the model's claim is at {PVC_MOUNT})")
    try:
        check_server_flags(args)
    except ConfigError as e:
        raise SpecError(f"spec.engine.extraArgs: {e}") from None
    try:
        engine_config_from_args(args).check_supported()
    except ConfigError as e:
        message = str(e).partition(": ")[2]
        if e.option == "speculative_config":
            raise SpecError(_speculative_problem(message)) from None
        field = _SPEC_OPTIONS.get(e.option, f"spec.engine.extraArgs: {cli_flag(e.option)}")
        raise SpecError(f"{field}: {message}") from None


def download_command(spec: InferenceServiceSpec) -> list[str]:
    """The init container's command: the hf:// and s3:// model and adapters into the cache,
    where the engine finds them, one after the other; without the files extraArgs'
    --ignore-patterns leave out, as the engine would fetch them."""
    patterns = _serve_parser().parse_args(spec.engine.extra_args).ignore_patterns
    return ["tokenmill", "download", *spec.downloads, "--download-dir", CACHE_MOUNT,
            *(["--ignore-patterns", *patterns] if patterns else [])]


def serve_command(spec: InferenceServiceSpec, served_name: str) -> list[str]:
    """The container command: the server flags, then the engine flags, then extraArgs."""
    return [
        "tokenmill", "serve",
        "--host", "0.0.0.0",
        "--port", str(PORT),
        "--served-model-name", served_name,
        "--shutdown-timeout", str(spec.shutdown_timeout_seconds),
        *engine_args(**engine_options(spec)),
        *spec.engine.extra_args,
    ]
