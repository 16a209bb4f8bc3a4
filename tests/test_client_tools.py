"""Client-run tools with their own item types (issue 38): `shell`, `local_shell`, `apply_patch` and a namespace's
functions are offered to the model; a forced call comes back as the SDK's own item (`shell_call`,
`local_shell_call`, `apply_patch_call`, `function_call` with `namespace`), validated strictly against the official
client's types, live and replayed byte for byte from the log; its output sent back with previous_response_id
continues the conversation, and reads to the model as that function's result. Through the real server, on SQLite
and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter

from service.protocol.client_tools import CLIENT_FUNCTIONS, as_function_item
from tests.api_helpers import assert_well_formed_stream, client_for
from tests.conftest import ServerProcess, app_on_backend
from tests.test_chat_template_model import chat_model_dir  # noqa: F401 (fixture)

OPENAI_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
OPENAI_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseItem)
# A short reasoning budget: the random model's free text is cut after a few tokens, so a forced call comes soon.
BUDGET = {"SERVICE_REASONING_TOKENS_LOW": "6", "SERVICE_REASONING_TOKENS_MEDIUM": "6"}
SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Start an agent.",
    "parameters": {"type": "object", "properties": {"task": {"type": "string", "enum": ["a", "b"]}}},
    "strict": False,
}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [SPAWN]}
SHELL_OUTPUT = [{"stdout": "hello\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path
) -> Iterator[ServerProcess]:
    yield from app_on_backend(request.param, tmp_path_factory.mktemp(f"client-tools-{request.param}"), **BUDGET)


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return client_for(server.url)


def _data_lines(reply: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]


def _streamed(server: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A streamed create: each event validated strictly against the SDK's types; the replay from the log is the
    live stream byte for byte; the stored response validates strictly too."""
    body = {"stream": True, "max_output_tokens": 400, "seed": 3, **body}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        assert "x-tools-not-offered" not in reply.headers
        live = _data_lines(reply)
    for raw in live:
        OPENAI_EVENT.validate_json(raw, strict=True)
    events = [json.loads(raw) for raw in live]
    assert_well_formed_stream(events)
    response_id = events[0]["response"]["id"]
    params: dict[str, str | int] = {"stream": "true", "starting_after": -1}
    with httpx.stream("GET", f"{server.url}/v1/responses/{response_id}", params=params, timeout=120) as replay:
        assert _data_lines(replay) == live
    stored = httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=30).text
    Response.model_validate_json(stored, strict=True)
    return json.loads(stored), events


