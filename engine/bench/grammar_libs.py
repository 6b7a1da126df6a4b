"""Per-token cost of three grammar libraries on one tokenizer: how structured outputs were chosen.

For each library (xgrammar, llguidance, outlines-core) and each JSON schema, it times:
- setup: building the library's view of the tokenizer (once per engine),
- compile: turning the schema into something a matcher runs (once per distinct schema),
- per token: filling a sequence's bitmask of allowed tokens and advancing by the next token,
  walking the token ids of a fixed valid document (the same ids for every library).

Only the mask computation and the advance differ between libraries; applying a mask to the
logits is the engine's own tensor op and is not timed here. Libraries that are not installed
are skipped. Run: python -m tokenmill.engine.bench.grammar_libs --json PATH
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# The schemas and a valid document for each. "flat" is the size of a typical API response;
# "nested" adds enums, arrays of objects and numbers.
SCHEMAS: dict[str, tuple[dict[str, Any], str]] = {
    "flat": (
        {"type": "object",
         "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                        "city": {"type": "string"}, "member": {"type": "boolean"}},
         "required": ["name", "age", "city", "member"], "additionalProperties": False},
        '{"name": "Alice Smith", "age": 31, "city": "Paris", "member": true}',
    ),
    "nested": (
        {"type": "object",
         "properties": {
             "id": {"type": "integer"},
             "status": {"enum": ["active", "suspended", "closed"]},
             "owner": {"type": "object",
                       "properties": {"name": {"type": "string"},
                                      "email": {"type": "string"}},
                       "required": ["name", "email"], "additionalProperties": False},
             "items": {"type": "array",
                       "items": {"type": "object",
                                 "properties": {"sku": {"type": "string"},
                                                "price": {"type": "number"},
                                                "qty": {"type": "integer"}},
                                 "required": ["sku", "price", "qty"],
                                 "additionalProperties": False}},
             "note": {"type": ["string", "null"]}},
         "required": ["id", "status", "owner", "items", "note"],
         "additionalProperties": False},
        '{"id": 1042, "status": "active", "owner": {"name": "Bob Stone", "email": '
        '"bob@example.com"}, "items": [{"sku": "A-100", "price": 12.5, "qty": 2}, '
        '{"sku": "B-220", "price": 3.25, "qty": 10}], "note": null}',
    ),
}


class Library:
    """One library behind four calls: setup, compile, a fresh matcher, and a step."""

    name = ""

    def setup(self, tokenizer: Any, vocab_size: int) -> None:
        raise NotImplementedError

    def compile(self, schema: dict[str, Any]) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def step(self, matcher: Any, bitmask: Any, token: int) -> None:
        """Fill the allowed-token bitmask for the current state, then advance by `token`."""
        raise NotImplementedError

    def accepts_end(self, matcher: Any) -> bool:
        raise NotImplementedError


class XGrammar(Library):
    name = "xgrammar"

    def setup(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def step(self, matcher: Any, bitmask: Any, token: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)
        if not matcher.accept_token(token):
            raise AssertionError(f"xgrammar rejected token {token}")

    def accepts_end(self, matcher: Any) -> bool:
        return matcher.is_completed()


class LLGuidance(Library):
    name = "llguidance"

    def setup(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ",
                              "key_separator": ": "})
        # llguidance compiles lazily: the first matcher builds the lexer; time that here.
        error = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(error)
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return self.llg.LLMatcher(self.tokenizer, compiled)

    def step(self, matcher: Any, bitmask: Any, token: int) -> None:
        self.llg.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        if not matcher.consume_token(token):
            raise AssertionError(f"llguidance rejected token {token}: {matcher.get_error()}")

    def accepts_end(self, matcher: Any) -> bool:
        return matcher.is_accepting()


class OutlinesCore(Library):
    name = "outlines-core"

    def setup(self, tokenizer: Any, vocab_size: int) -> None:
        import outlines_core

        self.oc = outlines_core
        self.vocabulary = outlines_vocabulary(outlines_core, tokenizer)

    def compile(self, schema: dict[str, Any]) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def step(self, matcher: Any, bitmask: Any, token: int) -> None:
        matcher.write_mask_into(bitmask.data_ptr(), bitmask.numel(), bitmask.element_size())
        matcher.advance(token_id=token, return_tokens=False)

    def accepts_end(self, matcher: Any) -> bool:
        return matcher.is_finished()


def outlines_vocabulary(outlines_core: Any, tokenizer: Any) -> Any:
    """outlines-core wants {token bytes: ids} without EOS; undo GPT-2's byte-to-unicode map."""
    decoder = {c: b for b, c in _bytes_to_unicode().items()}
    eos = tokenizer.eos_token_id
    special = set(tokenizer.all_special_ids)
    vocab: dict[bytes, list[int]] = {}
    for piece, token_id in tokenizer.get_vocab().items():
        if token_id == eos or token_id in special:
            continue
        if all(ch in decoder for ch in piece):
            raw = bytes(decoder[ch] for ch in piece)
        else:
            raw = piece.encode()
        vocab.setdefault(raw, []).append(token_id)
    return outlines_core.Vocabulary(eos, vocab)


