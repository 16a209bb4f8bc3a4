"""The stream builder's events, byte for byte: representative runs (text, reasoning with a summary, function,
custom and client tool calls, MCP and code interpreter calls, an approval request, a compaction, folded steps,
runs cut short, cancelled and failed) give exactly the JSON in tests/data/stream_builder_events.txt, captured
from the builder before its events were built from typed models (service/protocol/output.py, events.py). The
log stores this JSON and a finished stream is regenerated from its tokens on read: a byte that moves is a
change clients see. Every event also validates against OpenAI's published types (strict), and against Open
Responses' where the run holds only what that spec defines (no tool items of its own, no compaction)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import jsonschema
import pytest
from pydantic import Field, TypeAdapter

from service.http.openapi import openapi_document
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted
from service.protocol import initial_response, parse_create_request
from service.protocol.events import AnyStreamEvent, ResponseLifecycleEvent
from service.protocol.output import FunctionCall, ShellAction
from service.protocol.response_object import ResponseObject
from service.store.event_codec import encode_event
from service.stream_builder import StreamBuilder

GOLDEN = Path(__file__).parent / "data" / "stream_builder_events.txt"
RESPONSE_ID = "resp_" + "g" * 48
Events = list[dict[str, Any]]

FUNCTION = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
SPAWN = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}
NAMESPACE = {"type": "namespace", "name": "agents", "description": "Agents.", "tools": [SPAWN]}
CUSTOM = {"type": "custom", "name": "calc", "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}}
MCP = {"type": "mcp", "server_label": "counter", "server_url": "http://127.0.0.1:1/mcp", "require_approval": "never"}
MCP_ASK = {"type": "mcp", "server_label": "asker", "server_url": "http://127.0.0.1:1/mcp", "require_approval": "always"}
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}


def _logprob(token: str, logprob: float) -> dict[str, Any]:
    top = [{"token": t, "bytes": list(t.encode()), "logprob": logprob - 1.5} for t in ("x", "é")]
    return {"token": token, "bytes": list(token.encode()), "logprob": logprob, "top_logprobs": top}


def _builder(**body: Any) -> StreamBuilder:
    request = parse_create_request({"input": "hi", **body})
    return StreamBuilder(
        initial_response(request, response_id=RESPONSE_ID, model="m", created_at=1, max_output_tokens=64)
    )


def _end(builder: StreamBuilder, ending: str = "stop", **extra: Any) -> Events:
    return builder.finish(ending, input_tokens=7, output_tokens=11, completed_at=2, **extra)  # type: ignore[arg-type]


def text() -> Events:
    b = _builder(top_logprobs=2, include=["message.output_text.logprobs"])
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("message")], logprobs=[_logprob("<|m|>", -0.25)])  # a header token: not kept
    events += b.feed([ItemDelta("Hel")], logprobs=[_logprob("Hel", -0.5)])
    events += b.feed([], logprobs=[_logprob("\xe2", -1.0)])  # no text yet: rides on the next delta
    events += b.feed([ItemDelta("lo \u2028 ünï\n")], logprobs=[_logprob("lo", 0.0)])
    events += b.feed([ItemEnded()])
    return events + _end(b)


def reasoning_summary() -> Events:
    b = _builder(reasoning={"effort": "low", "summary": "detailed"})
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("reasoning"), ItemDelta("The user says hi.  I greet back! ")])
    events += b.feed([ItemDelta("Short? Yes. Done.")], token_count=3)
    events += b.feed([ItemEnded(), ItemStarted("reasoning"), ItemDelta("   "), ItemEnded()])  # nothing to summarise
    events += b.feed([ItemStarted("message"), ItemDelta("Hi!"), ItemEnded()])
    return events + _end(b)


def reasoning_concise() -> Events:
    b = _builder(reasoning={"summary": "concise", "generate_summary": "auto"})
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("reasoning"), ItemDelta("First. Second.")])
    return events + _end(b, "length")


def function_calls() -> Events:
    b = _builder(tools=[FUNCTION, NAMESPACE, CUSTOM], parallel_tool_calls=True)
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("function_call", name="lookup"), ItemDelta('{"q":'), ItemDelta('"x"}'), ItemEnded()])
    events += b.feed([ItemStarted("function_call", name="spawn_agent"), ItemDelta("{}"), ItemEnded()])
    events += b.feed([ItemStarted("function_call", name="calc"), ItemDelta("4"), ItemDelta("2"), ItemEnded()])
    events += b.feed([ItemStarted("function_call", name="lookup"), ItemDelta('{"q"')])  # cut short
    return events + _end(b, "length")


def _client_call(tool: dict[str, Any], arguments: list[str], ending: str) -> Events:
    b = _builder(tools=[tool])
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("function_call", name=tool["type"]), *map(ItemDelta, arguments)])
    if ending == "stop":
        events += b.feed([ItemEnded()])
    return events + _end(b, ending)


def shell_call() -> Events:
    return _client_call({"type": "shell"}, ['{"commands": ["ls",', ' "pwd"], "timeout_ms": 5}'], "stop")


def local_shell_call() -> Events:
    arguments = ['{"command": ["ls"], "env": {"A": "1", "B": 2}, "working_directory": "/tmp"}']
    return _client_call({"type": "local_shell"}, arguments, "stop")


def apply_patch_calls() -> Events:
    whole = _client_call({"type": "apply_patch"}, ['{"type": "delete_file", "path": "a.txt"}'], "stop")
    created = _client_call({"type": "apply_patch"}, ['{"type": "create_file", "path": "b", "diff": "+x"}'], "stop")
    return whole + created + _client_call({"type": "apply_patch"}, ['{"type": "upd'], "length")


def mcp_calls() -> Events:
    b = _builder(tools=[MCP, MCP_ASK])
    listed: list[dict[str, Any]] = [
        {
            "server_label": "counter",
            "tools": [
                {"name": "pick", "description": "Pick.", "input_schema": {"type": "object"}, "annotations": None},
                {"name": "count", "description": None, "input_schema": {}, "annotations": {"readOnlyHint": True}},
            ],
            "error": None,
        },
        {"server_label": "asker", "tools": [], "error": "unreachable"},
    ]
    events = b.created() + b.in_progress() + b.list_tools(listed)
    events += b.start_approved_call("counter", "pick", '{"color": "blue"}', "mcpr_earlier")
    events += b.tool_result("picked blue", None)
    events += b.feed([ItemStarted("function_call", name="counter.pick"), ItemDelta('{"color":'), ItemDelta('"red"}')])
    events += b.feed([ItemEnded()])
    events += b.tool_result(None, "boom")
    events += b.feed([ItemStarted("function_call", name="asker.ask"), ItemDelta("{}"), ItemEnded()])  # approval
    events += b.feed([ItemStarted("message"), ItemDelta("Asked."), ItemEnded()])
    return events + _end(b)


def code_interpreter() -> Events:
    b = _builder(tools=[CODE])
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("function_call", name="python"), ItemDelta("print("), ItemDelta("42)"), ItemEnded()])
    events += b.tool_result("42\n", None, {"exit_code": 0})
    events += b.feed([ItemStarted("function_call", name="python"), ItemDelta("1/0"), ItemEnded()])
    events += b.tool_result(None, "ZeroDivisionError", {"exit_code": 1})
    events += b.feed([ItemStarted("function_call", name="python"), ItemDelta("x"), ItemEnded()])
    return events + _end(b, "cancelled")  # ended while the third call ran


def mcp_cut_short() -> Events:
    b = _builder(tools=[MCP])
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("function_call", name="counter.pick"), ItemDelta('{"col')])
    return events + _end(b, "length")


def compaction() -> Events:
    b = _builder(background=True)
    item = {"id": "cmp_" + "c" * 40, "type": "compaction", "encrypted_content": "sealed"}
    events = b.created() + b.compaction(None) + b.compaction(item) + b.in_progress()
    events += b.feed([ItemStarted("message"), ItemDelta("ok")])
    return events + _end(b)


def folded_steps() -> Events:
    b = _builder(top_logprobs=1)
    events = b.created() + b.in_progress()
    steps: list[list[Any]] = [
        [ItemStarted("reasoning")],
        [ItemDelta("thin")],
        [ItemDelta("king")],
        [ItemEnded(), ItemStarted("message")],
        [ItemDelta("Hel")],
        [],
        [ItemDelta("lo")],
        [ItemDelta("!")],
    ]
    step = 0
    for size in (3, 3, 2):
        group: Events = []
        for _ in range(size):
            b.fold_into(group, b.feed(steps[step], logprobs=[_logprob(str(step), -0.5 * step)]))
            step += 1
        events += group
    return events + _end(b)


def incomplete() -> Events:
    b = _builder(max_output_tokens=3, instructions="Be brief.", metadata={"k": "v"})
    events = b.created() + b.in_progress()
    events += b.feed([ItemStarted("reasoning"), ItemDelta("hm")])
    events += b.feed([ItemStarted("message"), ItemDelta("Cut")])
    return events + _end(b, "length")


def cancelled() -> Events:
    b = _builder(background=True)
    events = b.created() + b.in_progress() + b.feed([ItemStarted("message"), ItemDelta("Stop")])
    return events + _end(b, "cancelled")


def failed() -> Events:
    b = _builder()
    events = b.created() + b.in_progress() + b.feed([ItemDelta("no header")])  # a message is started for it
    events += _end(b, "failed", error={"code": "server_error", "message": "The model output was malformed."})
    other = _builder()
    return events + other.created() + _end(other, "failed")  # the default error


RUNS: dict[str, Callable[[], Events]] = {
    run.__name__: run
    for run in (
        text,
        reasoning_summary,
        reasoning_concise,
        function_calls,
        shell_call,
        local_shell_call,
        apply_patch_calls,
        mcp_calls,
        code_interpreter,
        mcp_cut_short,
        compaction,
        folded_steps,
        incomplete,
        cancelled,
        failed,
    )
}


def sent(events: Events) -> list[str]:
    """Each event's JSON as the log stores it and clients receive it (event_codec)."""
    return [encode_event(RESPONSE_ID, event).sent for event in events]


