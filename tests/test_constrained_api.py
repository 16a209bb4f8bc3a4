"""Constrained decoding end to end: the real server, the built-in model (random weights: only a
constrained decoder produces valid output), the official client, SQLite and PostgreSQL.

Structured outputs (json_schema strict, json_object), forced and restricted tool calls with
schema-valid arguments, Lark and regex custom tools, custom tool results in the next turn,
kill -9 and resume of a constrained run, and every bad input as a 400 with its `param`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from service.engine.scripted import Rule, write_scripted_model
from tests.api_helpers import assert_well_formed_stream, client_for, raw_events, sql_rows, text_from_deltas
from tests.conftest import ServerProcess

ServerFactory = Callable[..., ServerProcess]
# A short reasoning budget: the random model's free text is cut after a few tokens.
BUDGET = {"SERVICE_REASONING_TOKENS_LOW": "6", "SERVICE_REASONING_TOKENS_MEDIUM": "6"}

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"enum": ["fr", "it"]}},
            "required": ["zip", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
PERSON_FORMAT: Any = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"enum": ["paris", "rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
ADD = r"add\([0-9]{1,3},[0-9]{1,3}\)"
CODE = r"[A-Z]{3}-[0-9]{2}"
TOOLS: list[Any] = [
    {"type": "function", "name": "weather", "strict": True, "parameters": WEATHER_PARAMS},
    {
        "type": "function",
        "name": "time",
        "strict": True,
        "parameters": {**WEATHER_PARAMS, "properties": {}, "required": []},
    },
    {
        "type": "custom",
        "name": "calc",
        "description": "adds two numbers",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "add(" N "," N ")"\nN: /[0-9]{1,3}/'},
    },
    {"type": "custom", "name": "code", "format": {"type": "grammar", "syntax": "regex", "definition": CODE}},
]


OBJECT = {"answer": 42, "unit": "cm"}


def _object_writer(app_factory: ServerFactory, tmp: Path) -> ServerProcess:
    """A server on a scripted model that answers OBJECT (service/engine/scripted.py): the random model's
    json_object runs end only by luck, this one's end whatever the weights. Its own database: servers on one
    database are replicas, and either could run the other's requests."""
    script = f"<|channel|>final<|message|>{json.dumps(OBJECT)}<|return|>"
    model = write_scripted_model(tmp / "object-writer", [Rule(script)], model_id="object-writer")
    database = f"sqlite+aiosqlite:///{tmp / 'object-writer.db'}"
    return app_factory(database, SERVICE_MODEL=str(model)).start()


def _calls(response: Any) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] in ("function_call", "custom_tool_call")]


def _check_call(call: dict[str, Any]) -> None:
    if call["type"] == "function_call":
        params = WEATHER_PARAMS if call["name"] == "weather" else TOOLS[1]["parameters"]
        jsonschema.validate(json.loads(call["arguments"]), params)
    elif call["name"] == "calc":
        assert re.fullmatch(ADD, call["input"]), call["input"]
    else:
        assert re.fullmatch(CODE, call["input"]), call["input"]


