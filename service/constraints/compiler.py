"""Schemas and grammars -> llguidance grammars: validated, size-limited, cached by content hash.

`compile_grammar` is the one entry point. It refuses (GrammarError, mapped to a 400 by the caller):
a source over the size limit, a syntax error (with line and column), a JSON schema outside the
strict subset when strict, and a grammar whose language is empty (nothing could ever complete
it), so a request never starts a run that cannot end. It also refuses (GrammarTooComplex) a grammar
whose masks would cost too much: a regex whose `{n}` counts unroll past MAX_REPETITION (see
schema_check), one that hits llguidance's deterministic limits (PARSER_LIMITS) while building or
computing its first mask, and, as a backstop, one whose build and first mask take longer than
COMPILE_BUDGET_S of wall time (generous: ordinary grammars take a few milliseconds).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
import numpy as np

from service.constraints.lark_check import unproductive_start
from service.constraints.number_bounds import bound_open_integers
from service.constraints.schema_check import lark_repetition, max_repetition, schema_patterns, unproductive_ref
from service.constraints.strict_schema import StrictSchemaError, check_strict_schema

GrammarKind = Literal["json_schema", "lark", "regex"]
DEFAULT_MAX_GRAMMAR_BYTES = 64 * 1024
CACHE_SIZE = 256
# One fixed layout, json.dumps' default (`{"a": 1, "b": 2}`), which is how models (ours included) write
# arguments: no whitespace loops, and the value ends as soon as it is closed.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_TOO_DEEP = ""  # the source of a schema nested too deeply to serialise
# Most a regex's counted repetitions may unroll to (`a{N}`: N; nested counts multiplied, sequences added):
# llguidance's mask cost grows with its square (a{2048}: ~5 ms a mask, a{40000}: ~1 s), outside its fuel limits.
MAX_REPETITION = 2048
# llguidance's deterministic resource limits (its defaults, pinned here so they cannot drift with upgrades),
# for every matcher: a mask step that needs more lexer fuel or Earley items puts the matcher in its error
# state, which fails the run (at create: a 400).
PARSER_LIMITS = llguidance.LLParserLimits(
    max_items_in_row=2000,
    initial_lexer_fuel=1_000_000,
    step_lexer_fuel=200_000,
    step_max_items=50_000,
    max_lexer_states=250_000,
    max_grammar_size=500_000,
)
# Wall-clock backstop for what the limits above do not bound: building the matcher and its first mask at
# create time (check_plan). Ordinary grammars take milliseconds; this is kept generous for loaded machines.
COMPILE_BUDGET_S = 2.0


class GrammarError(ValueError):
    """A schema or grammar that cannot be used; the message says why (and where)."""


class GrammarTooComplex(GrammarError):
    """A grammar whose masks would cost too much to compute (a 400 with code grammar_too_complex)."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    source: str  # the schema as JSON text, the Lark grammar, or the regex
    strict: bool = True  # json_schema: enforce OpenAI's strict subset
    # json_schema: the digits an integer the schema leaves open may have (number_bounds); None: no bound
    integer_digits: int | None = None

    @staticmethod
    def json_schema(schema: Any, *, strict: bool, integer_digits: int | None = None) -> GrammarSpec:
        try:
            source = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        except RecursionError:
            source = _TOO_DEEP  # refused by compile_grammar with a clear message
        return GrammarSpec("json_schema", source, strict, integer_digits)

    def key(self) -> str:
        bound = "" if self.integer_digits is None else f"\0{self.integer_digits}"
        digest = hashlib.sha256(f"{self.kind}\0{int(self.strict)}\0{self.source}{bound}".encode())
        return digest.hexdigest()


@dataclass(frozen=True)
class CompiledGrammar:
    key: str
    grammar: str  # llguidance's grammar JSON, ready for LLMatcher


_cache: OrderedDict[tuple[str, int], CompiledGrammar] = OrderedDict()
_lock = threading.Lock()


def compile_grammar(
    spec: GrammarSpec,
    tokenizer: llguidance.LLTokenizer,
    *,
    max_bytes: int = DEFAULT_MAX_GRAMMAR_BYTES,
    budget_s: float | None = None,
) -> CompiledGrammar:
    """Compile and check `spec` for `tokenizer`; results are cached (bounded LRU) by content hash. `budget_s`
    (create time only: a run's recompile after eviction must not fail on a busy machine) bounds the wall time
    of building the matcher and its first mask."""
    size = len(spec.source.encode())
    if size > max_bytes:
        raise GrammarError(f"The grammar is {size} bytes; this server accepts at most {max_bytes} bytes.")
    cache_key = (spec.key(), id(tokenizer))
    with _lock:
        hit = _cache.get(cache_key)
        if hit is not None:
            _cache.move_to_end(cache_key)
            return hit
    compiled = CompiledGrammar(spec.key(), _compile(spec, tokenizer, budget_s))
    with _lock:
        _cache[cache_key] = compiled
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def cache_info() -> int:
    with _lock:
        return len(_cache)