def _bytes_to_unicode() -> dict[int, str]:
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


LIBRARIES: dict[str, Callable[[], Library]] = {
    "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines-core": OutlinesCore}


def measure(library: Library, tokenizer: Any, vocab_size: int, repeats: int) -> dict[str, Any]:
    import torch

    start = time.perf_counter()
    library.setup(tokenizer, vocab_size)
    result: dict[str, Any] = {"setup_s": time.perf_counter() - start, "schemas": {}}
    bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    for name, (schema, document) in SCHEMAS.items():
        tokens = tokenizer.encode(document, add_special_tokens=False)
        start = time.perf_counter()
        compiled = library.compile(schema)
        compile_s = time.perf_counter() - start
        per_token: list[float] = []
        walks: list[float] = []
        first_matcher_s = []
        for _ in range(repeats):
            start = time.perf_counter()
            matcher = library.matcher(compiled)
            first_matcher_s.append(time.perf_counter() - start)
            for token in tokens:
                start = time.perf_counter()
                library.step(matcher, bitmask, token)
                per_token.append(time.perf_counter() - start)
            walks.append(sum(per_token[-len(tokens):]))
            if not library.accepts_end(matcher):
                raise AssertionError(f"{library.name}: {name} document not complete at its end")
        ordered = sorted(per_token)
        result["schemas"][name] = {
            "document_tokens": len(tokens),
            "compile_s": compile_s,
            "new_matcher_us": statistics.median(first_matcher_s) * 1e6,
            # the quietest walk: robust to other work on a shared machine
            "per_token_best_walk_us": min(walks) / len(tokens) * 1e6,
            "per_token_mean_us": statistics.fmean(per_token) * 1e6,
            "per_token_p50_us": ordered[len(ordered) // 2] * 1e6,
            "per_token_p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
            "per_token_max_us": ordered[-1] * 1e6,
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=20,
                        help="Times each document is walked (default 20).")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    import torch

    from tokenmill.engine.bench import report
    from tokenmill.engine.models.loader import load_config, load_tokenizer
    from tokenmill.engine.models.source import resolve_model

    torch.set_num_threads(1)
    source = resolve_model(args.model)
    tokenizer = load_tokenizer(source)
    vocab_size = load_config(source).vocab_size
    results: dict[str, Any] = {}
    for name, factory in LIBRARIES.items():
        try:
            results[name] = measure(factory(), tokenizer, vocab_size, args.repeats)
        except ImportError as exc:
            print(f"{name}: skipped ({exc})", file=sys.stderr)
            continue
        print(_format(name, results[name]))
    if args.json:
        payload = {"benchmark": "grammar-libs", "command": report.command_line(),
                   "machine": report.machine_info("cpu"), "git": report.git_revision(),
                   "model": args.model, "vocab_size": vocab_size,
                   "versions": _versions(), "results": results,
                   "schemas": {k: {"schema": s, "document": d} for k, (s, d) in SCHEMAS.items()}}
        report.write_json(args.json, payload)
        print(f"raw results: {args.json}")
    return 0


def _format(name: str, result: dict[str, Any]) -> str:
    lines = [f"{name}: tokenizer setup {result['setup_s'] * 1e3:.0f} ms"]
    for schema, r in result["schemas"].items():
        lines.append(
            f"  {schema:7s} compile {r['compile_s'] * 1e3:6.1f} ms, new matcher "
            f"{r['new_matcher_us']:6.1f} us; per token: best walk "
            f"{r['per_token_best_walk_us']:5.1f} us, mean {r['per_token_mean_us']:5.1f} us, "
            f"p50 {r['per_token_p50_us']:5.1f} us, p99 {r['per_token_p99_us']:5.1f} us "
            f"({r['document_tokens']} tokens)")
    return "\n".join(lines)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("xgrammar", "llguidance", "outlines_core", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    return found


if __name__ == "__main__":
    sys.exit(main())
