"""Embedding throughput: tokenmill's pooling runner against sentence-transformers' encode on the
same texts and checkpoint, in one run.

The model is a sentence-transformers directory (--model), or with --shape a random-weight
embedding checkpoint of a real model's shape, written by sentence-transformers itself (a bare
decoder with last-token pooling, or an encoder of ENCODER_SHAPES with first-token pooling;
normalized). Both sides run in this process on the engine's
device and dtype; the rounds alternate (sentence-transformers first, then tokenmill, again),
so drift falls on both; every round embeds fresh texts (a repeated text would come from
tokenmill's prefix cache). Reported: texts/s and prompt tokens/s of each, their ratio, and the
largest difference between the two sides' vectors (they must agree).
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import tempfile
import time
from typing import Any

from tokenmill.engine.bench.random_model import SHAPES
from tokenmill.engine.bench.report import command_line, git_revision, machine_info, write_json
from tokenmill.engine.bench.workload import parse_range

# Encoders' shapes, as the embedding models most served have them: BERT-base (bge-base,
# e5-base, all-mpnet's size) and XLM-RoBERTa-large (bge-m3, multilingual-e5-large).
ENCODER_SHAPES = {
    "bert-base": ("BertConfig", dict(hidden_size=768, intermediate_size=3072,
                                     num_hidden_layers=12, num_attention_heads=12,
                                     max_position_embeddings=512)),
    "xlm-roberta-large": ("XLMRobertaConfig", dict(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
        max_position_embeddings=514, type_vocab_size=1, pad_token_id=1)),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-texts", type=int, default=128, help="Texts to embed per round.")
    parser.add_argument("--input-len", type=parse_range, default="16:256",
                        help="Text length range in tokens LOW:HIGH, uniform (default 16:256).")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentence-transformers' encode batch size (default 32).")
    parser.add_argument("--rounds", type=int, default=2,
                        help="Timed rounds of each side, each on fresh texts.")
    parser.add_argument("--shape", choices=sorted({*SHAPES, *ENCODER_SHAPES}), default=None,
                        help="Embed with a random-weight checkpoint of this shape instead of "
                             "--model (written to a temporary directory).")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="With --shape: fewer decoder layers than the shape has.")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="Write the raw results as JSON here.")


def run(args: argparse.Namespace) -> int:
    from tokenmill.engine.contract.config import ConfigError, engine_config_from_args

    config = engine_config_from_args(args)
    with tempfile.TemporaryDirectory(prefix="tokenmill-embed-") as scratch:
        if args.shape is not None:
            config = config.replace(model=make_embedding_checkpoint(
                args.shape, scratch, args.num_layers))
        elif not os.path.isfile(os.path.join(config.model, "modules.json")):
            raise ConfigError("model", f"{config.model} is no sentence-transformers directory "
                              "(modules.json), which bench embed compares with; give one, or "
                              "--shape")
        result = compare(config, args)
    result.update({"command": command_line(), "git": git_revision(),
                   "machine": machine_info(result["device"])})
    print(format_result(result))
    if args.json:
        write_json(args.json, result)
    return 0


def make_embedding_checkpoint(shape: str, directory: str, num_layers: int | None) -> str:
    """A random-weight bare decoder (or encoder) of `shape` with the built-in tokenizer, saved
    by sentence-transformers with last-token (an encoder's: first-token) pooling and
    normalization."""
    import torch
    import transformers

    from tokenmill.engine.bench.random_model import shape_config, shape_tokenizer

    tokenizer = shape_tokenizer(shape if shape in SHAPES else ENCODER_SHAPES[shape], "builtin")
    overrides = {} if num_layers is None else {"num_hidden_layers": num_layers}
    config = shape_config(ENCODER_SHAPES.get(shape, shape), len(tokenizer), **overrides)
    torch.manual_seed(0)
    model = getattr(transformers, type(config).__name__.replace("Config", "Model"))(config)
    pooling = "cls" if shape in ENCODER_SHAPES else "lasttoken"
    return save_sentence_transformer(model, tokenizer, directory, pooling)


def save_sentence_transformer(decoder: Any, tokenizer: Any, directory: str,
                              pooling_mode: str = "lasttoken", normalize: bool = True) -> str:
    """Save a bare decoder (a transformers *Model) as sentence-transformers writes an embedding
    model: the decoder, its Pooling step (`pooling_mode`, sentence-transformers' name) and
    Normalize. Returns the model's directory. The tokenizer is saved without a chat template:
    sentence-transformers renders text through one where the tokenizer has it, while `input`
    of /v1/embeddings is embedded as given."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    raw = os.path.join(directory, "decoder")
    decoder.save_pretrained(raw)
    plain.save_pretrained(raw)
    steps = [Transformer(raw), Pooling(decoder.config.hidden_size, pooling_mode=pooling_mode)]
    if normalize:
        steps.append(Normalize())
    path = os.path.join(directory, "model")
    SentenceTransformer(modules=steps, device="cpu").save(path)
    return path


def make_texts(tokenizer: Any, count: int, lengths: tuple[int, int], seed: int) -> list[str]:
    """Seeded texts of words from the vocabulary, about `lengths` tokens each."""
    rng = random.Random(seed)
    spelled = (tokenizer.decode([i]).strip() for i in range(min(len(tokenizer), 20000)))
    words = sorted({w for w in spelled if w.isalpha() and len(w) > 2})
    return [" ".join(rng.choices(words, k=rng.randint(*lengths))) for _ in range(count)]


def compare(config: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    from tokenmill.engine import LLM

    llm = LLM(show_progress=False, **{**config.__dict__, "runner": "pooling"})
    engine = llm.engine
    st = SentenceTransformer(config.model, device=str(engine.device),
                             model_kwargs={"dtype": engine.dtype})
    # Fresh texts every round (the same for both sides): a text embedded before would come
    # from tokenmill's prefix cache, all but its last token.
    rounds = [make_texts(llm.tokenizer, args.num_texts, args.input_len,
                         args.workload_seed * 1000 + r) for r in range(args.rounds + 1)]
    tokens = sum(len(llm.tokenizer.encode(t)) for texts in rounds[1:] for t in texts)

    def tokenmill_side(texts: list[str]) -> torch.Tensor:
        return torch.tensor([o.outputs.embedding for o in llm.embed(texts)])

    def st_side(texts: list[str]) -> torch.Tensor:
        return st.encode(texts, batch_size=args.batch_size, convert_to_tensor=True).float().cpu()

    sides = {"sentence-transformers": st_side, "tokenmill": tokenmill_side}
    for side in sides.values():  # warm-up: first-call costs out of the timings
        side(rounds[0][:8])
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    difference = 0.0
    for round_index, texts in enumerate(rounds[1:]):
        vectors = {}
        for name, side in sides.items():
            start = time.perf_counter()
            vectors[name] = side(texts)
            seconds[name].append(time.perf_counter() - start)
            print(f"round {round_index + 1}: {name} {seconds[name][-1]:.2f} s", file=sys.stderr)
        difference = max(difference, float((vectors["tokenmill"]
                                            - vectors["sentence-transformers"]).abs().max()))
    llm.shutdown()
    texts_per_s = {name: args.num_texts * len(s) / sum(s) for name, s in seconds.items()}
    tokens_per_s = {name: tokens / sum(s) for name, s in seconds.items()}
    return {
        "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
        "model": args.shape or config.model, "num_texts": args.num_texts,
        "input_len": list(args.input_len), "prompt_tokens": tokens,
        "st_batch_size": args.batch_size, "rounds": args.rounds,
        "pooler": {"pooling_type": engine.pooler.pooling_type,
                   "normalize": engine.pooler.normalize}, "seconds": seconds,
        "texts_per_s": texts_per_s,
        "tokens_per_s": tokens_per_s,
        "ratio_tokenmill_st": texts_per_s["tokenmill"] / texts_per_s["sentence-transformers"],
        "max_abs_difference": difference,
    }


def format_result(result: dict[str, Any]) -> str:
    rates = result["texts_per_s"]
    tokens = result["tokens_per_s"]
    return "\n".join([
        f"{result['rounds']} rounds of {result['num_texts']} texts, {result['prompt_tokens']} "
        f"tokens in all, {result['device']} {result['dtype']}",
        f"sentence-transformers  {rates['sentence-transformers']:.1f} texts/s "
        f"({tokens['sentence-transformers']:.0f} tok/s, batch {result['st_batch_size']})",
        f"tokenmill              {rates['tokenmill']:.1f} texts/s "
        f"({tokens['tokenmill']:.0f} tok/s)",
        f"tokenmill / st         {result['ratio_tokenmill_st']:.2f}",
        f"largest difference     {result['max_abs_difference']:.2e}",
    ])