def _json(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def golden() -> dict[str, list[str]]:
    runs: dict[str, list[str]] = {}
    for line in GOLDEN.read_text(encoding="utf-8").split("\n"):
        if line:
            name, _tab, event = line.partition("\t")
            runs.setdefault(name, []).append(event)
    return runs


def test_the_golden_file_holds_every_run() -> None:
    assert list(golden()) == list(RUNS)


@pytest.mark.parametrize("name", list(RUNS))
def test_events_are_byte_for_byte_those_captured(name: str) -> None:
    assert sent(RUNS[name]()) == golden()[name]


# Runs whose tools, items or events Open Responses does not define (custom, client, MCP and code interpreter
# tools; compaction): checked against OpenAI's types only.
OPENAI_ONLY_RUNS = {
    "function_calls",
    "shell_call",
    "local_shell_call",
    "apply_patch_calls",
    "mcp_calls",
    "code_interpreter",
    "mcp_cut_short",
    "compaction",
}


@pytest.mark.parametrize("name", list(RUNS))
def test_events_conform_to_openai_and_open_responses(name: str) -> None:
    from tests.test_conformance import OPENAI_EVENT, assert_event_conforms

    for event in sent(RUNS[name]()):
        OPENAI_EVENT.validate_json(event, strict=True)
        if name not in OPENAI_ONLY_RUNS:
            assert_event_conforms(event)


# The typed models are the shape: each event the builder sends is its model's dump, key for key.
EVENT: TypeAdapter[Any] = TypeAdapter(Annotated[AnyStreamEvent, Field(discriminator="type")])


@pytest.mark.parametrize("name", list(RUNS))
def test_each_event_is_its_model_s_dump(name: str) -> None:
    for raw in golden()[name]:
        event = EVENT.validate_json(raw)
        assert _json(event.model_dump()) == raw
        if isinstance(event, ResponseLifecycleEvent):
            ResponseObject.model_validate(event.response)
            assert list(event.response) == list(ResponseObject.model_fields)  # the Response's keys, in order


def test_the_openapi_document_describes_every_event() -> None:
    document = openapi_document()
    schema = {"$ref": "#/components/schemas/StreamEvent/properties/event", "components": document["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    for name in RUNS:
        for raw in golden()[name]:
            validator.validate(json.loads(raw))


def test_omitted_fields_are_left_out_only_while_none() -> None:
    call = FunctionCall(id="fc_1", type="function_call", call_id="c", name="f", arguments="{}")
    assert "namespace" not in call.model_dump()
    assert call.model_copy(update={"namespace": "ns"}).model_dump()["namespace"] == "ns"
    assert list(ShellAction(commands=[], max_output_length=5).model_dump()) == ["commands", "max_output_length"]
