"""service/constraints: strict subset, compilation and its cache, empty languages, matchers, and
the Harmony constraint driven by a DecodingPlan (tool_choice, grammars, reasoning budget)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import llguidance
import numpy as np
import pytest

from service.constraints import compiler
from service.constraints.compiler import GrammarError, GrammarSpec, compile_grammar
from service.constraints.lark_check import unproductive_start
from service.constraints.matcher import GrammarMatcher
from service.constraints.plan import check_plan, constraint_spec, plan_from_spec
from service.constraints.strict_schema import StrictSchemaError, check_strict_schema
from service.constraints.tokenizer import HARMONY_VOCAB_SIZE, harmony_tokenizer
from service.engine.base import TokenBitmask
from service.engine.sampling import bitmask_to_bool
from service.errors import InvalidRequest
from service.prompting.harmony import HarmonyFormat
from service.prompting.harmony_constraint import HarmonyHeaderConstraint, HarmonyVocab, _special_ids
from service.vocab import load_harmony

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
        "home": {"$ref": "#/$defs/place"},
    },
    "required": ["name", "age", "tags", "home"],
    "additionalProperties": False,
    "$defs": {
        "place": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{3}$"}, "kind": {"const": "home"}},
            "required": ["zip", "kind"],
            "additionalProperties": False,
        }
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return harmony_tokenizer(load_harmony())


def _allowed(mask: Any) -> np.ndarray:
    if isinstance(mask, TokenBitmask):
        return np.flatnonzero(bitmask_to_bool(mask, HARMONY_VOCAB_SIZE))
    return np.asarray(mask)


def _walk(constraint: Any, rng: np.random.Generator, limit: int = 400) -> list[int]:
    """Feed `constraint` random allowed tokens until it allows only stop tokens (or the limit)."""
    stops = {200002, 200012}
    tokens: list[int] = []
    for _ in range(limit):
        allowed = _allowed(constraint.allowed_token_ids())
        token = int(rng.choice(allowed))
        constraint.accept(token)
        tokens.append(token)
        if token in stops:
            break
    return tokens


def test_tokenizer_matches_the_model_vocabulary(tokenizer: llguidance.LLTokenizer) -> None:
    encoding = load_harmony()
    assert tokenizer.vocab_size == HARMONY_VOCAB_SIZE
    assert tokenizer.eos_token == encoding.encode("<|return|>", allowed_special="all")[0]
    text = 'hello {"a": 1} wörld'
    assert tokenizer.tokenize_str(text) == encoding.encode(text)


def test_special_ids_read_in_one_encode_are_each_specials_own() -> None:
    encoding = load_harmony()
    names = sorted(encoding.special_tokens_set)
    one_by_one = [tid for name in names for tid in encoding.encode(name, allowed_special="all")]
    assert len(one_by_one) == len(names)  # each special token's text is one token
    assert _special_ids(encoding) == one_by_one
    vocab = HarmonyVocab(encoding)
    assert vocab.first_special == min(one_by_one) == 199_998  # o200k's ordinary ranks are 0..199,997
    assert encoding.decode([vocab.first_special - 1]) and not encoding.is_special_token(vocab.first_special - 1)


def test_strict_subset_accepts_the_documented_keywords() -> None:
    check_strict_schema(SCHEMA)
    check_strict_schema(
        {**SCHEMA, "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["v"]}
    )


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        (
            {**SCHEMA, "properties": {"a": {"type": "string", "minLength": 2}}, "required": ["a"]},
            "minLength",
            "#/properties/a",
        ),
        ({"type": "object", "properties": {}, "required": []}, "additionalProperties", "#"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": [], "additionalProperties": False},
            "required",
            "#",
        ),
        ({"anyOf": [{"type": "object"}]}, "type", "#"),
        ({**SCHEMA, "properties": {"a": {"$ref": "#/$defs/nope"}}, "required": ["a"]}, "$ref", "#/properties/a"),
        (
            {
                **SCHEMA,
                "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                "required": ["a"],
            },
            "uniqueItems",
            "#/properties/a",
        ),
        (
            {**SCHEMA, "properties": {"a": {"type": "string", "format": "phone"}}, "required": ["a"]},
            "format",
            "#/properties/a",
        ),
        (
            {**SCHEMA, "properties": {"a": {"allOf": [{"type": "string"}]}}, "required": ["a"]},
            "allOf",
            "#/properties/a",
        ),
    ],
)
def test_strict_subset_names_the_keyword_and_path(schema: dict[str, Any], keyword: str, path: str) -> None:
    with pytest.raises(StrictSchemaError) as info:
        check_strict_schema(schema)
    assert (info.value.keyword, info.value.path) == (keyword, path)
    assert keyword in str(info.value) and path in str(info.value)


def test_strict_subset_limits_nesting() -> None:
    leaf: dict[str, Any] = {"type": "string"}
    for _ in range(12):
        leaf = {"type": "object", "properties": {"n": leaf}, "required": ["n"], "additionalProperties": False}
    with pytest.raises(StrictSchemaError, match="nest"):
        check_strict_schema(leaf)


def test_compile_is_cached_by_content_and_bounded(tokenizer: llguidance.LLTokenizer, monkeypatch: Any) -> None:
    first = compile_grammar(GrammarSpec.json_schema(SCHEMA, strict=True), tokenizer)
    again = compile_grammar(GrammarSpec.json_schema(json.loads(json.dumps(SCHEMA)), strict=True), tokenizer)
    assert again is first  # the same content (any key order) hits the cache
    monkeypatch.setattr(compiler, "CACHE_SIZE", 3)
    for n in range(5):
        compile_grammar(GrammarSpec("regex", f"a{{{n + 1}}}"), tokenizer)
    assert compiler.cache_info() <= 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec("lark", 'start: "a" (\n'), r"line 1, column \d+"),
        (GrammarSpec("regex", "ab[c"), r"line 1, column 3: unclosed character class"),
        (GrammarSpec("lark", 'start: "a" start'), "language is empty"),
        (GrammarSpec("lark", 'start: x\nx: "(" x ")"'), "language is empty"),
        (GrammarSpec.json_schema({"type": "integer", "minimum": 5, "maximum": 2}, strict=False), "language is empty"),
        (GrammarSpec.json_schema({"enum": []}, strict=False), "language is empty"),
        (GrammarSpec("regex", "x" * 100), "at most 64 bytes"),
    ],
)
def test_bad_grammars_are_refused(tokenizer: llguidance.LLTokenizer, spec: GrammarSpec, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        compile_grammar(spec, tokenizer, max_bytes=64)


def test_lark_productivity() -> None:
    assert unproductive_start('start: "a" start | "b"') is None
    assert unproductive_start('start: x\nx: "(" x? ")"') is None
    assert unproductive_start('start: a+\na: b\nb: "x" b') == "start"
    assert unproductive_start("start: NUMBER\n%import common.NUMBER") is None


def test_matcher_ends_with_the_terminator_once_the_value_is_closed(tokenizer: llguidance.LLTokenizer) -> None:
    encoding = load_harmony()
    call = encoding.encode("<|call|>", allowed_special="all")[0]
    grammar = compile_grammar(GrammarSpec.json_schema({"type": "integer", "maximum": 50}, strict=False), tokenizer)
    matcher = GrammarMatcher(tokenizer, grammar, (call,))
    assert all(matcher.accept(t) for t in encoding.encode("42"))
    assert _allowed(TokenBitmask(matcher.bitmask())).tolist() == [call]  # 42 is closed: only <|call|>
    assert not matcher.accept(encoding.encode("7")[0]) and matcher.error  # a bad token: error, reported
    assert _allowed(TokenBitmask(matcher.bitmask())).tolist() == [call]  # and the body can still end


def _plan(tools: list[dict[str, Any]], **spec: Any) -> Any:
    base = {"tool_choice": "auto", "text_format": None, "max_tool_calls": None, "reasoning_budget": 5}
    return plan_from_spec(tools, constraint_spec(**{**base, **spec}))


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["paris", "rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    {
        "type": "custom",
        "name": "calc",
        "format": {"type": "grammar", "syntax": "regex", "definition": r"add\([0-9]{1,2}\)"},
    },
]


def _outcome(plan: Any, seed: int) -> tuple[str, str]:
    """(header text of the last message, its body) after a random walk through the constraint."""
    fmt = HarmonyFormat()
    constraint = fmt.constraint_for(fmt_request(), plan)
    tokens = _walk(constraint, np.random.default_rng(seed))
    text = fmt.encoding.decode(tokens)
    last = text.rsplit("<|start|>assistant", 1)[-1]
    header, _, body = last.partition("<|message|>")
    return header, re.sub(r"<\|(return|call)\|>$", "", body)


def fmt_request() -> Any:
    from service.prompting.base import PromptRequest

    return PromptRequest(items=[], tools=tuple(TOOLS))


@pytest.mark.parametrize("seed", range(4))
def test_structured_answer_validates(seed: int) -> None:
    plan = _plan([], text_format={"type": "json_schema", "name": "p", "schema": SCHEMA, "strict": True})
    header, body = _outcome(plan, seed)
    assert header == "<|channel|>final"
    jsonschema.validate(json.loads(body), SCHEMA)


@pytest.mark.parametrize("seed", range(4))
def test_forced_calls_follow_their_grammar(seed: int) -> None:
    header, body = _outcome(_plan(TOOLS, tool_choice="required"), seed)
    assert header in (
        "<|channel|>commentary to=functions.get <|constrain|>json",
        "<|channel|>commentary to=functions.calc",
    )
    if header.endswith("json"):
        jsonschema.validate(json.loads(body), TOOLS[0]["parameters"])
    else:
        assert re.fullmatch(r"add\([0-9]{1,2}\)", body)
    header, _ = _outcome(_plan(TOOLS, tool_choice={"type": "custom", "name": "calc"}), seed)
    assert header == "<|channel|>commentary to=functions.calc"
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get"}]}
    header, _ = _outcome(_plan(TOOLS, tool_choice=allowed), seed)
    assert header == "<|channel|>commentary to=functions.get <|constrain|>json"


def test_reasoning_budget_closes_analysis_and_opens_the_answer() -> None:
    fmt = HarmonyFormat()
    constraint = fmt.constraint_for(fmt_request(), _plan([], reasoning_budget=3))
    enc = fmt.encoding
    for token in enc.encode("<|channel|>analysis<|message|>one two three", allowed_special="all"):
        constraint.accept(token)
    assert _allowed(constraint.allowed_token_ids()).tolist() == enc.encode("<|end|>", allowed_special="all")
    for token in enc.encode("<|end|><|start|>assistant<|channel|>", allowed_special="all"):
        constraint.accept(token)
    # Only the final channel is left (no analysis, no preamble, no tools in this plan).
    assert _allowed(constraint.allowed_token_ids()).tolist() == enc.encode("final")[:1]


def test_replay_rebuilds_the_same_masks() -> None:
    """The constraint is a pure function of the tokens: a fresh one fed the logged tokens (as a
    resumed run does) allows exactly what the live one allowed at every position."""
    plan = _plan(TOOLS, tool_choice="required")
    fmt = HarmonyFormat()
    live = fmt.constraint_for(fmt_request(), plan)
    rng = np.random.default_rng(9)
    tokens, masks = [], []
    for _ in range(200):
        allowed = _allowed(live.allowed_token_ids())
        masks.append(allowed)
        tokens.append(int(rng.choice(allowed)))
        live.accept(tokens[-1])
        if tokens[-1] == 200012:
            break
    replayed = fmt.constraint_for(fmt_request(), plan)
    for token, mask in zip(tokens, masks, strict=True):
        assert np.array_equal(_allowed(replayed.allowed_token_ids()), mask)
        replayed.accept(token)


def test_check_plan_maps_errors_to_params(tokenizer: llguidance.LLTokenizer) -> None:
    bad_tool = {**TOOLS[1], "format": {"type": "grammar", "syntax": "lark", "definition": "start: (("}}
    with pytest.raises(InvalidRequest) as info:
        check_plan(_plan([TOOLS[0], bad_tool]), tokenizer)
    assert info.value.param == "tools[1].format.definition"
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    with pytest.raises(InvalidRequest) as info:
        check_plan(
            _plan([], text_format={"type": "json_schema", "name": "x", "schema": schema, "strict": True}), tokenizer
        )
    assert info.value.param == "text.format.schema" and "additionalProperties" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        check_plan(_plan([{**TOOLS[0], "parameters": {"type": "object"}}]), tokenizer)
    assert info.value.param == "tools[0].parameters"


def test_constraint_without_plan_keeps_the_old_contract() -> None:
    fmt = HarmonyFormat()
    constraint = fmt.constraint_for(fmt_request())
    assert isinstance(constraint, HarmonyHeaderConstraint)
    assert constraint.allowed_token_ids() is not None


def test_non_strict_parameters_that_do_not_compile_fall_back_to_any_object(tokenizer: llguidance.LLTokenizer) -> None:
    """Non-strict means best effort: a function whose schema llguidance cannot compile (an unresolvable
    $ref) still gets JSON-object arguments instead of a 400; strict ones are refused."""
    loose = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}}
    plan = _plan([loose], tool_choice="required")
    check_plan(plan, tokenizer)
    fmt = HarmonyFormat()
    constraint = fmt.constraint_for(fmt_request(), plan)
    tokens = _walk(constraint, np.random.default_rng(1))
    body = fmt.encoding.decode(tokens).rsplit("<|message|>", 1)[-1].removesuffix("<|call|>")
    assert tokens[-1] == 200012 and isinstance(json.loads(body), dict)
    with pytest.raises(InvalidRequest) as info:
        check_plan(_plan([{**loose, "strict": True}]), tokenizer)
    assert info.value.param == "tools[0].parameters"


def test_hostile_nesting_is_a_grammar_error_not_a_crash(tokenizer: llguidance.LLTokenizer) -> None:
    leaf: dict[str, Any] = {"type": "string"}
    for _ in range(3000):
        leaf = {"type": "object", "properties": {"a": leaf}}
    with pytest.raises(GrammarError, match="nested too deeply"):
        compile_grammar(GrammarSpec.json_schema(leaf, strict=False), tokenizer, max_bytes=1 << 30)
    assert unproductive_start("start: " + "(" * 5000 + '"a"' + ")" * 5000) is None  # too deep to judge: no verdict
