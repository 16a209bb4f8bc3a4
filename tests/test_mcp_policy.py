"""MCP URL policy and secret handling (issue 37, items 8 and 10): where a server with API keys lets MCP tools
connect (never loopback or private addresses unless SERVICE_MCP_ALLOWED_HOSTS names them, checked again at connect
time), header values the HTTP client would refuse, and the client's secrets kept out of every error."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from service.tools import secrets
from service.tools.mcp import UNREACHABLE, McpConnector
from service.tools.mcp_policy import McpAddressPolicy, McpUrlRefused, check_server_url
from service.tools.specs import ServerToolRefused, check_server_tools
from tests.api_helpers import client_for, raw_events
from tests.conftest import ServerProcess, free_port
from tests.test_server_tools import BUDGET, SECRET, assert_secret_absent, calls_to, error_body, force, mcp_tool
from tests.test_tools_mcp import McpServer, mcp_server  # noqa: F401 (fixture)

REFUSED_HOSTS = [
    "127.0.0.1",
    "[::ffff:127.0.0.1]",
    "[::1]",
    "localhost",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",  # carrier-grade NAT
    "169.254.169.254",
    "[fc00::1]",
    "[fe80::1]",
    "0.0.0.0",
    "224.0.0.1",
    "[2002:7f00:1::1]",  # 6to4 of 127.0.0.1
    "[64:ff9b::a00:1]",  # NAT64 of 10.0.0.1
    "[::ffff:169.254.169.254]",
]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
def test_non_public_addresses_refused_when_private_is_refused(host: str) -> None:
    with pytest.raises(McpUrlRefused, match="non-public|link-local"):
        check_server_url(f"http://{host}:8000/mcp", None, private_refused=True)
    check_server_url(f"http://{host}:8000/mcp", [host.strip("[]")], private_refused=True)  # the operator's opt-in


def test_development_policy_keeps_loopback_and_private() -> None:
    for host in ("127.0.0.1", "localhost", "10.0.0.1", "[fc00::1]"):
        check_server_url(f"http://{host}:8000/mcp", None)
    for host in ("169.254.169.254", "[::ffff:169.254.169.254]", "0.0.0.0"):  # metadata: never, mapped or not
        with pytest.raises(McpUrlRefused):
            check_server_url(f"http://{host}/mcp", None)
    check_server_url("https://93.184.216.34/mcp", None, private_refused=True)  # public: allowed


async def test_private_refused_follows_keys_and_the_listen_address() -> None:
    async def yes() -> bool:
        return True

    async def no() -> bool:
        return False

    assert not await McpAddressPolicy().private_refused()
    assert not await McpAddressPolicy(listen_host="127.0.0.1", keys_configured=no).private_refused()
    assert await McpAddressPolicy(listen_host="127.0.0.1", keys_configured=yes).private_refused()
    assert await McpAddressPolicy(listen_host="0.0.0.0", keys_configured=no).private_refused()


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    """A TCP port on loopback that counts the connections it accepts."""
    accepted: list[int] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(1)
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(timeout=5)
    server.close()


async def test_connect_time_check_defeats_dns_rebinding(
    listener: tuple[int, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that resolved to a public address when checked and to loopback at connect time is refused
    at connect time, and nothing is contacted."""
    port, accepted = listener
    answers = iter(["93.184.216.34", "127.0.0.1", "127.0.0.1", "127.0.0.1"])
    real = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            address = next(answers)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    url = f"http://rebind.test:{port}/mcp"

    async def keys() -> bool:
        return True

    check_server_url(url, None, private_refused=True)  # passes: "public" at check time
    connector = McpConnector(timeout_seconds=5, max_output_bytes=100, policy=McpAddressPolicy(keys_configured=keys))
    with pytest.raises(Exception, match="Error listing the tools") as raised:
        await connector.list_tools(url, {})
    assert str(raised.value) == f"Error listing the tools: {UNREACHABLE}"
    assert accepted == []
    await connector.close()


def test_header_values_the_http_client_refuses_are_a_400_naming_the_field() -> None:
    base = {"type": "mcp", "server_label": "s", "server_url": "https://mcp.example.com/mcp"}
    options: dict[str, Any] = {"allowed_hosts": None, "secret_key": None, "background": False, "resolve": False}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"headers": {"X-Api-Key": "sk-123\r\nX-Evil: 1"}}, "tools[0].headers.X-Api-Key"),
        ({"headers": {"X-Api-Key": "sk-123\x00"}}, "tools[0].headers.X-Api-Key"),
        ({"headers": {"X-Api-Key": "sk-\x7f"}}, "tools[0].headers.X-Api-Key"),
        ({"headers": {"Bad Name": "v"}}, "tools[0].headers"),
        ({"headers": {"X\r\nY": "v"}}, "tools[0].headers"),
        ({"authorization": "sk-123\n"}, "tools[0].authorization"),
    ]
    for extra, param in cases:
        with pytest.raises(ServerToolRefused) as raised:
            check_server_tools([{**base, **extra}], **options)
        assert raised.value.param == param
        assert "sk-123" not in str(raised.value)
    check_server_tools([{**base, "headers": {"X-Api-Key": "sk-123"}, "authorization": "Bearer x"}], **options)


