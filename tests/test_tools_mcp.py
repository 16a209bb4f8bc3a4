"""MCP tools against a real MCP server (MCPServer over streamable HTTP on loopback, counting its calls),
and the agent loop's exactly-once bookkeeping against real databases, including kill -9 mid-call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.agent.calls import RESULT, STARTED, PlannedCall, ToolCalls, execute, idempotency_key
from service.store import event_log
from service.tools import secrets
from service.tools.mcp import IDEMPOTENCY_META_KEY, UNREACHABLE, McpConnector
from service.tools.mcp_policy import McpUrlRefused, check_server_url
from service.tools.registry import (
    McpServerTool,
    ToolNotOffered,
    ToolRegistry,
    allowed_tool_names,
    approval_required,
    refuse_unoffered,
)
from service.tools.specs import ServerToolRefused, check_server_tools
from tests import mcp_test_server
from tests.conftest import free_port
from tests.tools_loop_runner import run_call

REPO = Path(__file__).resolve().parents[1]


@dataclass
class McpServer:
    url: str
    ledger: Path

    def calls(self) -> list[dict[str, Any]]:
        return mcp_test_server.read_ledger(self.ledger)


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    port = free_port()
    ledger = tmp_path_factory.mktemp("mcp") / "ledger.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_test_server", str(port), str(ledger)], cwd=REPO, env=dict(os.environ)
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("the MCP test server did not start") from None
            time.sleep(0.1)
    yield McpServer(f"http://127.0.0.1:{port}/mcp", ledger)
    process.terminate()
    process.wait(timeout=10)


def connector(timeout: float = 10.0, max_output_bytes: int = 4096) -> McpConnector:
    return McpConnector(timeout_seconds=timeout, max_output_bytes=max_output_bytes)


# -- listing and calling ------------------------------------------------------------------------


async def test_list_and_call_round_trip(mcp_server: McpServer) -> None:
    tools = await connector().list_tools(mcp_server.url, {})
    by_name = {tool.name: tool for tool in tools}
    assert {"add", "echo", "shout", "slow", "fail"} <= set(by_name)
    assert by_name["add"].description == "Add two integers."
    assert set(by_name["add"].input_schema["properties"]) == {"a", "b"}

    before = len(mcp_server.calls())
    headers = secrets.request_headers({"authorization": "tok-123", "headers": {"X-Team": "blue"}})
    result = await connector().call(mcp_server.url, headers, "add", {"a": 2, "b": 40}, "key-round-trip")
    assert (result.output, result.error) == ("42", None)
    calls = mcp_server.calls()[before:]
    assert len(calls) == 1
    assert calls[0]["idempotency_key"] == "key-round-trip"  # sent in _meta
    assert mcp_test_server.IDEMPOTENCY_META_KEY == IDEMPOTENCY_META_KEY
    assert calls[0]["authorization"] == "Bearer tok-123"


async def test_tool_errors_and_timeouts_are_results(mcp_server: McpServer) -> None:
    failed = await connector().call(mcp_server.url, {}, "fail", {"reason": "boom"}, "k-fail")
    assert failed.output is None and failed.error and "fail" in failed.error
    unknown = await connector().call(mcp_server.url, {}, "nope", {}, "k-unknown")
    assert unknown.error and "nope" in unknown.error
    slow = await connector(timeout=1.0).call(mcp_server.url, {}, "slow", {"seconds": 3}, "k-slow")
    assert slow.error == f"Error calling 'slow': {UNREACHABLE}"


async def test_output_is_capped(mcp_server: McpServer) -> None:
    result = await connector(max_output_bytes=10).call(mcp_server.url, {}, "echo", {"text": "x" * 100}, "k-cap")
    assert result.output == "x" * 10 + "\n[output truncated]"


async def test_unreachable_server_is_an_error_not_a_crash() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    result = await connector(timeout=3).call(url, {}, "add", {"a": 1, "b": 1}, "k-down")
    assert result.output is None and result.error == f"Error calling 'add': {UNREACHABLE}"
    with pytest.raises(Exception, match="Error listing the tools"):
        await connector(timeout=3).list_tools(url, {})


async def test_allowed_tools_filter(mcp_server: McpServer) -> None:
    spec = {"allowed_tools": {"tool_names": ["echo"]}}
    tool = McpServerTool(connector(), mcp_server.url, {}, allowed_tool_names(spec))
    before = len(mcp_server.calls())
    refused = await tool.call("shout", '{"text": "hi"}', "k-allowed-1")
    assert refused.error == "Tool 'shout' is not in allowed_tools."
    assert len(mcp_server.calls()) == before  # never sent
    allowed = await tool.call("echo", '{"text": "hi"}', "k-allowed-2")
    assert allowed.output == "hi"
    assert allowed_tool_names({"allowed_tools": ["a", "b"]}) == frozenset({"a", "b"})
    assert allowed_tool_names({}) is None
    bad_json = await tool.call("echo", "{not json", "k-allowed-3")
    assert bad_json.error and "not JSON" in bad_json.error


def test_require_approval_rules() -> None:
    assert approval_required({}, "add")
    assert not approval_required({"require_approval": "never"}, "add")
    spec = {"require_approval": {"never": {"tool_names": ["echo"]}}}
    assert not approval_required(spec, "echo") and approval_required(spec, "add")


# -- server_url policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/mcp",
        "file:///etc/passwd",
        "http:///nohost",
        "http://user:pw@example.com/mcp",
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]/mcp",
        "http://metadata.google.internal/computeMetadata",
        "http://0.0.0.0:8080/mcp",
        "http://example.com:99999/mcp",
    ],
)
def test_bad_server_urls_refused(url: str) -> None:
    with pytest.raises(McpUrlRefused):
        check_server_url(url, None, resolve=False)


def test_allowed_hosts() -> None:
    check_server_url("http://127.0.0.1:9/mcp", None, resolve=False)  # loopback allowed by default
    check_server_url("https://mcp.example.com/x", ["*.example.com"], resolve=False)
    check_server_url("https://tools.internal/x", ["tools.internal"], resolve=False)
    with pytest.raises(McpUrlRefused, match="not in this server's allowed MCP hosts"):
        check_server_url("https://evil.test/x", ["*.example.com", "tools.internal"], resolve=False)
    with pytest.raises(McpUrlRefused):
        check_server_url("http://169.254.169.254/", ["tools.internal"], resolve=False)


def test_unoffered_tools_refused() -> None:
    with pytest.raises(ToolNotOffered, match="does not offer web search") as raised:
        refuse_unoffered([{"type": "function", "name": "f"}, {"type": "web_search_preview"}])
    assert raised.value.param == "tools[1].type"
    with pytest.raises(ToolNotOffered, match="file search"):
        refuse_unoffered([{"type": "file_search", "vector_store_ids": ["vs_1"]}])
    refuse_unoffered([{"type": "mcp"}, {"type": "code_interpreter"}])


# -- secrets ------------------------------------------------------------------------------------


def test_secrets_sealed_and_redacted() -> None:
    # Secrets with characters outside base64's alphabet: the sealed text can hold them only in the clear
    # (a 3-letter "tok" turned up inside a random ciphertext once in CI).
    tool = {"type": "mcp", "server_label": "s", "authorization": "tok!en", "headers": {"X-Key!": "k"}}
    assert secrets.redact(tool) == {"type": "mcp", "server_label": "s"}
    with pytest.raises(secrets.SecretsNeedKey, match="SERVICE_SECRET_KEY"):
        secrets.seal(None, tool)
    key = secrets.new_key()
    sealed = secrets.seal(key, tool)
    assert "tok!en" not in sealed and "X-Key!" not in sealed
    assert secrets.unseal(key, sealed) == {"headers": {"X-Key!": "k"}, "authorization": "tok!en"}
    with pytest.raises(secrets.SecretsUnreadable):
        secrets.unseal(secrets.new_key(), sealed)


# -- exactly once, through the log --------------------------------------------------------------


async def _facts(db: AsyncEngine, response_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with db.connect() as connection:
        return [(f.kind, f.data) for f in await event_log.read_facts(connection, response_id)]


async def test_logged_result_is_never_called_again(db: AsyncEngine, mcp_server: McpServer) -> None:
    rid = f"resp_once_{os.getpid()}_{time.monotonic_ns()}"
    before = len(mcp_server.calls())
    first = await run_call(db, rid, mcp_server.url, "add", '{"a": 20, "b": 22}')
    assert first == "42"
    assert len(mcp_server.calls()) == before + 1
    # A "restart": the state is rebuilt from the log alone, and the call is answered from it.
    for _ in range(2):
        again = await run_call(db, rid, mcp_server.url, "add", '{"a": 20, "b": 22}')
        assert again == "42"
    assert len(mcp_server.calls()) == before + 1
    kinds = [kind for kind, _ in await _facts(db, rid)]
    assert kinds == [STARTED, RESULT]


async def test_started_call_is_retried_once_with_its_key(db: AsyncEngine, mcp_server: McpServer) -> None:
    rid = f"resp_retry_{os.getpid()}_{time.monotonic_ns()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.tools_loop_runner", str(db.url.render_as_string(hide_password=False)), rid,
         mcp_server.url, "slow", '{"seconds": 2.5}'],
        cwd=REPO,
    )  # fmt: skip
    key = idempotency_key(rid, 0)
    deadline = time.monotonic() + 30
    while not any(c["idempotency_key"] == key for c in mcp_server.calls()):
        assert time.monotonic() < deadline, "the call never reached the MCP server"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)  # the call is in flight
    process.wait()
    assert [kind for kind, _ in await _facts(db, rid)] == [STARTED]

    output = await run_call(db, rid, mcp_server.url, "slow", '{"seconds": 2.5}')
    assert output == "slept 2.5"
    sent = [c for c in mcp_server.calls() if c["idempotency_key"] == key]
    assert len(sent) == 2  # the one in flight at the crash, and exactly one retry with the same key
    assert [kind for kind, _ in await _facts(db, rid)] == [STARTED, RESULT]
    # Once its result is logged, no more calls.
    assert await run_call(db, rid, mcp_server.url, "slow", '{"seconds": 2.5}') == "slept 2.5"
    assert len([c for c in mcp_server.calls() if c["idempotency_key"] == key]) == 2


async def test_max_tool_calls_refuses_without_calling() -> None:
    calls = ToolCalls("resp_x", max_calls=1)
    logged: list[tuple[str, dict[str, Any]]] = []

    async def log_fact(kind: str, data: dict[str, Any]) -> None:
        logged.append((kind, data))

    result = await execute(calls, PlannedCall(1, "counter", "add", "{}"), ToolRegistry(), log_fact, timeout_seconds=1)
    assert result.error == "max_tool_calls (1) reached."
    assert [kind for kind, _ in logged] == [RESULT]


async def test_secrets_never_reach_the_database(db: AsyncEngine, mcp_server: McpServer, database_url: str) -> None:
    """What the loop logs for an MCP call with secrets holds none of them (the file and the rows)."""
    rid = f"resp_secret_{os.getpid()}_{time.monotonic_ns()}"
    tool = {"type": "mcp", "server_label": "counter", "server_url": mcp_server.url, "authorization": "sk-SECRET-9"}
    key = secrets.new_key()
    registry = ToolRegistry()
    registry.add("counter", McpServerTool(connector(), mcp_server.url, secrets.request_headers(tool)))

    async def log_fact(kind: str, data: dict[str, Any]) -> None:
        async with db.begin() as connection:
            await event_log.append_fact(connection, rid, kind, data)

    async with db.begin() as connection:
        await event_log.append_fact(
            connection, rid, "request", {"tools": [secrets.redact(tool)], "sealed": secrets.seal(key, tool)}
        )
    calls = ToolCalls(rid, max_calls=2)
    result = await execute(calls, PlannedCall(0, "counter", "echo", '{"text": "ok"}'), registry, log_fact,
                           timeout_seconds=10)  # fmt: skip
    assert result.output == "ok"
    assert mcp_server.calls()[-1]["authorization"] == "Bearer sk-SECRET-9"
    async with db.connect() as connection:
        rows = (await connection.execute(sa.text("SELECT data FROM run_facts"))).scalars().all()
    assert rows and not any("sk-SECRET-9" in row for row in rows)
    if database_url.startswith("sqlite"):
        await db.dispose()
        path = Path(database_url.split("///", 1)[1])
        for file in path.parent.glob(path.name + "*"):
            assert b"sk-SECRET-9" not in file.read_bytes()
    assert json.dumps(await _facts(db, rid)).count("sk-SECRET-9") == 0


# -- tool specs ---------------------------------------------------------------------------------


def _check(tools: list[dict[str, Any]], **overrides: Any) -> list[Any]:
    options: dict[str, Any] = {"allowed_hosts": None, "secret_key": None, "background": False, "resolve": False}
    return check_server_tools(tools, **{**options, **overrides})


def test_server_tool_specs() -> None:
    mcp = {"type": "mcp", "server_label": "counter", "server_url": "http://127.0.0.1:9/mcp"}
    function = {"type": "function", "name": "f"}
    specs = _check([function, mcp, {"type": "code_interpreter", "container": {"type": "auto"}}])
    assert [spec.type for spec in specs] == ["mcp", "code_interpreter"]
    cases: list[tuple[list[dict[str, Any]], dict[str, Any], str, str]] = [
        ([{**mcp, "server_url": "ftp://x/mcp"}], {}, "tools[0].server_url", "http"),
        ([{**mcp, "server_url": "http://169.254.169.254/"}], {}, "tools[0].server_url", "link-local"),
        ([mcp], {"allowed_hosts": ["tools.internal"]}, "tools[0].server_url", "allowed MCP hosts"),
        ([{**mcp, "server_label": "bad label"}], {}, "tools[0].server_label", "Invalid mcp tool"),
        ([{**mcp, "bogus": 1}], {}, "tools[0].bogus", "Invalid mcp tool"),
        ([mcp, mcp], {}, "tools[1].server_label", "Duplicate server_label"),
        ([{**mcp, "authorization": "tok"}], {"background": True}, "tools[0].authorization", "SERVICE_SECRET_KEY"),
        ([{"type": "code_interpreter", "container": "../x"}], {}, "tools[0].container", "Invalid code_interpreter"),
    ]
    for tools, overrides, param, says in cases:
        with pytest.raises(ServerToolRefused, match=says) as raised:
            _check(tools, **overrides)
        assert raised.value.param == param, (tools, raised.value.param)
    # With a key, a background request may keep its secrets (sealed); foreground ones need no key.
    _check([{**mcp, "authorization": "tok"}], background=True, secret_key=secrets.new_key())
    _check([{**mcp, "authorization": "tok"}], background=False)


async def test_one_session_per_url_and_headers_is_reused(mcp_server: McpServer) -> None:
    mcp = connector()
    before = len(mcp_server.calls())
    await mcp.list_tools(mcp_server.url, {})
    first = next(iter(mcp._sessions.values()))
    result = await mcp.call(mcp_server.url, {}, "pick", {"color": "red"}, "key-reuse")
    assert result.output == "picked red" and len(mcp_server.calls()) == before + 1
    assert list(mcp._sessions.values()) == [first], "the listing's session served the call"
    await mcp.list_tools(mcp_server.url, {"Authorization": "Bearer other"})
    assert len(mcp._sessions) == 2, "other headers, other session"
    failed = await mcp.call(mcp_server.url, {}, "no_such_tool", {}, "key-missing")
    assert failed.error is not None
    await mcp.close()
    assert not mcp._sessions and first.task is not None and first.task.done()


async def test_an_idle_session_closes_itself(mcp_server: McpServer) -> None:
    mcp = McpConnector(timeout_seconds=10, max_output_bytes=4096, idle_seconds=0.3)
    await mcp.list_tools(mcp_server.url, {})
    held = next(iter(mcp._sessions.values()))
    assert held.task is not None
    await asyncio.wait_for(held.task, timeout=10)  # closed by itself, unused
    assert len(await mcp.list_tools(mcp_server.url, {})) >= 1  # a fresh session replaces it
    await mcp.close()
