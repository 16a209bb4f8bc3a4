"""Server-side tools through the real server and the official client: MCP calls (listing, forced calls,
allowed_tools, approvals, errors), the code interpreter, secrets kept out of the database, and a kill -9
after a call's result is logged (the call is never made again; the stream is the same as without a crash)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography.fernet import Fernet
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.api_helpers import assert_well_formed_stream, client_for, raw_events, sql_rows, wait_until_terminal
from tests.conftest import ServerProcess, new_sandbox_root
from tests.test_tools_mcp import McpServer, mcp_server  # noqa: F401 (fixture)

OPENAI_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
OPENAI_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseItem)
SECRET = "sk-SERVER-TOOLS-SECRET-77"
# A short reasoning budget: the random model's free text is cut after a few tokens, so a forced call comes soon.
BUDGET = {"SERVICE_REASONING_TOKENS_LOW": "6", "SERVICE_REASONING_TOKENS_MEDIUM": "6"}


def mcp_tool(server: McpServer, **extra: Any) -> Any:  # Any: the SDK's param types are narrower than JSON
    return {"type": "mcp", "server_label": "counter", "server_url": server.url, "require_approval": "never", **extra}


def force(name: str) -> Any:
    return {"type": "mcp", "server_label": "counter", "name": name}


def assert_openai_strict(url: str, response_id: str) -> list[dict[str, Any]]:
    """The stored response and its whole stream validate against the official SDK's types, strictly."""
    Response.model_validate_json(httpx.get(f"{url}/v1/responses/{response_id}", timeout=30).text, strict=True)
    events = raw_events(url, response_id)
    for event in events:
        OPENAI_EVENT.validate_json(json.dumps(event), strict=True)
    assert_well_formed_stream(events)
    return events


def error_body(error: openai.APIStatusError) -> dict[str, Any]:
    body: dict[str, Any] = error.body  # type: ignore[assignment]
    return body


def calls_to(server: McpServer, tool: str) -> list[dict[str, Any]]:
    return [call for call in server.calls() if call["tool"] == tool]