def _completed(server: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first seeded run whose forced call completes: the random model's free strings (a path, a diff) often
    run past max_output_tokens; every run tried is validated all the same."""
    for seed in range(1, 13):
        response, events = _streamed(server, {**body, "seed": seed})
        if response["status"] == "completed":
            return response, events
    raise AssertionError("no seed gave a completed call")


def _the_call(response: dict[str, Any], kind: str) -> dict[str, Any]:
    calls = [item for item in response["output"] if item["type"] == kind]
    assert len(calls) == 1, [item["type"] for item in response["output"]]
    OPENAI_ITEM.validate_python(calls[0], strict=True)
    return calls[0]


def _continue(client: openai.OpenAI, previous: dict[str, Any], output: dict[str, Any], tools: list[Any]) -> None:
    """The call's output sent back continues the conversation; it is listed among the new response's input."""
    create: Any = client.responses.create
    after = create(
        previous_response_id=previous["id"], input=[output], tools=tools, max_output_tokens=4, extra_body={"seed": 1}
    )
    Response.model_validate_json(after.model_dump_json(), strict=True)
    assert after.status in ("completed", "incomplete")
    listed = client.responses.input_items.list(after.id).data
    assert listed[0].type == output["type"]
    OPENAI_ITEM.validate_json(listed[0].model_dump_json(), strict=True)


def test_a_forced_shell_call_is_a_shell_call_item(server: ServerProcess, client: openai.OpenAI) -> None:
    tools = [{"type": "shell", "environment": {"type": "local"}}]
    response, events = _completed(server, {"input": "list files", "tools": tools, "tool_choice": {"type": "shell"}})
    assert response["tools"] == tools and response["tool_choice"] == {"type": "shell"}  # echoed as sent
    call = _the_call(response, "shell_call")
    assert call["status"] == "completed" and isinstance(call["action"]["commands"], list)
    added = [e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "shell_call"]
    assert added and added[0]["item"]["action"] == {"commands": []}
    output = {"type": "shell_call_output", "call_id": call["call_id"], "output": SHELL_OUTPUT}
    _continue(client, response, output, tools)


def test_a_forced_apply_patch_call_is_an_apply_patch_call_item(server: ServerProcess, client: openai.OpenAI) -> None:
    tools = [{"type": "apply_patch"}]
    body = {"input": "add a file", "tools": tools, "tool_choice": {"type": "apply_patch"}}
    response, _ = _completed(server, body)
    call = _the_call(response, "apply_patch_call")
    assert call["status"] == "completed"
    assert call["operation"]["type"] in ("create_file", "update_file", "delete_file")
    output = {"type": "apply_patch_call_output", "call_id": call["call_id"], "status": "completed", "output": "ok"}
    _continue(client, response, output, tools)


def test_a_local_shell_call_is_a_local_shell_call_item(server: ServerProcess, client: openai.OpenAI) -> None:
    tools = [{"type": "local_shell"}]
    response, _ = _completed(server, {"input": "run ls", "tools": tools, "tool_choice": "required"})
    call = _the_call(response, "local_shell_call")
    assert call["status"] == "completed" and call["action"]["type"] == "exec"
    assert isinstance(call["action"]["command"], list) and isinstance(call["action"]["env"], dict)
    # OpenAI's local_shell_call_output names its call by `id`.
    _continue(client, response, {"type": "local_shell_call_output", "id": call["call_id"], "output": "a.txt"}, tools)


def test_a_namespaced_function_call_carries_its_namespace(server: ServerProcess, client: openai.OpenAI) -> None:
    tools = [NAMESPACE]
    choice = {"type": "function", "name": "spawn_agent"}
    response, events = _completed(server, {"input": "spawn", "tools": tools, "tool_choice": choice})
    call = _the_call(response, "function_call")
    assert call["name"] == "spawn_agent" and call["namespace"] == "multi_agent_v1"
    json.loads(call["arguments"])
    done = [e for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    assert done[0]["item"]["namespace"] == "multi_agent_v1"
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "started"}
    _continue(client, response, output, tools)


@pytest.mark.parametrize(
    ("call", "output", "tool"),
    [
        (
            {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}, "status": "completed"},
            {"type": "shell_call_output", "call_id": "c1", "output": SHELL_OUTPUT},
            "shell",
        ),
        (
            {
                "type": "apply_patch_call",
                "call_id": "c1",
                "status": "completed",
                "operation": {"type": "create_file", "path": "a.txt", "diff": "+hi"},
            },
            {"type": "apply_patch_call_output", "call_id": "c1", "status": "completed"},
            "apply_patch",
        ),
        (
            {
                "type": "local_shell_call",
                "call_id": "c1",
                "status": "completed",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
            },
            {"type": "local_shell_call_output", "id": "c1", "output": "a.txt"},
            "local_shell",
        ),
    ],
)
def test_client_tool_history_reads_as_that_functions_call_and_result(
    client: openai.OpenAI, call: dict[str, Any], output: dict[str, Any], tool: str
) -> None:
    """The model sees the tool as the function it is offered as, and its call and output as that function's."""
    as_call, as_output = as_function_item(call), as_function_item(output)
    count: Any = client.responses.input_tokens.count
    native = count(input=[call, output], tools=[{"type": tool}]).input_tokens
    flat = count(input=[as_call, as_output], tools=[CLIENT_FUNCTIONS[tool]]).input_tokens  # type: ignore[index]
    assert native == flat


def test_a_function_named_like_a_client_tool_is_a_400(server: ServerProcess) -> None:
    body = {"input": "hi", "tools": [{**SPAWN, "name": "shell"}, {"type": "shell"}]}
    reply = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools[1].type"


def test_forcing_a_client_tool_the_request_lacks_is_a_400(server: ServerProcess) -> None:
    body = {"input": "hi", "tools": [SPAWN], "tool_choice": {"type": "apply_patch"}}
    reply = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tool_choice"


def test_a_chat_template_model_calls_client_tools_as_functions(
    chat_model_dir: Path,  # noqa: F811
    database_url: str,
    app_factory: Callable[..., ServerProcess],
) -> None:
    """A chat-template model is offered the same functions: its forced `<tool_call>` comes back as a shell_call,
    and the shell_call_output continues the conversation."""
    server = app_factory(database_url, SERVICE_MODEL=str(chat_model_dir)).start()
    client = client_for(server.url)
    tools = [{"type": "shell"}]
    response, _ = _completed(server, {"input": "x", "tools": tools, "tool_choice": {"type": "shell"}})
    call = _the_call(response, "shell_call")
    output = {"type": "shell_call_output", "call_id": call["call_id"], "output": SHELL_OUTPUT}
    _continue(client, response, output, tools)


def test_an_output_for_an_unknown_call_is_a_400_naming_it(server: ServerProcess) -> None:
    output = {"type": "shell_call_output", "call_id": "call_nowhere", "output": SHELL_OUTPUT}
    reply = httpx.post(f"{server.url}/v1/responses", json={"input": [output], "tools": [{"type": "shell"}]}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input[0].call_id", reply.text


def test_a_shell_in_a_hosted_container_is_a_400(server: ServerProcess) -> None:
    """Accepting it would silently hand the client calls it expects the server to run."""
    tools = [{"type": "shell", "environment": {"type": "container_auto"}}]
    reply = httpx.post(f"{server.url}/v1/responses", json={"input": "hi", "tools": tools}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].startswith("tools[0]") and "hosted container" in error["message"], error


# The stream builder alone (pure): the items and events a client tool's call gives, whole and cut short.


def _builder_events(tools: list[dict[str, Any]], name: str, arguments: list[str], ending: str) -> list[dict[str, Any]]:
    from service.prompting.base import ItemDelta, ItemEnded, ItemStarted
    from service.protocol import initial_response, parse_create_request
    from service.stream_builder import StreamBuilder

    request = parse_create_request({"input": "hi", "tools": tools})
    builder = StreamBuilder(
        initial_response(request, response_id="resp_t", model="m", created_at=1, max_output_tokens=9)
    )
    events = builder.created() + builder.in_progress()
    events += builder.feed([ItemStarted("function_call", name=name), *map(ItemDelta, arguments)])
    if ending == "stop":
        events += builder.feed([ItemEnded()])
    events += builder.finish(ending, input_tokens=1, output_tokens=2, completed_at=2)  # type: ignore[arg-type]
    for event in events:
        OPENAI_EVENT.validate_json(json.dumps(event), strict=True)
    return events


@pytest.mark.parametrize(
    ("tool", "name", "arguments", "kind", "fields"),
    [
        (
            {"type": "shell"},
            "shell",
            ['{"commands": ["ls",', ' "pwd"], "timeout_ms": 5}'],
            "shell_call",
            {"action": {"commands": ["ls", "pwd"], "timeout_ms": 5}},
        ),
        (
            {"type": "local_shell"},
            "local_shell",
            ['{"command": ["ls"], "working_directory": "/tmp"}'],
            "local_shell_call",
            {"action": {"type": "exec", "command": ["ls"], "env": {}, "working_directory": "/tmp"}},
        ),
        (
            {"type": "apply_patch"},
            "apply_patch",
            ['{"type": "delete_file", "path": "a.txt"}'],
            "apply_patch_call",
            {"operation": {"type": "delete_file", "path": "a.txt"}},
        ),
    ],
)
def test_the_builder_makes_the_sdk_item(
    tool: dict[str, Any], name: str, arguments: list[str], kind: str, fields: dict[str, Any]
) -> None:
    events = _builder_events([tool], name, arguments, "stop")
    types = [e["type"] for e in events]
    assert types == ["response.created", "response.in_progress"] + [
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[3]["item"]
    assert done["type"] == kind and done["status"] == "completed" and {k: done[k] for k in fields} == fields
    assert events[-1]["response"]["output"] == [done]
    assert _builder_events([tool], name, arguments, "stop") == events  # deterministic


def test_a_call_cut_short_is_an_incomplete_item() -> None:
    events = _builder_events([{"type": "shell"}], "shell", ['{"commands": ["l'], "length")
    item = events[-1]["response"]["output"][0]
    assert item == {**item, "type": "shell_call", "status": "incomplete", "action": {"commands": []}}
    patch = _builder_events([{"type": "apply_patch"}], "apply_patch", ['{"type'], "length")
    assert patch[-1]["response"]["output"][0]["status"] == "in_progress"  # the SDK's apply_patch_call has no incomplete


def test_a_function_named_like_a_client_tool_without_that_tool_is_a_function_call() -> None:
    function = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
    events = _builder_events([function], "shell", ["{}"], "stop")
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "function_call" and item["name"] == "shell" and "namespace" not in item