def test_strict_json_schema_streamed_and_stored(database_url: str, app_factory: ServerFactory, tmp_path: Path) -> None:
    server = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    for seed in (1, 2):
        stream = client.responses.create(
            input="describe a person", text=PERSON_FORMAT, max_output_tokens=150, stream=True, extra_body={"seed": seed}
        )
        events = [event.model_dump() for event in stream]
        assert_well_formed_stream(events)
        streamed = events[-1]["response"]
        assert streamed["status"] == "completed", streamed.get("incomplete_details")
        # The reasoning budget (6 tokens here) closed the analysis and opened the answer.
        assert streamed["usage"]["output_tokens_details"]["reasoning_tokens"] <= 6 + 1  # + its <|end|>
        messages = [item for item in streamed["output"] if item["type"] == "message"]
        assert len(messages) == 1, "a structured answer is the only message"
        answer = json.loads(messages[0]["content"][0]["text"])
        jsonschema.validate(answer, PERSON)
        stored = client.responses.retrieve(streamed["id"])
        assert stored.model_dump() == streamed, "stored as streamed"
        assert stored.output_text == text_from_deltas(events) and json.loads(stored.output_text) == answer
        assert stored.model_dump()["text"]["format"]["type"] == "json_schema"  # echoed as requested
        replayed = raw_events(server.url, streamed["id"])  # the log replays what was streamed
        assert [e["type"] for e in replayed] == [e["type"] for e in events]
        assert text_from_deltas(replayed) == text_from_deltas(events)
    # json_object has no bound: the random model keeps writing keys and strings until the limit cuts it, an
    # object so far; a run that ends is an object. A model that writes an object ends with it.
    choices: list[Any] = [{"temperature": 0}, *({"extra_body": {"seed": seed}} for seed in range(3))]
    runs = [
        client.responses.create(
            input="an object", text={"format": {"type": "json_object"}}, max_output_tokens=60, **options
        )
        for options in choices
    ]
    for run in runs:
        assert run.output_text.lstrip().startswith("{")
        if run.status == "completed":
            assert isinstance(json.loads(run.output_text), dict)
        else:
            assert run.incomplete_details and run.incomplete_details.reason == "max_output_tokens"
    writer = client_for(_object_writer(app_factory, tmp_path).url)
    answer = writer.responses.create(input="an object", text={"format": {"type": "json_object"}})
    assert answer.status == "completed" and json.loads(answer.output_text) == OBJECT
    assert answer.model_dump()["text"]["format"]["type"] == "json_object"
    # Penalties: deterministic per seed, and they change what is drawn.
    penalised = [
        client.responses.create(
            input="repeat", max_output_tokens=40, extra_body={"seed": 8, "frequency_penalty": 2, "presence_penalty": 2}
        ).output_text
        for _ in range(2)
    ]
    unpenalised = client.responses.create(input="repeat", max_output_tokens=40, extra_body={"seed": 8}).output_text
    assert penalised[0] == penalised[1] != unpenalised


def test_tool_choice_forces_only_permitted_calls(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    cases: list[tuple[Any, set[str]]] = [
        ("required", {"weather", "time", "calc", "code"}),
        ({"type": "function", "name": "weather"}, {"weather"}),
        ({"type": "custom", "name": "calc"}, {"calc"}),
        ({"type": "custom", "name": "code"}, {"code"}),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "custom", "name": "code"}, {"type": "function", "name": "time"}],
            },
            {"code", "time"},
        ),
    ]
    for choice, permitted in cases:
        for seed in (3, 4):
            response = client.responses.create(
                input="call something",
                tools=TOOLS,
                tool_choice=choice,
                max_output_tokens=80,
                extra_body={"seed": seed},
            ).model_dump()
            assert response["status"] == "completed", (choice, response.get("incomplete_details"))
            calls = _calls(response)
            assert len(calls) == 1 and calls[0]["name"] in permitted, (choice, calls)
            _check_call(calls[0])
            assert response["output"][-1] is calls[-1] or response["output"][-1] == calls[-1]
    # parallel_tool_calls=false: at most one call per turn (Harmony ends a turn at its call).
    one = client.responses.create(
        input="x", tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_output_tokens=80
    ).model_dump()
    assert len(_calls(one)) == 1


