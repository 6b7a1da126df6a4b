"""`tokenmill bench make-model`: a random-weight checkpoint of a real model's shape.

Speed depends on shapes, not weight values, so benchmarks of large shapes need no download:
the config of the named shape, random weights, and the built-in SmolLM2 tokenizer (the
vocabulary is the tokenizer's, 49,152 tokens, so every sampled id decodes). Greedy outputs of
such a model are meaningless; its throughput is the real shape's.
"""

from __future__ import annotations

import argparse
import sys

# Architecture and sizes from each model's published config.json.
SHAPES = {
    "llama-3.1-8b": ("LlamaConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=8192,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "llama-3.2-1b": ("LlamaConfig", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, rope_theta=500000.0, max_position_embeddings=8192,
        tie_word_embeddings=True)),
    "qwen3-0.6b": ("Qwen3Config", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=8192,
        tie_word_embeddings=True)),
    "qwen3-8b": ("Qwen3Config", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=8192)),
}

# No real model's shape: tiny width so a decode step is nearly all host work (bench
# host-overhead). Apart from SHAPES: its 4 heads do not shard at every CRD size.
TINY_DEEP = ("LlamaConfig", dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=32, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=4096))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shape", choices=sorted(SHAPES), help="Whose config to copy.")
    parser.add_argument("output", help="Directory to write (config, tokenizer, safetensors).")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                        help="Weight dtype on disk (default bfloat16).")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="Fewer decoder layers than the shape has (a smaller checkpoint).")
    parser.add_argument("--max-shard-size", default=None,
                        help="Split the weights into files of at most this size (\"300MB\").")


def run(args: argparse.Namespace) -> int:
    overrides = {} if args.num_layers is None else {"num_hidden_layers": args.num_layers}
    make_model(args.shape, args.output, args.dtype, max_shard_size=args.max_shard_size,
               **overrides)
    print(f"wrote a random-weight {args.shape} to {args.output}", file=sys.stderr)
    return 0


def shape_config(shape: str | tuple[str, dict], vocab_size: int, **overrides: object) -> object:
    """The transformers config of `shape` (a SHAPES name, or a (config class, sizes) pair such
    as TINY_DEEP) with the given vocabulary; `overrides` replace sizes (num_hidden_layers=4)."""
    import transformers

    kind, sizes = SHAPES[shape] if isinstance(shape, str) else shape
    return getattr(transformers, kind)(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2,
                                       **{**sizes, **overrides})


def make_model(shape: str | tuple[str, dict], output: str, dtype: str = "bfloat16",
               max_shard_size: str | None = None, **overrides: object) -> str:
    import torch
    import transformers

    from tokenmill.engine.models.loader import load_tokenizer
    from tokenmill.engine.models.source import resolve_model

    tokenizer = load_tokenizer(resolve_model("smollm2-135m-instruct"))
    config = shape_config(shape, len(tokenizer), **overrides)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(output, **({} if max_shard_size is None
                                     else {"max_shard_size": max_shard_size}))
    tokenizer.save_pretrained(output)
    return output
