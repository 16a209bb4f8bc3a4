"""Server-side tools through the real server and the official client: MCP calls (listing, forced calls,
allowed_tools, approvals, errors), the code interpreter, secrets kept out of the database, and a kill -9
after a call's result is logged (the call is never made again; the stream is the same as without a crash)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.api_helpers import client_for, raw_events, wait_until_terminal
from tests.conftest import ServerProcess
from tests.test_tools_mcp import McpServer, mcp_server  # noqa: F401 (fixture)

SECRET = "sk-SERVER-TOOLS-SECRET-77"
# A short reasoning budget: the random model's free text is cut after a few tokens, so a forced call comes soon.
BUDGET = {"SERVICE_REASONING_TOKENS_LOW": "6", "SERVICE_REASONING_TOKENS_MEDIUM": "6"}


def mcp_tool(server: McpServer, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "counter", "server_url": server.url, "require_approval": "never", **extra}


def force(name: str) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "counter", "name": name}


def calls_to(server: McpServer, tool: str) -> list[dict[str, Any]]:
    return [call for call in server.calls() if call["tool"] == tool]


def test_mcp_list_and_forced_call_round_trip(
    server_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = server_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    before = len(calls_to(mcp_server, "pick"))
    response = client.responses.create(
        input="add two numbers",
        tools=[mcp_tool(mcp_server, authorization=SECRET)],  # type: ignore[list-item]
        tool_choice=force("pick"),  # type: ignore[arg-type]
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
    types = [e["type"] for e in raw_events(server.url, response.id)]
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
        tools=[mcp_tool(mcp_server, authorization=SECRET)],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=4,
    )
    assert not any(item.type == "mcp_list_tools" for item in follow.output)
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
