"""Compiling constraints with llguidance: the tokenizer side built once per model, grammars compiled off the step loop
with a time bound, and cached by their spec.

llguidance reads the exported tokenizer.json itself (the tokenizers library's serialization, no transformers), and a
compiled grammar is an `LLMatcher` at its start state: each request takes a deep copy of it, which costs microseconds,
so n samples of one schema or many requests with the same tool compile it once.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from ovbuild.errors import ExportError, GrammarError, MissingDependencyError
from ovbuild.runtime.structured.spec import Constraint
from ovbuild.runtime.structured.state import OutputConstraint

# JSON is generated compact, with at most one space where JSON allows whitespace: a model that may put any run of
# whitespace there (llguidance's default) can loop on newlines until max_tokens on a small or confused model.
JSON_OPTIONS = {"whitespace_flexible": False, "whitespace_pattern": "[ ]?"}
COMPILE_TIMEOUT_S = 10.0  # a schema that takes longer is refused (400), the engine never waits on it
CACHE_SIZE = 256  # compiled grammars kept per model
_ERROR_CHARS = 600  # llguidance's messages carry the grammar around the error: the head says what is wrong


def llguidance():
    """The llguidance module, or a MissingDependencyError naming the extra."""
    try:
        import llguidance as llg
    except ImportError as e:
        raise MissingDependencyError(
            "structured output needs llguidance: pip install 'ovbuild[structured]' (ovbuild[serve] pulls it)"
        ) from e
    return llg


class Grammars:
    """One model's grammar compiler: its llguidance tokenizer (made on first use) and a cache of compiled grammars."""

    def __init__(self, tokenizer_json: Path, eos_token_ids: tuple[int, ...], vocab_size: int):
        self.path, self.eos_token_ids, self.vocab_size = Path(tokenizer_json), tuple(eos_token_ids), vocab_size
        self._tokenizer = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[Constraint, object] = OrderedDict()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def tokenizer(self):
        """llguidance's LLTokenizer of the model (built once: ~1 s on a 150k vocabulary)."""
        with self._lock:
            if self._tokenizer is None:
                llg = llguidance()
                if not self.path.exists():
                    raise ExportError(f"{self.path}: tokenizer not found (structured output needs tokenizer.json)")
                eos = list(self.eos_token_ids) or None
                try:
                    self._tokenizer = llg.LLTokenizer(self.path.read_text(encoding="utf-8"), eos_token=eos)
                except Exception as e:  # llguidance raises ValueError/RuntimeError for a tokenizer it cannot read
                    raise ExportError(f"{self.path}: llguidance cannot read this tokenizer ({e})") from None
            return self._tokenizer

    def compile(self, constraint: Constraint):
        """The constraint's compiled grammar (an LLMatcher at its start, to deep-copy per request), from the cache
        when it was compiled before. Raises GrammarError saying what is wrong with it."""
        with self._lock:
            if constraint in self._cache:
                self._cache.move_to_end(constraint)
                return self._cache[constraint]
        llg, tokenizer = llguidance(), self.tokenizer
        grammar = grammar_text(constraint)
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise GrammarError(f"{_what(constraint)}: {_short(messages[0])}", constraint.param)
        matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{_what(constraint)}: {_short(matcher.get_error())}", constraint.param)
        with self._lock:
            self._cache[constraint] = matcher
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def compile_bounded(self, constraint: Constraint, timeout_s: float = COMPILE_TIMEOUT_S):
        """`compile` on the compiler's own thread, waiting at most timeout_s (a GrammarError past it; the compile
        finishes in the background and lands in the cache)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="ovbuild-grammar")
        future = self._executor.submit(self.compile, constraint)
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            raise GrammarError(
                f"{_what(constraint)}: compiling took more than {timeout_s:g} s; simplify it", constraint.param
            ) from None

    def matcher(self, constraint: Constraint):
        """A fresh matcher for one request (a copy of the compiled grammar)."""
        return self.compile(constraint).deep_copy()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as llguidance's tokenizer splits it (the reasoning marker's ids)."""
        return list(self.tokenizer.tokenize_str(text, parse_special=True))


def grammar_text(constraint: Constraint) -> str:
    """llguidance's grammar for a constraint (never raises: errors surface when it is validated)."""
    llg = llguidance()
    kind, source = constraint.kind, constraint.source
    if kind == "json_schema":
        return llg.LLMatcher.grammar_from_json_schema(source, overrides=JSON_OPTIONS)
    if kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', overrides=JSON_OPTIONS)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(source)
    if kind == "choice":
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(source)))
    return llg.LLMatcher.grammar_from_lark(source)


def _what(constraint: Constraint) -> str:
    return {
        "json_schema": "invalid or unsupported JSON schema",
        "json_object": "json_object",
        "regex": "invalid regex",
        "choice": "invalid choice",
        "grammar": "invalid grammar",
    }[constraint.kind]


def _short(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _ERROR_CHARS else message[:_ERROR_CHARS] + " ..."


def start_constraint(grammars: Grammars | None, constraint: Constraint | None, bias: tuple[tuple[int, float], ...]):
    """A request's OutputConstraint (None when it has neither constraint nor bias): a fresh matcher of its compiled
    grammar, its bias, and the reasoning gate's token ids."""
    if constraint is None and not bias:
        return None
    if grammars is None:
        raise GrammarError("structured output needs the model's tokenizer (a pipeline's scheduler has it)", "model")
    matcher = grammars.matcher(constraint) if constraint is not None else None
    gate = grammars.encode(constraint.after) if constraint is not None and constraint.after else ()
    return OutputConstraint(matcher, bias, grammars.vocab_size, gate, grammars.tokenizer.vocab_size)
