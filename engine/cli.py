"""The `tokenmill` command. Engine flags are derived from EngineConfig, never retyped."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tokenmill.engine.config import add_engine_arguments, engine_config_from_args


def _generate(args: argparse.Namespace) -> int:
    from tokenmill.engine.llm import LLM
    from tokenmill.engine.sampling_params import SamplingParams

    llm = LLM(**dataclasses.asdict(engine_config_from_args(args)))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.sampling_seed)
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
    from tokenmill.engine.server.serve import serve

    return serve(engine_config_from_args(args), args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Serve the OpenAI API over HTTP.")
    add_engine_arguments(serve)
    from tokenmill.engine.server.serve import add_server_arguments

    add_server_arguments(serve)
    serve.set_defaults(func=_serve)

    gen = commands.add_parser("generate", help="Generate with a model (chat template by default).")
    add_engine_arguments(gen)
    gen.add_argument("prompt", nargs="*", help="Prompts (default: a sample question).")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--raw", action="store_true", help="Plain completion, no chat template.")
    gen.add_argument("--json", action="store_true", help="One JSON object per prompt.")
    gen.set_defaults(func=_generate)

    commands.add_parser("operator", help="Run the Kubernetes operator (see `tokenmill "
                                          "operator --help`).", add_help=False)

    bench = commands.add_parser("bench", help="Benchmarks.")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    from tokenmill.engine.bench import offline

    offline_parser = bench_commands.add_parser("offline", help=offline.__doc__)
    add_engine_arguments(offline_parser)
    offline.add_arguments(offline_parser)
    offline_parser.set_defaults(func=offline.run)

    from tokenmill.engine.bench import random_model

    make_model_parser = bench_commands.add_parser("make-model", help=random_model.__doc__)
    random_model.add_arguments(make_model_parser)
    make_model_parser.set_defaults(func=random_model.run)

    from tokenmill.engine.bench import multiturn

    multiturn_parser = bench_commands.add_parser("multiturn", help=multiturn.__doc__)
    add_engine_arguments(multiturn_parser)
    multiturn.add_arguments(multiturn_parser)
    multiturn_parser.set_defaults(func=multiturn.run)

    from tokenmill.engine.bench import host_overhead

    host_parser = bench_commands.add_parser("host-overhead", help=host_overhead.__doc__)
    add_engine_arguments(host_parser)
    host_overhead.add_arguments(host_parser)
    host_parser.set_defaults(func=host_overhead.run)

    from tokenmill.engine.bench import accuracy

    accuracy_parser = bench_commands.add_parser("accuracy", help=accuracy.__doc__)
    add_engine_arguments(accuracy_parser)
    accuracy.add_arguments(accuracy_parser)
    accuracy_parser.set_defaults(func=accuracy.run)

    from tokenmill.engine.bench import serve as bench_serve

    serve_parser = bench_commands.add_parser("serve", help=bench_serve.__doc__)
    bench_serve.add_arguments(serve_parser)
    serve_parser.set_defaults(func=bench_serve.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tokenmill.engine.log import configure_logging

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:
        # The operator's own parser; this path imports no torch (the light operator image).
        from tokenmill.operator.__main__ import main as operator_main

        operator_main(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    configure_logging()
    from tokenmill.engine.config import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # an invalid option: one line naming it, as argparse does
        print(f"tokenmill {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