def test_mcp_list_and_forced_call_round_trip(
    app_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    before = len(calls_to(mcp_server, "pick"))
    response = client.responses.create(
        input="add two numbers",
        tools=[mcp_tool(mcp_server, authorization=SECRET)],
        tool_choice=force("pick"),
        max_tool_calls=1,
        max_output_tokens=120,
        extra_body={"seed": 7},
    )
    listed = response.output[0]
    assert [item.type for item in response.output].count("mcp_call") == 1, response.output
    call = next(item for item in response.output if item.type == "mcp_call")
    assert listed.type == "mcp_list_tools" and listed.error is None
    assert {tool.name for tool in listed.tools} >= {"add", "echo", "shout"}
    assert call.type == "mcp_call" and call.name == "pick" and call.server_label == "counter"
    made = calls_to(mcp_server, "pick")
    assert len(made) == before + 1  # exactly one call went out
    assert made[-1]["authorization"] == f"Bearer {SECRET}"  # the secret reached the MCP server
    assert made[-1]["idempotency_key"] == f"{response.id}:tool:0"
    args = made[-1]["arguments"]
    assert call.error is None and call.output == f"picked {args['color']}", call
    assert call.status == "completed"
    # The stream: list events, argument deltas, then the call's completion, in order.
    types = [e["type"] for e in assert_openai_strict(server.url, response.id)]
    for expected in (
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
    ):
        assert expected in types, (expected, types)
    assert types.index("response.mcp_call_arguments.done") < types.index("response.mcp_call.completed")
    # GET returns the same items; a follow-up turn does not list the server's tools again.
    again = client.responses.retrieve(response.id)
    assert [item.type for item in again.output] == [item.type for item in response.output]
    follow = client.responses.create(
        input="and now?",
        previous_response_id=response.id,
        tools=[mcp_tool(mcp_server, authorization=SECRET)],
        max_output_tokens=16,  # seeded, with room past the Harmony header: an unseeded 4 could end inside it
        extra_body={"seed": 7},
    )
    assert follow.output and not any(item.type == "mcp_list_tools" for item in follow.output)
    # The same through a conversation: listed on its first turn only.
    conversation = client.conversations.create()
    turns = [
        client.responses.create(
            input=text, conversation=conversation.id, tools=[mcp_tool(mcp_server)], max_output_tokens=4
        )
        for text in ("one", "two")
    ]
    assert [[item.type for item in turn.output].count("mcp_list_tools") for turn in turns] == [1, 0]
    server.stop()
    assert_secret_absent(database_url)


def assert_secret_absent(database_url: str) -> None:
    if database_url.startswith("sqlite"):
        path = Path(database_url.split("///", 1)[1])
        files = list(path.parent.glob(path.name + "*"))
        assert files and not any(SECRET.encode() in file.read_bytes() for file in files)
        with sqlite3.connect(path) as connection:  # the JSON columns too (escaped or not)
            for table in ("events", "run_facts", "responses"):
                rows = connection.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608
                assert rows and SECRET not in repr(rows), table
    else:
        asyncio.run(_assert_secret_absent_pg(database_url))


async def _assert_secret_absent_pg(database_url: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(database_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        for table in ("events", "run_facts", "responses"):
            rows = await connection.fetch(f"SELECT * FROM {table}")  # noqa: S608
            assert rows and SECRET not in repr([tuple(row) for row in rows]), table
    finally:
        await connection.close()


def without_ids(items: list[Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.model_dump().items() if k not in ("id", "container_id")} for item in items]


def kill_9_after_a_logged_result(
    server_factory: Any,
    database_url: str,
    counting_server: McpServer,
    env: dict[str, str],
    tool: Any,
    tokens: int,
) -> None:
    """kill -9 right after a call's result is logged: after a restart the call is not made again, and the
    resumed run's output equals an uninterrupted run's with the same seed (shared with the chat-template tests)."""
    server: ServerProcess = server_factory(database_url, **env).start()
    client = client_for(server.url)
    request: dict[str, Any] = {
        "input": "pick a color, then talk",
        "tools": [tool],
        "tool_choice": force("pick"),
        "max_tool_calls": 1,
        "max_output_tokens": tokens,
        "extra_body": {"seed": 4242},
    }
    before = len(calls_to(counting_server, "pick"))
    reference = client.responses.create(**request)
    assert len(calls_to(counting_server, "pick")) == before + 1
    stream = client.responses.create(**request, background=True, stream=True)
    seen: list[dict[str, Any]] = []
    for event in stream:
        seen.append(event.model_dump())
        if event.type == "response.mcp_call.completed":  # committed with the call's logged result
            break
    response_id = seen[0]["response"]["id"]
    server.kill()  # kill -9 right after the result was logged
    assert len(calls_to(counting_server, "pick")) == before + 2
    server = server_factory(database_url, **env).start()
    client = client_for(server.url)
    rest = [
        e.model_dump()
        for e in client.responses.retrieve(response_id, stream=True, starting_after=seen[-1]["sequence_number"])
    ]
    whole = seen + rest
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[-1]["type"] in ("response.completed", "response.incomplete")
    final = client.responses.retrieve(response_id)
    assert len(calls_to(counting_server, "pick")) == before + 2, "a call with a logged result is never made again"
    # The resumed run continued from the logged result with exactly the uninterrupted run's tokens.
    assert without_ids(final.output) == without_ids(reference.output)
    assert final.usage is not None and reference.usage is not None
    assert final.usage.output_tokens == reference.usage.output_tokens
    server.stop()
    assert_secret_absent(database_url)


def test_kill_9_after_a_logged_result_never_calls_again(
    server_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    env = {**BUDGET, "SERVICE_SECRET_KEY": Fernet.generate_key().decode()}
    kill_9_after_a_logged_result(
        server_factory, database_url, mcp_server, env, mcp_tool(mcp_server, authorization=SECRET), tokens=300
    )


def test_allowed_tools_unreachable_and_refused_urls(
    app_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    only_pick = client.responses.create(
        input="x",
        tools=[mcp_tool(mcp_server, allowed_tools=["pick"])],
        tool_choice="required",
        max_tool_calls=1,
        max_output_tokens=80,
    )
    listed = only_pick.output[0]
    assert listed.type == "mcp_list_tools" and [tool.name for tool in listed.tools] == ["pick"]
    calls = [item for item in only_pick.output if item.type == "mcp_call"]
    assert calls and all(call.name == "pick" for call in calls)
    # An unreachable server: the listing item carries the error, the response goes on, no 5xx.
    dead: Any = {
        "type": "mcp",
        "server_label": "dead",
        "server_url": "http://127.0.0.1:9/mcp",
        "require_approval": "never",
    }
    gone = client.responses.create(input="x", tools=[dead], max_output_tokens=4)
    assert gone.output[0].type == "mcp_list_tools" and gone.output[0].error
    # Forced to call it: nothing else can go on, a 424 in OpenAI's shape, and nothing stored.
    stored_before = sql_rows(database_url, "SELECT count(*) FROM responses")
    with pytest.raises(openai.APIStatusError) as failed:
        client.responses.create(
            input="x", tools=[dead], tool_choice={"type": "mcp", "server_label": "dead"}, max_output_tokens=4
        )
    assert failed.value.status_code == 424
    error = error_body(failed.value)
    assert error["type"] == "external_connector_error" and error["param"] == "tools" and error["code"] == "http_error"
    assert error["message"].startswith("Error retrieving tool list from MCP server: 'dead'.")
    assert sql_rows(database_url, "SELECT count(*) FROM responses") == stored_before
    for url in ("ftp://example.com/mcp", "http://169.254.169.254/latest", "not a url"):
        refused: Any = dict(dead, server_url=url)
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(input="x", tools=[refused], max_output_tokens=4)
        assert error_body(raised.value)["param"] == "tools[0].server_url"
    # A background request with secrets, on a server without SERVICE_SECRET_KEY: a 400 that says why.
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(input="x", background=True, tools=[mcp_tool(mcp_server, authorization=SECRET)])
    assert "SERVICE_SECRET_KEY" in error_body(raised.value)["message"]
    twice: Any = [{"type": "code_interpreter", "container": {"type": "auto"}}] * 2
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(input="x", tools=twice)
    assert error_body(raised.value)["param"] == "tools[1]"
    # tool_choice naming a server the request does not offer.
    with pytest.raises(openai.BadRequestError):
        client.responses.create(input="x", tool_choice={"type": "mcp", "server_label": "nope"})
    assert client.responses.create(input="still fine", max_output_tokens=2).status in ("completed", "incomplete")


def test_approval_request_then_approve_or_refuse(
    app_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    tool = mcp_tool(mcp_server, require_approval="always")
    before = len(calls_to(mcp_server, "pick"))
    asked = client.responses.create(input="pick", tools=[tool], tool_choice=force("pick"), max_output_tokens=80)
    request = asked.output[-1]
    assert request.type == "mcp_approval_request" and request.name == "pick", asked.output
    assert asked.status == "completed"
    assert len(calls_to(mcp_server, "pick")) == before, "nothing is called before it is approved"
    assert_openai_strict(server.url, asked.id)
    approved = client.responses.create(
        previous_response_id=asked.id,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}],
        tools=[tool],
        max_output_tokens=40,
    )
    call = next(item for item in approved.output if item.type == "mcp_call")
    assert (call.name, call.arguments, call.approval_request_id) == ("pick", request.arguments, request.id)
    assert call.output == f"picked {json.loads(request.arguments)['color']}"
    assert len(calls_to(mcp_server, "pick")) == before + 1, "exactly the approved call"
    assert not any(item.type == "mcp_list_tools" for item in approved.output), "listed by the earlier turn"
    assert_openai_strict(server.url, approved.id)
    listed_inputs = httpx.get(f"{server.url}/v1/responses/{approved.id}/input_items", timeout=30).json()["data"]
    assert [item["type"] for item in listed_inputs] == ["mcp_approval_response"]
    for item in listed_inputs:
        OPENAI_ITEM.validate_json(json.dumps(item), strict=True)
    refused = client.responses.create(
        previous_response_id=asked.id,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False}],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=10,
    )
    assert not any(item.type == "mcp_call" for item in refused.output)
    assert len(calls_to(mcp_server, "pick")) == before + 1
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            previous_response_id=asked.id,
            input=[{"type": "mcp_approval_response", "approval_request_id": "mcpr_unknown", "approve": True}],
            tools=[tool],
        )


def test_code_interpreter_round_trip(app_factory: Any, database_url: str) -> None:
    # The random-weight model never ends free text by itself: bound the code it may write, so its call closes.
    # (The sandbox's directory must be reachable by the sandbox user: not under pytest's private tmp_path.)
    sandbox_dir = new_sandbox_root()
    env = {**BUDGET, "SERVICE_CODE_INTERPRETER_MAX_CODE_CHARS": "40", "SERVICE_SANDBOX_DIR": str(sandbox_dir / "c")}
    server: ServerProcess = app_factory(database_url, **env).start()
    client = client_for(server.url)
    response = client.responses.create(
        input="compute something",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        tool_choice="required",
        max_tool_calls=1,
        max_output_tokens=120,
        include=["code_interpreter_call.outputs"],
        extra_body={"seed": 3},
    )
    calls = [item for item in response.output if item.type == "code_interpreter_call"]
    assert len(calls) == 1, response.output
    call = calls[0]
    assert call.status == "completed" and call.code and len(call.code) <= 40
    assert call.outputs is not None and call.outputs[0].type == "logs"
    assert call.container_id == "cntr_" + response.id.removeprefix("resp_")
    assert (sandbox_dir / "c" / call.container_id).is_dir(), "the code ran in its container's work directory"
    types = [e["type"] for e in assert_openai_strict(server.url, response.id)]
    order = [
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
    ]
    assert [t for t in types if t in order][0] == order[0]
    assert all(t in types for t in order)
    assert types.index(order[2]) < types.index(order[3]) < types.index(order[4])
    assert_outputs_need_include(server.url, client, response.id, [o.model_dump() for o in call.outputs])


def ci_items(value: Any) -> list[dict[str, Any]]:
    """Every code_interpreter_call item inside a JSON value (Response, event, item list)."""
    if isinstance(value, list):
        return [item for entry in value for item in ci_items(entry)]
    if not isinstance(value, dict):
        return []
    own = [value] if value.get("type") == "code_interpreter_call" else []
    return own + [item for entry in value.values() for item in ci_items(entry)]


def assert_outputs_need_include(url: str, client: openai.OpenAI, response_id: str, logs: list[Any]) -> None:
    """As in OpenAI's API, outputs are null unless `include` names them; the log keeps them for a later read."""
    events = raw_events(url, response_id)
    assert ci_items(events) and all(item["outputs"] is None for item in ci_items(events))
    assert all(
        item.outputs is None
        for item in client.responses.retrieve(response_id).output
        if item.type == "code_interpreter_call"
    )
    included = client.responses.retrieve(response_id, include=["code_interpreter_call.outputs"])
    Response.model_validate_json(included.model_dump_json(), strict=True)
    shown = [item for item in included.output if item.type == "code_interpreter_call"]
    assert len(shown) == 1 and shown[0].outputs is not None
    assert [output.model_dump() for output in shown[0].outputs] == logs
    with httpx.stream(
        "GET",
        f"{url}/v1/responses/{response_id}",
        params={"stream": "true", "include": "code_interpreter_call.outputs"},
        timeout=60,
    ) as stream:
        replayed = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    done = [e["item"] for e in replayed if e["type"] == "response.output_item.done" and "outputs" in e["item"]]
    assert done and done[0]["outputs"] == logs
    streamed = client.responses.create(
        input="compute something",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        tool_choice="required",
        max_tool_calls=1,
        max_output_tokens=120,
        stream=True,
        extra_body={"seed": 3},
    )
    sent = [event.model_dump() for event in streamed]
    assert ci_items(sent) and all(item["outputs"] is None for item in ci_items(sent)), "no include, no outputs"
    bad = httpx.get(f"{url}/v1/responses/{response_id}", params={"include": "nope"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include"


def kill_9_during_a_call(
    server_factory: Any, database_url: str, counting_server: McpServer, env: dict[str, str], tool: Any
) -> Any:
    """kill -9 while a slow call is in flight (its start logged, its result not): after a restart it is made
    exactly once more, with the same idempotency key; returns the finished response."""
    server: ServerProcess = server_factory(database_url, **env).start()
    client = client_for(server.url)
    before = len(calls_to(counting_server, "nap"))
    stream = client.responses.create(
        input="rest",
        tools=[tool],
        tool_choice=force("nap"),
        max_tool_calls=1,
        max_output_tokens=60,
        background=True,
        stream=True,
    )
    response_id = ""
    for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.mcp_call_arguments.done":
            break
    deadline = time.monotonic() + 30  # waits for the call to arrive; nothing is gated on its duration
    while len(calls_to(counting_server, "nap")) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    server.kill()  # kill -9 while the 4 s call is in flight: its start is logged, its result is not
    server = server_factory(database_url, **env).start()
    client = client_for(server.url)
    final = wait_until_terminal(client, response_id)
    naps = calls_to(counting_server, "nap")[before:]
    assert [call["idempotency_key"] for call in naps] == [f"{response_id}:tool:0"] * 2, "retried once, same key"
    call = next(item for item in final.output if item.type == "mcp_call")
    assert call.output == "rested" and call.status == "completed"
    assert_openai_strict(server.url, response_id)
    return final


def test_kill_9_during_a_call_retries_it_once_with_its_key(
    server_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    kill_9_during_a_call(server_factory, database_url, mcp_server, BUDGET, mcp_tool(mcp_server))