def test_redaction_covers_the_forms_a_secret_takes() -> None:
    values = secrets.request_headers({"authorization": "sk-TOKEN-1", "headers": {"X-Key": 'k"ey\n9'}}).values()
    text = (
        "Illegal header value b'Bearer sk-TOKEN-1' / sk-TOKEN-1 / sk-TOKEN-1%0A / "
        'b\'k"ey\\n9\' / "k\\"ey\\n9" / k%22ey%0A9'
    )
    redacted = secrets.redact_text(text, values)
    assert "sk-TOKEN-1" not in redacted and "ey" not in redacted.replace("[redacted]", ""), redacted


# -- through the real server ---------------------------------------------------------------------------------


def keyed(app_factory: Any, database_url: str, **env: str) -> ServerProcess:
    server: ServerProcess = app_factory(database_url, SERVICE_API_KEY="test-key", **BUDGET, **env).start()
    return server


def unmatched_requests(server: ServerProcess) -> int:
    """Requests answered on no route (an MCP client's POST /mcp would be one): a counter of the process, which an
    in-process server shares with those this process ran before (compare before and after)."""
    lines = httpx.get(server.url + "/metrics", timeout=30).text.splitlines()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines if 'route="unmatched"' in line and "_total" in line)


def test_a_server_with_keys_refuses_loopback_and_private_mcp_urls(
    app_factory: Any,
    database_url: str,
    listener: tuple[int, list[int]],
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server = keyed(app_factory, database_url)
    client = client_for(server.url)
    port, accepted = listener
    own = server.port
    unmatched = unmatched_requests(server)
    urls = [
        f"http://127.0.0.1:{own}/mcp",
        f"http://[::ffff:127.0.0.1]:{own}/mcp",
        f"http://localhost:{own}/mcp",
        f"http://127.0.0.1:{port}/mcp",
        f"http://localhost:{port}/mcp",
        "http://127.0.0.1:5432/mcp",
        "http://127.0.0.1:6379/mcp",
        "http://10.0.0.1/mcp",
        "http://169.254.169.254/latest/meta-data",
        mcp_server.url,
    ]
    before = len(mcp_server.calls())
    for url in urls:
        tool: Any = {"type": "mcp", "server_label": "probe", "server_url": url, "require_approval": "never"}
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(input="x", tools=[tool], max_output_tokens=2)
        error = error_body(raised.value)
        assert error["type"] == "invalid_request_error" and error["param"] == "tools[0].server_url", (url, error)
    assert accepted == [], "a refused server_url was contacted"
    assert unmatched_requests(server) == unmatched, "the server's own port was contacted"
    assert len(mcp_server.calls()) == before
    # A CR/LF in a header: a 400 naming the field, and the value is not echoed.
    crlf: Any = mcp_tool(mcp_server, headers={"X-Api-Key": SECRET + "\r\nX-Evil: 1"})
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(input="x", tools=[crlf], max_output_tokens=2)
    assert error_body(raised.value)["param"] == "tools[0].headers.X-Api-Key"
    assert SECRET not in json.dumps(error_body(raised.value))
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(input="x", tools=[mcp_tool(mcp_server, authorization=SECRET + "\n")])
    assert error_body(raised.value)["param"] == "tools[0].authorization"


def test_allowed_hosts_let_a_keyed_server_reach_loopback_and_every_failure_reads_the_same(
    app_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server = keyed(app_factory, database_url, SERVICE_MCP_ALLOWED_HOSTS="127.0.0.1")
    client = client_for(server.url)
    listed = client.responses.create(input="x", tools=[mcp_tool(mcp_server)], max_output_tokens=2)
    assert listed.output[0].type == "mcp_list_tools" and not listed.output[0].error
    assert {tool.name for tool in listed.output[0].tools} >= {"add", "deny"}
    # A closed port and a port speaking HTTP that is not MCP (this server's own): the same words.
    errors = []
    for url in (f"http://127.0.0.1:{free_port()}/mcp", f"http://127.0.0.1:{server.port}/mcp"):
        tool: Any = {"type": "mcp", "server_label": "probe", "server_url": url, "authorization": SECRET}
        failed = client.responses.create(input="x", tools=[tool], max_output_tokens=2)
        assert failed.output[0].type == "mcp_list_tools"
        errors.append(failed.output[0].error)
    assert errors[0] == errors[1] == f"Error listing the tools: {UNREACHABLE}"
    unlisted: Any = {**mcp_tool(mcp_server), "server_url": "http://localhost:9/mcp"}
    with pytest.raises(openai.BadRequestError):  # not named by the allow list, although it is the same address
        client.responses.create(input="x", tools=[unlisted])


def test_a_secret_quoted_by_a_failing_server_is_redacted_everywhere(
    app_factory: Any,
    database_url: str,
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = app_factory(database_url, **BUDGET).start()
    client = client_for(server.url)
    before = len(calls_to(mcp_server, "deny"))
    denied = client.responses.create(
        input="x",
        tools=[mcp_tool(mcp_server, authorization=SECRET, allowed_tools=["deny"])],
        tool_choice=force("deny"),
        max_tool_calls=1,
        max_output_tokens=60,
    )
    assert [call["authorization"] for call in calls_to(mcp_server, "deny")[before:]] == [f"Bearer {SECRET}"]
    call = next(item for item in denied.output if item.type == "mcp_call")
    assert call.error and "access denied for [redacted]" in str(call.error), call.error
    stored = httpx.get(f"{server.url}/v1/responses/{denied.id}", timeout=30).json()
    assert SECRET not in json.dumps([denied.model_dump(), stored, raw_events(server.url, denied.id)])
    server.stop()
    assert_secret_absent(database_url)
