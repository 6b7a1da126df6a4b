"""Constraints compiled to grammars (xgrammar), cached by constraint, and one matcher per sequence.

xgrammar was picked over llguidance and outlines-core by measured per-token cost on SmolLM2's
49k-token vocabulary (`python -m tokenmill.engine.bench.grammar_libs`, docs/benchmarks.md):
filling a sequence's token mask and advancing takes it 2.6 us a token (p99 7 to 9 us), against
13 to 19 us for llguidance (p99 65 to 83 us, plus 0.4 to 0.7 ms per new matcher) and 12 to
13 us for outlines-core (p99 62 to 73 us, and 34 to 98 ms to compile a schema against
xgrammar's 5 to 9 ms, paid once per distinct schema). It also compiles regexes and EBNF
grammars, so every constraint kind runs on one library.

xgrammar is imported on the first constrained request only: an engine that never sees one runs
without the package.
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections import OrderedDict
from typing import Any

import torch

from tokenmill.engine.core.structured import bitmask
from tokenmill.engine.core.structured.params import StructuredOutputsParams

CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped first)
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarError(ValueError):
    """A constraint that does not compile (bad regex, grammar or schema); the message says why."""


class Matcher:
    """One sequence's position in its grammar. Unconstrained once the grammar has ended (only
    reachable with ignore_eos: past its stop token a request generates freely)."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: Any):
        self._matcher = matcher

    @property
    def active(self) -> bool:
        return not self._matcher.is_terminated()

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into bitmask[row] (int32 words, bit i = token i)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; False if the grammar forbids it."""
        return not self.active or self._matcher.accept_token(token)

    @property
    def is_complete(self) -> bool:
        """The output so far is a whole match: the grammar may end here."""
        return self._matcher.is_completed()


class StructuredOutputs:
    """The engine's grammar compiler: built on first use, thread-safe, caching by constraint."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: set[int]):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler: Any = None
        self._xgr: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of a constraint (cached); raises GrammarError."""
        with self._lock:
            compiled = self._cache.get(params.key)
            if compiled is not None:
                self._cache.move_to_end(params.key)
                return compiled
        compiled = self._compile(params)
        with self._lock:
            self._cache[params.key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def first_mask(self, params: StructuredOutputsParams) -> torch.Tensor:
        """The host bitmask row of the tokens the constraint allows first."""
        return bitmask.fill([(0, self.matcher(params))], 1, self.vocab_size,
                            torch.device("cpu"))[0]

    def matcher(self, params: StructuredOutputsParams) -> Matcher:
        compiled = self.compile(params)  # loads xgrammar if this is the first constraint
        return Matcher(self._xgr.GrammarMatcher(compiled))

    def _compile(self, params: StructuredOutputsParams) -> Any:
        compiler = self._get_compiler()
        kind, text = params.key
        try:
            if kind == "json":
                # Fixed separators (", " and ": "), no free whitespace: a sampled run of
                # newlines can't eat the token budget.
                return compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                    strict_mode=False)
            if kind == "regex":
                return compiler.compile_regex(text)
            if kind == "choice":
                # Characters as themselves: an escaped emoji is two surrogate halves to xgrammar,
                # whose bytes no token spells.
                alternatives = " | ".join(json.dumps(c, ensure_ascii=False)
                                          for c in json.loads(text))
                return compiler.compile_grammar(f"root ::= {alternatives}")
            if kind == "structural_tag":
                return _compile_structural_tag(self._xgr, compiler, json.loads(text))
            return compiler.compile_grammar(text)
        except Exception as exc:  # the constraint is the caller's: whatever fails is theirs
            raise GrammarError(f"the {_NAMES[kind]} does not compile: {_clean(exc)}") from None

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                try:
                    import xgrammar
                except ImportError:
                    raise GrammarError("structured outputs need the xgrammar package, which "
                                       "is not installed (pip install xgrammar)") from None
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self._stop_token_ids or None)
                # Its own cache off: it keeps every grammar ever compiled, without bound, where
                # the CACHE_SIZE above already keeps the recent ones.
                self._compiler = xgrammar.GrammarCompiler(
                    info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)
                self._xgr = xgrammar
            return self._compiler


_NAMES = {"json": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
          "choice": "choice", "grammar": "grammar", "structural_tag": "structural tag"}


def _compile_structural_tag(xgr: Any, compiler: Any, tag: dict[str, Any]) -> Any:
    """vLLM's form (structures and triggers) through xgrammar's tag items, as vLLM compiles
    it; xgrammar's own form (a format) as it is."""
    if "structures" not in tag:
        return compiler.compile_structural_tag(tag)
    items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", True)),
                                   end=s["end"]) for s in tag["structures"]]
    with warnings.catch_warnings():  # xgrammar calls this form deprecated; vLLM sends it
        warnings.simplefilter("ignore", DeprecationWarning)
        return compiler.compile_structural_tag(items, tag["triggers"])


def _clean(exc: BaseException) -> str:
    """xgrammar's message without its C++ source location."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return _XGRAMMAR_PREFIX.sub("", text).strip()