def _compile(spec: GrammarSpec, tokenizer: llguidance.LLTokenizer, budget_s: float | None) -> str:
    if spec.kind == "json_schema":
        if spec.source == _TOO_DEEP:
            raise GrammarError("The schema is nested too deeply.")
        try:
            schema = json.loads(spec.source)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"The schema is not valid JSON: {exc}.") from None
        patterns = schema_patterns(schema)
        _check_repetition(sum(max_repetition(pattern) for pattern in patterns), "patterns")
        if spec.strict:
            try:
                check_strict_schema(schema)
            except StrictSchemaError as exc:
                raise GrammarError(f"Invalid schema: {exc}.") from None
        if spec.integer_digits is not None:
            schema = bound_open_integers(schema, spec.integer_digits)  # after the strict check: the client's schema
        options = _JSON_OPTIONS if spec.strict else {**_JSON_OPTIONS, "lenient": True}
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"Invalid schema: {exc}.") from None
    elif spec.kind == "lark":
        _check_repetition(lark_repetition(spec.source), "grammar")
        grammar = llguidance.LLMatcher.grammar_from_lark(spec.source)
    else:
        _check_repetition(max_repetition(spec.source), "regex")
        grammar = llguidance.LLMatcher.grammar_from_regex(spec.source)
    started = time.perf_counter()
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=PARSER_LIMITS)
    if is_error:
        message = messages[0] if messages else "invalid grammar"
        raise _limit_error(message) or GrammarError(_describe(spec, message))
    if spec.kind == "lark":
        rule = unproductive_start(spec.source)
        if rule is not None:
            raise GrammarError(
                f"The grammar's language is empty: rule '{rule}' can never finish (every alternative recurses)."
            )
    if spec.kind == "json_schema":
        ref = unproductive_ref(json.loads(spec.source))
        if ref is not None:
            raise GrammarError(
                f"The schema's language is empty: it recurses without end through '$ref': '{ref}' "
                "(no finite value can match it)."
            )
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=PARSER_LIMITS)
    if matcher.is_error():
        raise _limit_error(matcher.get_error()) or GrammarError(_describe(spec, matcher.get_error()))
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)
    if matcher.is_error():  # a resource limit, or no first token at all
        raise _limit_error(matcher.get_error()) or GrammarError(
            "The grammar's language is empty: no output can ever match it."
        )
    elapsed = time.perf_counter() - started
    if budget_s is not None and elapsed > budget_s:
        raise GrammarTooComplex(
            f"The grammar is too complex: building it and its first token mask took {elapsed:.1f} s "
            f"(this server allows {budget_s:g} s)."
        )
    if not mask.any():
        raise GrammarError("The grammar's language is empty: no output can ever match it.")
    return grammar


def _check_repetition(count: int, where: str) -> None:
    if count > MAX_REPETITION:
        raise GrammarTooComplex(
            f"The grammar is too complex: its {where} spells out {count} repetitions ({{n}} counts unrolled); "
            f"this server allows at most {MAX_REPETITION} (the cost of every token's mask grows with their square)."
        )


_LIMIT_MARKERS = ("too many", "fuel", "limit", "too complex", "too large")


def is_limit_error(message: str) -> bool:
    """Whether an llguidance error is one of its resource limits (not a grammar or token error); only its first
    line counts (verbose errors append the parser's state)."""
    lines = message.strip().splitlines()
    lowered = lines[0].lower() if lines else ""
    return any(marker in lowered for marker in _LIMIT_MARKERS)


def _limit_error(message: str) -> GrammarTooComplex | None:
    if not is_limit_error(message):
        return None
    first = message.strip().splitlines()[0] if message.strip() else "resource limit"
    return GrammarTooComplex(f"The grammar is too complex: {first}.")


_POSITION = re.compile(r"(?:at )?(\d+)\((\d+)\):\s*")


def _describe(spec: GrammarSpec, message: str) -> str:
    """llguidance's message, with its `line(column):` prefix spelled out; Unsatisfiable schemas say so."""
    message = message.strip()
    if spec.kind == "json_schema":
        if message.startswith("Unsatisfiable schema"):
            return f"The schema's language is empty: {message.split(':', 1)[-1].strip()}."
        return f"Invalid schema: {message}."
    if spec.kind == "regex":
        # llguidance wraps the regex as `start: /.../`; regex-syntax draws a caret under the error.
        lines = message.splitlines()
        summary = next((line.removeprefix("error: ") for line in lines if line.startswith("error:")), lines[-1])
        for i, line in enumerate(lines[1:], start=1):
            if line.strip() == "^" and i >= 1:
                column = line.index("^") - 3
                return f"Invalid regex at line 1, column {max(column, 1)}: {summary}."
        return f"Invalid regex: {summary}."
    match = _POSITION.match(message)
    if match:
        detail = message[match.end() :].splitlines()[0]
        return f"Invalid Lark grammar at line {match.group(1)}, column {match.group(2)}: {detail}"
    return f"Invalid Lark grammar: {message.splitlines()[0]}"
