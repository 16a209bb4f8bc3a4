"""Grammars refused at compile time for their cost (regex counts that unroll past the limit, llguidance's
resource limits) or for an empty language llguidance itself accepts (a schema recursing without end), and
the matcher reporting a spent per-step fuel apart from a bad token."""

from __future__ import annotations

import json
import time
from typing import Any

import llguidance
import numpy as np
import pytest

from service.constraints.compiler import (
    COMPILE_BUDGET_S,
    MAX_REPETITION,
    CompiledGrammar,
    GrammarError,
    GrammarSpec,
    GrammarTooComplex,
    compile_grammar,
)
from service.constraints.matcher import GrammarMatcher
from service.constraints.schema_check import lark_repetition, max_repetition, unproductive_ref
from service.constraints.tokenizer import harmony_tokenizer
from service.vocab import load_harmony


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return harmony_tokenizer(load_harmony())


def _obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


@pytest.mark.parametrize(
    ("regex", "size"),
    [
        ("^a{40000}$", 40000),
        ("(a{200}){200}", 40000),
        ("a{4000}a{4000}", 8000),
        ("^[0-9]{3}-[0-9]{4}$", 8),
        ("(ab|cd){3}x", 13),
        (r"\d{2}[a-z]+", 3),
        (r"\p{L}{5}", 5),
        ("[]a{]{3}", 3),
        ("a{2,}", 2),
    ],
)
def test_max_repetition_unrolls_counts(regex: str, size: int) -> None:
    assert max_repetition(regex) == size


def test_lark_repetition_adds_regex_terminals_and_tilde_counts() -> None:
    assert lark_repetition('start: /a{50}/ "x"~3 | B\nB: /b{2}/ "c"~1..7') == 50 + 3 + 2 + 7


@pytest.mark.parametrize("n", [40_000, 100_000, 1_000_000])
def test_huge_pattern_counts_are_refused_before_llguidance_builds_them(
    n: int, tokenizer: llguidance.LLTokenizer
) -> None:
    spec = GrammarSpec.json_schema(_obj(s={"type": "string", "pattern": f"^a{{{n}}}$"}), strict=True)
    started = time.perf_counter()
    with pytest.raises(GrammarTooComplex, match=f"{n} repetitions"):
        compile_grammar(spec, tokenizer, budget_s=COMPILE_BUDGET_S)
    assert time.perf_counter() - started < 1.0  # was 1 s (40k), 14 s (100k), 41 s (1M)


def test_counts_at_the_limit_compile(tokenizer: llguidance.LLTokenizer) -> None:
    spec = GrammarSpec.json_schema(_obj(s={"type": "string", "pattern": f"^a{{{MAX_REPETITION}}}$"}), strict=True)
    compile_grammar(spec, tokenizer, budget_s=COMPILE_BUDGET_S)
    for kind, source in [("regex", f"a{{{MAX_REPETITION + 1}}}"), ("lark", f"start: /a{{{MAX_REPETITION + 1}}}/")]:
        with pytest.raises(GrammarTooComplex):
            compile_grammar(GrammarSpec(kind, source), tokenizer)  # type: ignore[arg-type]


RECURSIVE: list[dict[str, Any]] = [
    _obj(n={"$ref": "#"}),
    {**_obj(n={"$ref": "#/$defs/a"}), "$defs": {"a": _obj(m={"$ref": "#/$defs/a"})}},
    {
        **_obj(n={"$ref": "#/$defs/a"}),
        "$defs": {
            "a": {"type": "array", "items": {"$ref": "#/$defs/b"}, "minItems": 1},
            "b": {"anyOf": [{"$ref": "#/$defs/a"}]},
        },
    },
    {**_obj(n={"$ref": "#/$defs/a"}), "$defs": {"a": {"allOf": [{"$ref": "#"}]}}},
]


@pytest.mark.parametrize("schema", RECURSIVE)
def test_a_schema_recursing_without_end_is_an_empty_language(
    schema: dict[str, Any], tokenizer: llguidance.LLTokenizer
) -> None:
    assert unproductive_ref(schema) is not None
    for strict in (True, False) if "allOf" not in json.dumps(schema) else (False,):
        with pytest.raises(GrammarError, match="language is empty: it recurses without end"):
            compile_grammar(GrammarSpec.json_schema(schema, strict=strict), tokenizer)


@pytest.mark.parametrize(
    "schema",
    [
        _obj(n={"anyOf": [{"$ref": "#"}, {"type": "null"}]}),
        {**_obj(n={"type": "array", "items": {"$ref": "#"}}), "$defs": {}},  # [] ends it
        {**_obj(n={"$ref": "#/$defs/t"}), "$defs": {"t": _obj(kids={"type": "array", "items": {"$ref": "#/$defs/t"}})}},
        {"type": "object", "properties": {"n": {"$ref": "#"}}},  # not required
        _obj(n={"$ref": "#/nowhere"}),  # unresolvable: llguidance's to judge
    ],
)
def test_recursive_schemas_with_a_way_out_are_productive(schema: dict[str, Any]) -> None:
    assert unproductive_ref(schema) is None


def test_matcher_tells_spent_fuel_from_a_bad_token(tokenizer: llguidance.LLTokenizer) -> None:
    # `"a"~40000` builds (llguidance checks no item count up front) but its first consumed token needs more
    # Earley items than a step may create.
    grammar = CompiledGrammar("k", llguidance.LLMatcher.grammar_from_lark('start: "a"~40000'))
    spent = GrammarMatcher(tokenizer, grammar, (tokenizer.eos_token,))
    allowed = np.flatnonzero(np.unpackbits(spent.bitmask().view(np.uint8), bitorder="little"))
    assert not spent.accept(int(allowed[0]))  # the one token its mask allows
    assert spent.exhausted is not None and "too many items" in spent.exhausted.lower()
    fine = GrammarMatcher(tokenizer, CompiledGrammar("k2", llguidance.LLMatcher.grammar_from_regex("ab")), (0,))
    fine.bitmask()
    assert not fine.accept(tokenizer.tokenize_str("z")[0]) and fine.error is not None and fine.exhausted is None