def test_custom_tool_call_and_its_output_next_turn(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    stream = client.responses.create(
        input="add",
        tools=TOOLS,
        tool_choice={"type": "custom", "name": "calc"},
        max_output_tokens=80,
        stream=True,
        extra_body={"seed": 5},
    )
    events = [event.model_dump() for event in stream]
    assert_well_formed_stream(events)
    (call,) = _calls(events[-1]["response"])
    _check_call(call)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta")
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert deltas == done["input"] == call["input"]
    assert call["id"].startswith("ctc_") and call["call_id"].startswith("call_")
    follow = client.responses.create(
        previous_response_id=events[-1]["response"]["id"],
        input=[{"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "42"}],
        tools=TOOLS,
        tool_choice="none",  # answer now: the structured answer, no further call
        text=PERSON_FORMAT,
        max_output_tokens=150,
        extra_body={"seed": 6},
    )
    assert follow.status == "completed"
    jsonschema.validate(json.loads(follow.output_text), PERSON)
    items = client.responses.input_items.list(follow.id).model_dump()["data"]
    assert any(item["type"] == "custom_tool_call_output" and item["output"] == "42" for item in items)
    # A whole conversation given as input, custom call and result included.
    again = client.responses.create(
        input=[
            {"role": "user", "content": "add"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "calc", "input": "add(1,2)"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "3"},
        ],
        tools=TOOLS,
        tool_choice={"type": "function", "name": "weather"},
        max_output_tokens=80,
    ).model_dump()
    assert again["status"] == "completed"
    (weather,) = _calls(again)
    _check_call(weather)


@pytest.mark.parametrize("kind", ["json_schema", "custom_lark"])
def test_constrained_run_resumes_after_kill_9(database_url: str, server_factory: ServerFactory, kind: str) -> None:
    # The random model writes no special token by itself, so an analysis it opens runs the whole reasoning
    # budget: ~1,000 tokens, long enough to be killed in the middle. Whether it opens one is the header's draw
    # (analysis or the answer/call, about even): the first seed that reasons is the one killed.
    env = {"SERVICE_REASONING_TOKENS_MEDIUM": "1000"}
    server = server_factory(database_url, **env).start()
    client = client_for(server.url)
    request: dict[str, Any] = {"input": "think, then answer", "max_output_tokens": 1300}
    if kind == "json_schema":
        request |= {"text": PERSON_FORMAT}
    else:
        request |= {"tools": TOOLS, "tool_choice": {"type": "custom", "name": "calc"}}
    for seed in range(16):
        request["extra_body"] = {"seed": seed}
        reference = client.responses.create(**request).model_dump()
        assert reference["status"] == "completed"
        if reference["usage"]["output_tokens_details"]["reasoning_tokens"] >= 500:
            break
    else:
        pytest.fail("none of 16 seeds reasoned before answering")
    stream = client.responses.create(**request, background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event.model_dump())
        if sum(e["type"].endswith(".delta") for e in seen) >= 5:  # a few steps in (a delta may carry several)
            break
    response_id = seen[0]["response"]["id"]
    server.kill()
    server = server_factory(database_url, **env).start()
    client = client_for(server.url)
    rest = [
        e.model_dump()
        for e in client.responses.retrieve(response_id, stream=True, starting_after=seen[-1]["sequence_number"])
    ]
    whole = seen + rest
    assert_well_formed_stream(whole)
    final = client.responses.retrieve(response_id).model_dump()
    assert final["status"] == "completed"

    def content(response: dict[str, Any]) -> list[Any]:
        return [(i["type"], i.get("content"), i.get("input"), i.get("name")) for i in response["output"]]

    assert content(final) == content(reference), "the resumed run draws the uninterrupted run's tokens"
    if kind == "json_schema":
        jsonschema.validate(json.loads(final["output"][-1]["content"][0]["text"]), PERSON)
    else:
        (call,) = _calls(final)
        _check_call(call)
    assert final["usage"]["output_tokens"] == reference["usage"]["output_tokens"]
    claims = sql_rows(database_url, f"SELECT claims FROM runs WHERE response_id = '{response_id}'")
    assert claims[0][0] >= 2, "the run was claimed again after the crash"


def _bad(**body: Any) -> dict[str, Any]:
    return {"input": "hi", "max_output_tokens": 20, **body}


def _schema(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": strict}}


def _custom(syntax: str, definition: str) -> list[dict[str, Any]]:
    return [{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": syntax, "definition": definition}}]


OBJ = {"type": "object", "additionalProperties": False}
BAD_INPUTS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "unsupported keyword",
        _bad(text=_schema({**OBJ, "properties": {"a": {"type": "string", "minLength": 1}}, "required": ["a"]})),
        "text.format.schema",
        "'minLength' at '#/properties/a'",
    ),
    (
        "strict object without additionalProperties",
        _bad(text=_schema({"type": "object", "properties": {}})),
        "text.format.schema",
        "additionalProperties",
    ),
    (
        "property missing from required",
        _bad(text=_schema({**OBJ, "properties": {"a": {"type": "string"}}, "required": []})),
        "text.format.schema",
        "required",
    ),
    (
        "invalid schema",
        _bad(text=_schema({"type": "object", "properties": {"a": {"type": "string", "minLength": "x"}}}, strict=False)),
        "text.format.schema",
        "minLength",
    ),
    (
        "unsatisfiable schema",
        _bad(text=_schema({"type": "integer", "minimum": 3, "maximum": 1}, strict=False)),
        "text.format.schema",
        "empty",
    ),
    (
        "schema without a name",
        _bad(text={"format": {"type": "json_schema", "schema": OBJ}}),
        "text.format.name",
        "name",
    ),
    (
        "lark syntax error",
        _bad(tools=_custom("lark", 'start: "a"\nb: ((\n')),
        "tools[0].format.definition",
        "line 2, column",
    ),
    ("regex syntax error", _bad(tools=_custom("regex", "a(b")), "tools[0].format.definition", "line 1, column"),
    ("empty lark language", _bad(tools=_custom("lark", 'start: "a" start')), "tools[0].format.definition", "empty"),
    ("empty regex language", _bad(tools=_custom("regex", "[^\\s\\S]")), "tools[0].format.definition", "empty"),
    ("grammar too large", _bad(tools=_custom("regex", "a" * 300)), "tools[0].format.definition", "at most 256 bytes"),
    (
        "strict function schema",
        _bad(tools=[{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object"}}]),
        "tools[0].parameters",
        "additionalProperties",
    ),
    (
        "named function not in tools",
        _bad(tools=TOOLS, tool_choice={"type": "function", "name": "nope"}),
        "tool_choice",
        "not found",
    ),
    (
        "named custom tool of the wrong type",
        _bad(tools=TOOLS, tool_choice={"type": "custom", "name": "weather"}),
        "tool_choice",
        "not found",
    ),
    (
        "allowed_tools naming an unknown tool",
        _bad(
            tools=TOOLS,
            tool_choice={
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "weather"}, {"type": "function", "name": "ghost"}],
            },
        ),
        "tool_choice.tools[1]",
        "ghost",
    ),
    ("required without tools", _bad(tool_choice="required"), "tool_choice", "at least one tool"),
    ("duplicate tool names", _bad(tools=[TOOLS[0], TOOLS[0]]), "tools[1].name", "Duplicate"),
    (
        "unknown grammar syntax",
        _bad(
            tools=[{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]
        ),
        "tools[0].format.syntax",
        "lark",
    ),
]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_bad_constraints_are_400_and_store_nothing(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, SERVICE_MAX_GRAMMAR_BYTES="256").start()
    client = client_for(server.url)
    for name, body, param, fragment in BAD_INPUTS:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(**body)
        error = info.value.body
        assert isinstance(error, dict), name
        assert error["param"] == param, (name, error)
        assert error["type"] == "invalid_request_error" and fragment in error["message"], (name, error)
    assert sql_rows(database_url, "SELECT count(*) FROM events") == [(0,)], "nothing was stored"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_constrained_objects_and_events_conform(database_url: str, app_factory: ServerFactory, tmp_path: Path) -> None:
    """json_object answers and forced function calls validate against OpenAI's types and the Open Responses
    models; json_schema answers and custom tool calls against OpenAI's: the Open Responses spec has no
    custom tools, and openresponses-types types a json_schema format's `schema` as null (a generator bug),
    so no real json_schema format can pass it."""
    import httpx
    from openai.types.responses import Response

    from tests.test_conformance import OPENAI_EVENT, assert_event_conforms, assert_response_conforms, sse_data

    server = app_factory(database_url, **BUDGET).start()
    writer = _object_writer(app_factory, tmp_path)  # json_object runs that end
    bodies: list[tuple[ServerProcess, dict[str, Any]]] = [
        (writer, {"input": "x", "text": {"format": {"type": "json_object"}}, "max_output_tokens": 60}),
        (server, {"input": "call", "tools": TOOLS[:2], "tool_choice": "required", "max_output_tokens": 80, "seed": 2}),
    ]
    for on, body in bodies:
        with httpx.Client(base_url=on.url, timeout=120) as http:
            with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
                events = [assert_event_conforms(raw) for raw in sse_data(stream)]
            assert events[-1]["response"]["status"] == "completed"
            assert_response_conforms(http.get(f"/v1/responses/{events[-1]['response']['id']}").text)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        openai_only: list[tuple[dict[str, Any], str]] = [
            ({"input": "a person", "text": PERSON_FORMAT, "max_output_tokens": 150, "seed": 1}, "message"),
            ({"input": "add", "tools": TOOLS, "tool_choice": {"type": "custom", "name": "calc"}}, "custom_tool_call"),
        ]
        for body, last in openai_only:
            with http.stream("POST", "/v1/responses", json={"max_output_tokens": 80, **body, "stream": True}) as stream:
                raws = list(sse_data(stream))
            for raw in raws:
                OPENAI_EVENT.validate_json(raw, strict=True)
            final = http.get(f"/v1/responses/{json.loads(raws[-1])['response']['id']}").text
            assert Response.model_validate_json(final, strict=True).output[-1].type == last
