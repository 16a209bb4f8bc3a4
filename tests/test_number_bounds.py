"""The bound on integers a schema leaves open (service/constraints/number_bounds.py): at most 12 digits, or as
many as the request's longest number, never past a bound the schema states; through the real server, a scripted
model that writes 40-digit integers into a structured answer and into a tool call's arguments has them cut there,
and a run logged without the bound keeps none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import llguidance
import openai
import pytest

from service.constraints.compiler import GrammarSpec, compile_grammar
from service.constraints.number_bounds import (
    DEFAULT_INTEGER_DIGITS,
    MAX_BOUNDED_DIGITS,
    bound_open_integers,
    request_integer_digits,
)
from service.constraints.plan import constraint_spec, plan_from_spec
from service.constraints.tokenizer import harmony_tokenizer
from service.engine.scripted import Rule, write_scripted_model
from service.vocab import load_harmony
from tests.api_helpers import client_for
from tests.conftest import ServerProcess, app_on_backend

LIMIT_12 = 10**12 - 1


def test_an_open_integer_is_bounded_and_a_stated_bound_is_kept() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "open": {"type": "integer"},
            "low": {"type": "integer", "minimum": 0},
            "high": {"type": "integer", "exclusiveMaximum": 10},
            "choice": {"type": "integer", "enum": [1, 2]},
            "fixed": {"const": 3, "type": "integer"},
            "huge": {"type": "integer", "minimum": 1e20},
            "maybe": {"type": ["integer", "null"]},
            "real": {"type": "number"},
            "either": {"type": ["integer", "number"]},
            "list": {"type": "array", "items": {"type": "integer"}, "prefixItems": [{"type": "integer"}]},
            "union": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "ref": {"$ref": "#/$defs/count"},
        },
        "$defs": {"count": {"type": "integer"}},
    }
    before = json.dumps(schema, sort_keys=True)
    bounded = bound_open_integers(schema, 12)
    assert json.dumps(schema, sort_keys=True) == before  # a copy: the request's schema is untouched
    p = bounded["properties"]
    assert p["open"] == {"type": "integer", "minimum": -LIMIT_12, "maximum": LIMIT_12}
    assert p["low"] == {"type": "integer", "minimum": 0, "maximum": LIMIT_12}
    assert p["high"] == {"type": "integer", "exclusiveMaximum": 10, "minimum": -LIMIT_12}
    assert p["choice"] == schema["properties"]["choice"] and p["fixed"] == schema["properties"]["fixed"]
    assert p["huge"] == {"type": "integer", "minimum": 1e20}  # a maximum added would leave no integer
    assert p["maybe"] == {"type": ["integer", "null"], "minimum": -LIMIT_12, "maximum": LIMIT_12}
    assert p["real"] == {"type": "number"} and p["either"] == {"type": ["integer", "number"]}
    assert p["list"]["items"]["maximum"] == p["list"]["prefixItems"][0]["maximum"] == LIMIT_12
    assert p["union"]["anyOf"][0]["maximum"] == LIMIT_12 and p["union"]["anyOf"][1] == {"type": "string"}
    assert bounded["$defs"]["count"]["maximum"] == LIMIT_12 and p["ref"] == {"$ref": "#/$defs/count"}


def test_the_digits_follow_the_requests_longest_number() -> None:
    assert request_integer_digits(["no numbers here", ""]) == DEFAULT_INTEGER_DIGITS == 12
    assert request_integer_digits(["order 12345678901234 shipped", "{}"]) == 14
    assert request_integer_digits(["x" * 100, "9" * MAX_BOUNDED_DIGITS]) == MAX_BOUNDED_DIGITS
    assert request_integer_digits(["a 16-digit id: 1234567890123456"]) is None  # past what a bound can say


def _accepted(grammar: str, text: str) -> str:
    """The longest prefix of `text`'s tokens the grammar's matcher accepts."""
    encoding = load_harmony()
    matcher = llguidance.LLMatcher(harmony_tokenizer(encoding), grammar, log_level=0)
    ids = encoding.encode(text, allowed_special=set())
    taken = 0
    for token in ids:
        if not matcher.consume_token(token):
            break
        taken += 1
    return encoding.decode(ids[:taken])


def test_the_compiled_grammar_ends_an_open_integer_at_its_digits() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    text = '{"n": -' + "9" * 30 + "}"
    tokenizer = harmony_tokenizer(load_harmony())
    unbounded = compile_grammar(GrammarSpec.json_schema(schema, strict=False), tokenizer)
    assert _accepted(unbounded.grammar, text) == text
    for digits in (12, 15):
        bounded = compile_grammar(GrammarSpec.json_schema(schema, strict=False, integer_digits=digits), tokenizer)
        assert _accepted(bounded.grammar, text) == '{"n": -' + "9" * digits
        assert bounded.key != unbounded.key
    # The bound is the constraint fact's: a fact logged before it (no "integer_digits") resumes unbounded.
    tools = [{"type": "function", "name": "f", "parameters": schema, "strict": False}]
    fact = constraint_spec(tool_choice="auto", text_format=None, max_tool_calls=None, reasoning_budget=8)
    assert fact["integer_digits"] is None
    old = {k: v for k, v in fact.items() if k != "integer_digits"}
    assert plan_from_spec(tools, old).calls[0].grammar.integer_digits is None  # type: ignore[union-attr]
    new = {**fact, "integer_digits": 12}
    assert plan_from_spec(tools, new).calls[0].grammar.integer_digits == 12  # type: ignore[union-attr]


# A model that writes 40-digit integers wherever a schema leaves them open.
FORTY = "1" * 40
ANSWER = Rule('<|channel|>final<|message|>{"n": ' + FORTY + "}<|return|>", ["Count"])
CALL = Rule(
    '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": ' + FORTY + ', "b": 2}<|call|>', ["Add"]
)
COUNT_FORMAT: Any = {
    "type": "json_schema",
    "name": "count",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
}
ADD: Any = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp(f"bounds-{request.param}")
    model = write_scripted_model(tmp / "model", [ANSWER, CALL])
    servers: Iterator[ServerProcess] = app_on_backend(request.param, tmp, SERVICE_MODEL=str(model))
    for server in servers:
        yield client_for(server.url)


def _count(client: openai.OpenAI, text: str) -> int:
    response = client.responses.create(model="scripted", input=text, text={"format": COUNT_FORMAT})
    assert response.status == "completed", response.incomplete_details
    value = json.loads(response.output_text)["n"]
    assert isinstance(value, int)
    return value


def test_a_structured_answer_ends_its_integer_at_twelve_digits(client: openai.OpenAI) -> None:
    assert _count(client, "Count the stars") == int("1" * 12)


def test_a_request_holding_a_longer_number_allows_that_many(client: openai.OpenAI) -> None:
    assert 12 <= len(str(_count(client, "Count past 12345678901234"))) <= 14
    assert _count(client, "Count past 12345678901234567890") == int(FORTY)  # past 15 digits: no bound


def test_a_tool_calls_integer_argument_ends_at_twelve_digits(client: openai.OpenAI) -> None:
    response = client.responses.create(model="scripted", input="Add them", tools=[ADD])
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "add" and calls[0].status == "completed"
    arguments = json.loads(calls[0].arguments)
    assert arguments["a"] == int("1" * 12) and isinstance(arguments["b"], int)
    assert len(str(abs(arguments["b"]))) <= 12
