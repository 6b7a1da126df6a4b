"""`tokenmill bench make-model`: a random-weight checkpoint of a real model's shape.

Speed depends on shapes, not weight values, so benchmarks of large shapes need no download:
the config of the named shape, random weights, and a tokenizer: the built-in SmolLM2's (the
vocabulary is then the tokenizer's, 49,152 tokens), or a word-level one of the shape's own
vocabulary size (`--tokenizer word-level`: the real embedding and LM-head shapes, and no GGUF
reader needed). Greedy outputs of such a model are meaningless; its throughput is the real
shape's.
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
    # Mixtures of experts: 128 experts of which 8 run per token; 8 of which 2 run.
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, rope_theta=1000000.0,
        max_position_embeddings=8192)),
    "mixtral-8x7b": ("MixtralConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        rope_theta=1000000.0, max_position_embeddings=8192)),
    # Gemma 2: sliding (4096) and full layers alternate; scores and logits are soft-capped.
    "gemma-2-9b": ("Gemma2Config", dict(
        hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0,
        max_position_embeddings=8192)),
}

# The vocabulary of each shape's own tokenizer (config.json's vocab_size).
VOCAB_SIZES = {"llama-3.1-8b": 128256, "llama-3.2-1b": 128256, "qwen3-0.6b": 151936,
               "qwen3-8b": 151936, "qwen3-30b-a3b": 151936, "mixtral-8x7b": 32000,
               "gemma-2-9b": 256000}
TOKENIZERS = ("builtin", "word-level")
BUILTIN_VOCAB_SIZE = 49152  # SmolLM2's

# No real model's shape: tiny width so a decode step is nearly all host work (bench
# host-overhead). Apart from SHAPES: its 4 heads do not shard at every CRD size.
TINY_DEEP = ("LlamaConfig", dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=32, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=4096))

# No real model's shape either: Qwen3.5's layers (three gated delta nets to one gated
# attention layer) at a size a CPU runs, for what a recurrent state changes (the prefix
# cache's checkpoints: bench multiturn).
HYBRID_SMALL = ("Qwen3_5TextConfig", dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=8,
    num_key_value_heads=2, head_dim=128, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16,
    layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=8192))
OWN_SHAPES = {"tiny-deep": TINY_DEEP, "hybrid-small": HYBRID_SMALL}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shape", choices=sorted(SHAPES) + sorted(OWN_SHAPES),
                        help="Whose config to copy (tiny-deep: hidden size 64, 32 layers, so "
                             "that a step is nearly all host work, as in bench host-overhead; "
                             "hybrid-small: Qwen3.5's layers at 300M parameters).")
    parser.add_argument("output", help="Directory to write (config, tokenizer, safetensors).")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                        help="Weight dtype on disk (default bfloat16).")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="Fewer decoder layers than the shape has (a smaller checkpoint).")
    parser.add_argument("--max-shard-size", default=None,
                        help="Split the weights into files of at most this size (\"300MB\").")
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="builtin",
                        help="builtin: SmolLM2's (49,152 tokens); word-level: one of the "
                             "shape's own vocabulary size, built here (default builtin).")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="With --tokenizer word-level: its size, instead of the shape's.")
    parser.add_argument("--device", default="cpu",
                        help="Where the random weights are made before they are saved (cuda "
                             "makes an 8B model in seconds; default cpu).")


def run(args: argparse.Namespace) -> int:
    overrides = {} if args.num_layers is None else {"num_hidden_layers": args.num_layers}
    if args.vocab_size is not None and args.tokenizer != "word-level":
        print("error: --vocab-size needs --tokenizer word-level (the built-in tokenizer has "
              f"{BUILTIN_VOCAB_SIZE} tokens)", file=sys.stderr)
        return 2
    shape = OWN_SHAPES.get(args.shape, args.shape)
    make_model(shape, args.output, args.dtype, max_shard_size=args.max_shard_size,
               tokenizer=args.tokenizer, device=args.device, vocab_size=args.vocab_size,
               **overrides)
    print(f"wrote a random-weight {args.shape} to {args.output}", file=sys.stderr)
    return 0


def shape_config(shape: str | tuple[str, dict], vocab_size: int, **overrides: object) -> object:
    """The transformers config of `shape` (a SHAPES name, or a (config class, sizes) pair such
    as TINY_DEEP) with the given vocabulary; `overrides` replace sizes (num_hidden_layers=4)."""
    import transformers

    kind, sizes = SHAPES[shape] if isinstance(shape, str) else shape
    sizes = {**sizes, **overrides}
    if "layer_types" in sizes:  # a pattern repeated over the layers
        pattern = sizes["layer_types"]
        sizes["layer_types"] = (pattern * sizes["num_hidden_layers"])[
            :sizes["num_hidden_layers"]]
    return getattr(transformers, kind)(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2,
                                       **sizes)


def make_model(shape: str | tuple[str, dict], output: str, dtype: str = "bfloat16",
               max_shard_size: str | None = None, tokenizer: str = "builtin",
               device: str = "cpu", vocab_size: int | None = None,
               **overrides: object) -> str:
    import torch
    import transformers

    tokenizer_object = shape_tokenizer(shape, tokenizer, vocab_size)
    config = shape_config(shape, len(tokenizer_object), **overrides)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config,
                                                              dtype=getattr(torch, dtype))
    model.save_pretrained(output, **({} if max_shard_size is None
                                     else {"max_shard_size": max_shard_size}))
    tokenizer_object.save_pretrained(output)
    return output


def shape_tokenizer(shape: str | tuple[str, dict], kind: str,
                    vocab_size: int | None = None) -> object:
    """The tokenizer a random-weight model of `shape` gets (TOKENIZERS: builtin or word-level,
    of `vocab_size` tokens where given, else of the shape's vocabulary)."""
    if kind not in TOKENIZERS:
        raise ValueError(f"tokenizer {kind!r} is not one of {TOKENIZERS}")
    if kind == "word-level":
        from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer

        default = VOCAB_SIZES[shape] if isinstance(shape, str) else BUILTIN_VOCAB_SIZE
        return word_level_tokenizer(vocab_size or default)
    if vocab_size is not None:
        raise ValueError("a vocabulary size needs the word-level tokenizer")
    from tokenmill.engine.models.loader import load_tokenizer
    from tokenmill.engine.models.source import resolve_model

    return load_tokenizer(resolve_model("smollm2-135m-instruct"))
