"""The `tokenmill` command. Engine flags are derived from EngineConfig, never retyped."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from tokenmill.engine.contract.config import (
    DEFAULT_MODEL,
    ConfigError,
    EngineConfig,
    add_engine_arguments,
    engine_config_from_args,
)
from tokenmill.engine.contract.server_flags import add_server_arguments


def _generate(args: argparse.Namespace) -> int:
    from tokenmill.engine.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.sampling_seed)  # checked before the model loads
    config = engine_config_from_args(args)
    from tokenmill.engine.frontend.llm import LLM

    llm = LLM(**dataclasses.asdict(config))
    prompts = args.prompt or ["What is the capital of France?"]
    if args.raw:
        outputs = llm.generate(prompts, params)
    else:
        outputs = [llm.chat([{"role": "user", "content": p}], params)[0] for p in prompts]
    for prompt, out in zip(prompts, outputs, strict=True):
        completion = out.outputs[0]
        if args.json:
            print(json.dumps({"prompt": prompt, "text": completion.text,
                              "finish_reason": completion.finish_reason,
                              "num_tokens": len(completion.token_ids)}))
        else:
            print(f"> {prompt}\n{completion.text}\n")
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.model_tag is not None:  # `tokenmill serve MODEL`, as `vllm serve MODEL`
        if args.model not in (DEFAULT_MODEL, args.model_tag):
            raise ConfigError("model", f"given twice, as {args.model_tag!r} and as --model "
                                       f"{args.model!r}; give one")
        args.model = args.model_tag
    config = _server_config(args)
    from tokenmill.engine.server.serve import serve

    return serve(config, args)


def _server_config(args: argparse.Namespace) -> EngineConfig:
    """The engine options of `serve` and `run-batch`, checked before the server imports (a
    revision of a model that has none too: exit 2 now, not once the model loads); vLLM's
    --hf-token becomes the HF_TOKEN the hub client reads."""
    config = engine_config_from_args(args)
    if config.revision or config.tokenizer_revision:
        from tokenmill.engine.models.fetch.uri import pinned

        if config.revision is not None:
            pinned(config.model, config.revision)
        if config.tokenizer_revision is not None:
            pinned(config.tokenizer_source(), config.tokenizer_revision, "tokenizer_revision")
    if isinstance(args.hf_token, str):
        os.environ["HF_TOKEN"] = args.hf_token
    return config


def _run_batch(args: argparse.Namespace) -> int:
    config = _server_config(args)
    from tokenmill.engine.server.run_batch import run_batch

    return run_batch(config, args)


def _download(argv: list[str]) -> int:
    """`tokenmill download SOURCE...`: fetch each into the cache and print its local path; no
    torch is imported, so an init container needs only the light dependencies. One init
    container fetches a pod's model and its LoRA adapters, in order, stopping at the first
    failure."""
    from tokenmill.engine.log import configure_logging

    options = {f.name: f.metadata["help"] for f in dataclasses.fields(EngineConfig)}
    parser = argparse.ArgumentParser(prog="tokenmill download", description=DOWNLOAD_HELP)
    parser.add_argument("model", nargs="+", metavar="SOURCE", help=options["model"])
    parser.add_argument("--download-dir", default=None, help=options["download_dir"])
    parser.add_argument("--ignore-patterns", nargs="+", default=(), metavar="PATTERN",
                        help=options["ignore_patterns"])
    args = parser.parse_args(argv)
    configure_logging()
    for source in args.model:
        try:
            path = _downloaded(source, args.download_dir, tuple(args.ignore_patterns))
        except OSError as exc:  # a fetch or a missing path: one line naming the source and cause
            print(f"tokenmill download: error: {exc}", file=sys.stderr)
            return 1
        print(path, flush=True)
    return 0


def _downloaded(source: str, download_dir: str | None, ignore_patterns: tuple[str, ...]) -> str:
    """The local path of one source, fetched first if it is in a store: a LoRA adapter's
    directory (adapter_config.json, what --lora-modules reads), else what `serve` would load
    as the model."""
    from tokenmill.engine.models.fetch import fetch_model
    from tokenmill.engine.models.source import resolve_model

    path = fetch_model(source, download_dir, ignore_patterns) or source
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        return path
    model = resolve_model(path)  # a local path now: checked, not fetched again
    return model.gguf_path or model.directory


DOWNLOAD_HELP = ("Download hf:// or s3:// models or LoRA adapters into the cache (what `serve` "
                 "would load) and print their local paths, one a line.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Serve the OpenAI API over HTTP.")
    serve.add_argument("model_tag", nargs="?", metavar="MODEL",
                       help="the model to serve, as --model gives it (`tokenmill serve "
                            "Qwen/Qwen3-0.6B`, as with `vllm serve`)")
    serve.add_argument("--config", metavar="FILE",
                       help="A YAML file of flags by their long names (`max-num-seqs: 64`), "
                            "as vLLM's; the command line wins over it.")
    add_engine_arguments(serve)
    add_server_arguments(serve)
    serve.set_defaults(func=_serve)
    parser.serve_parser = serve  # --config reads its flags from it

    gen = commands.add_parser("generate", help="Generate with a model (chat template by default).")
    add_engine_arguments(gen)
    gen.add_argument("prompt", nargs="*", help="Prompts (default: a sample question).")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--raw", action="store_true", help="Plain completion, no chat template.")
    gen.add_argument("--json", action="store_true", help="One JSON object per prompt.")
    gen.set_defaults(func=_generate)

    batch = commands.add_parser(
        "run-batch", help="Answer a file of OpenAI batch requests offline (vLLM's run-batch).",
        description="Each line of the input is an OpenAI batch request, {\"custom_id\", "
                    "\"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\"} "
                    "(also /v1/completions, /v1/embeddings, /v1/responses, /v1/score, "
                    "/v1/rerank, /v1/classify); each line of the output, in the same "
                    "order, its answer: {\"id\", \"custom_id\", \"response\": "
                    "{\"status_code\", \"request_id\", \"body\"}, \"error\"}. The server's "
                    "flags apply.")
    batch.add_argument("-i", "--input-file", required=True, metavar="FILE",
                       help="The batch file (JSON lines).")
    batch.add_argument("-o", "--output-file", required=True, metavar="FILE",
                       help="Where the answers go (JSON lines), written once all are done.")
    add_engine_arguments(batch)
    add_server_arguments(batch)
    batch.set_defaults(func=_run_batch)

    for name, chat, helped in (("chat", True, "Chat with a running server (vLLM's `vllm "
                                                "chat`)."),
                               ("complete", False, "Complete prompts on a running server "
                                                   "(vLLM's `vllm complete`).")):
        client = commands.add_parser(name, help=helped, description=helped)
        _add_client_arguments(client, chat)

    commands.add_parser("download", help=DOWNLOAD_HELP + " See `tokenmill download --help`.",
                        add_help=False)
    commands.add_parser("operator", help="Run the Kubernetes operator (see `tokenmill "
                                          "operator --help`).", add_help=False)

    bench = commands.add_parser("bench", help="Benchmarks.")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    from tokenmill.engine.bench import (
        accuracy,
        embed,
        host_overhead,
        llama_cpp_ab,
        load,
        multiturn,
        offline,
        random_model,
        s3_fetch,
        speculative,
    )
    from tokenmill.engine.bench import serve as bench_serve
    from tokenmill.engine.bench.gpu_suite import suite as gpu_suite

    _add_bench(bench_commands, "offline", offline)
    _add_bench(bench_commands, "make-model", random_model, engine_flags=False)
    _add_bench(bench_commands, "multiturn", multiturn)
    _add_bench(bench_commands, "embed", embed)
    _add_bench(bench_commands, "host-overhead", host_overhead)
    _add_bench(bench_commands, "accuracy", accuracy)
    _add_bench(bench_commands, "llama-cpp", llama_cpp_ab)
    _add_bench(bench_commands, "speculative", speculative)
    _add_bench(bench_commands, "serve", bench_serve, engine_flags=False)
    _add_bench(bench_commands, "s3-fetch", s3_fetch, engine_flags=False)
    _add_bench(bench_commands, "load", load, engine_flags=False)
    _add_bench(bench_commands, "gpu", gpu_suite, engine_flags=False)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, with `serve --config FILE`'s flags under it."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve" and args.config is not None:
        model_given = args.model_tag is not None or any(
            a == "--model" or a.startswith("--model=") for a in argv)
        flags = _config_file_flags(parser.serve_parser, args.config, keep_model=not model_given)
        args = parser.parse_args([argv[0], *flags, *argv[1:]])
    return args


def _config_file_flags(serve: argparse.ArgumentParser, path: str,
                       keep_model: bool) -> list[str]:
    """`serve --config FILE` (vLLM's): the YAML file's `long-flag-name: value` pairs as flags,
    to go before the command line's own, which win. A model given on the command line wins
    over the file's `model`. A file that can't be used ends the command with exit 2."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            options = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        serve.error(f"--config: can't read {path}: " + " ".join(str(exc).split()))
    if options is None:
        return []
    if not isinstance(options, dict):
        serve.error(f"--config: {path} must map flag names to values (`max-num-seqs: 64`)")
    # Every name of a flag (vLLM's --kv-cache-memory-bytes too), but a switch's --no- form.
    actions = {name: a for a in serve._actions for name in a.option_strings
               if name == a.option_strings[0] or not name.startswith("--no-")}
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        action = actions.get(flag)
        if action is None or flag in ("--config", "--help"):
            serve.error(f"--config: {key!r} in {path} is not a flag of tokenmill serve")
        if flag == "--model" and not keep_model:
            continue
        if isinstance(value, bool):
            negative = "--no-" + flag[2:]
            flags += [flag] if value else [negative] if negative in action.option_strings else []
        elif isinstance(value, list) and action.nargs in ("+", "*"):
            flags += [flag, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
        elif isinstance(value, list | dict):
            flags += [flag, json.dumps(value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def _add_client_arguments(parser: argparse.ArgumentParser, chat: bool) -> None:
    """`tokenmill chat` / `complete`: the client's flags; it imports only httpx."""
    from tokenmill.engine.server import chat_client

    chat_client.add_arguments(parser, chat)
    parser.set_defaults(func=lambda args: chat_client.run(args, chat))


def _add_bench(commands: argparse._SubParsersAction, name: str, module: Any,
               engine_flags: bool = True) -> None:
    """One `tokenmill bench NAME`: the module's docstring, flags (after the engine's) and run."""
    sub = commands.add_parser(name, help=module.__doc__)
    if engine_flags:
        add_engine_arguments(sub)
    module.add_arguments(sub)
    sub.set_defaults(func=module.run)


def main(argv: list[str] | None = None) -> int:
    from tokenmill.engine.log import configure_logging

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:
        # The operator's own parser; this path imports no torch (the light operator image).
        from tokenmill.operator.__main__ import main as operator_main

        operator_main(argv[1:])
        return 0
    if argv[:1] == ["download"]:  # no torch either: what an init container runs
        return _download(argv[1:])
    args = parse_args(argv)
    configure_logging()
    prog = " ".join(filter(None, ["tokenmill", args.command, getattr(args, "bench_command", None)]))
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        code = _exit_code(exc)
        if code is None:
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return code


def _exit_code(exc: Exception) -> int | None:
    """2 for an invalid option (as argparse), 1 for a model or prompt that cannot work, None
    for anything else (a bug: its traceback is shown). Imported here, where they are needed:
    the engine's errors module imports torch, so the option errors are told apart first."""
    from tokenmill.engine.contract.config import ConfigError
    from tokenmill.engine.core.sampling_params import SamplingParamsError

    if isinstance(exc, ConfigError | SamplingParamsError):
        return 2
    from tokenmill.engine.core.errors import ModelLoadError, RequestError

    if isinstance(exc, ModelLoadError | OSError | RequestError):
        return 1
    return None


if __name__ == "__main__":
    sys.exit(main())
