"""Remote MCP servers over streamable HTTP (the official `mcp` SDK): URL policy, listing tools, calling one.

Nothing here knows about HTTP requests to this service or the log. Errors a client caused (a bad or refused
`server_url`) raise `McpUrlRefused`; a server that cannot be reached, times out or answers with an error
raises `McpServerError`, whose message becomes an output item's `error`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the SDK is imported when a session opens: it costs about a second at start-up
    from mcp import Client
    from mcp_types import CallToolResult, RequestParamsMeta

# The `_meta` key a tool call carries its idempotency key under; a retried call (after a crash) repeats it.
IDEMPOTENCY_META_KEY = "io.github.service/idempotency-key"


T = TypeVar("T")


class McpUrlRefused(ValueError):
    """The server_url is malformed or points where this service may not go."""


class McpServerError(RuntimeError):
    """The MCP server could not be reached, timed out, or answered with an error."""


@dataclass(frozen=True)
class McpToolInfo:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None

    def as_item(self) -> dict[str, Any]:
        """The shape of one entry of an `mcp_list_tools` item's `tools`."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
        }


@dataclass(frozen=True)
class McpCallResult:
    output: str | None
    error: str | None


def check_server_url(url: str, allowed_hosts: Sequence[str] | None, *, resolve: bool = True) -> None:
    """Refuse anything but http(s) URLs with a host; with an allow list, only its hosts (`*.example.com`
    matches subdomains). Without one, link-local, metadata, multicast and unspecified addresses are refused,
    also when a host name resolves to them (loopback and private networks are allowed: operators restrict
    those with SERVICE_MCP_ALLOWED_HOSTS)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise McpUrlRefused("server_url must be an http:// or https:// URL.")
    host = (parts.hostname or "").lower()
    if not host:
        raise McpUrlRefused("server_url has no host.")
    if parts.username or parts.password:
        raise McpUrlRefused("server_url must not carry credentials; use 'authorization' or 'headers'.")
    try:
        _ = parts.port
    except ValueError as exc:
        raise McpUrlRefused("server_url has an invalid port.") from exc
    if allowed_hosts:
        if not any(_host_matches(host, pattern.strip().lower()) for pattern in allowed_hosts if pattern.strip()):
            raise McpUrlRefused(f"server_url host '{host}' is not in this server's allowed MCP hosts.")
        return
    for address in _addresses(host, resolve=resolve):
        if address.is_link_local or address.is_multicast or address.is_unspecified or address.is_reserved:
            raise McpUrlRefused(f"server_url host '{host}' is a link-local, metadata or reserved address.")


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _addresses(host: str, *, resolve: bool) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    if host == "metadata.google.internal":
        return [ipaddress.ip_address("169.254.169.254")]
    if not resolve:
        return []
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return []  # unreachable names fail later, as the item's error
    found = []
    for info in infos:
        try:
            found.append(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
        except ValueError:
            continue
    return found


@dataclass
class _HeldSession:
    """A live MCP client session, held open by its own task (anyio scopes must exit in the task that
    entered them); operations of any task use it until it is closed."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    client: Client | None = None
    error: BaseException | None = None
    last_used: float = 0.0
    task: asyncio.Task[None] | None = None


class McpConnector:
    """Keeps one streamable-HTTP session per (url, headers), closed after `idle_seconds` unused or after an
    error; headers are never logged."""

    def __init__(self, *, timeout_seconds: float, max_output_bytes: int, idle_seconds: float = 60.0) -> None:
        self.timeout_seconds = timeout_seconds
        self.max_output_bytes = max_output_bytes
        self.idle_seconds = idle_seconds
        self._sessions: dict[tuple[str, tuple[tuple[str, str], ...]], _HeldSession] = {}

    def _client(self, url: str, headers: Mapping[str, str]) -> Client:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=dict(headers), timeout=self.timeout_seconds)
        return Client(streamable_http_client(url, http_client=http), read_timeout_seconds=self.timeout_seconds)

    async def _hold(self, held: _HeldSession, url: str, headers: Mapping[str, str]) -> None:
        try:
            async with self._client(url, headers) as client:
                held.client = client
                held.ready.set()
                while True:  # until asked to close, or unused for idle_seconds
                    try:
                        await asyncio.wait_for(held.closing.wait(), timeout=self.idle_seconds)
                        break
                    except TimeoutError:
                        if time.monotonic() - held.last_used >= self.idle_seconds:
                            break
        except BaseException as exc:  # noqa: BLE001 (kept for the operation that waits for the session)
            held.error = exc
        finally:
            held.client = None
            held.ready.set()

    async def _session(self, url: str, headers: Mapping[str, str]) -> tuple[Client, Callable[[], None]]:
        """A live session and the function that discards it (after an error)."""
        now = time.monotonic()
        for key, idle in list(self._sessions.items()):
            if now - idle.last_used > self.idle_seconds:
                idle.closing.set()
                del self._sessions[key]
        key = (url, tuple(sorted(headers.items())))
        held = self._sessions.get(key)
        if held is None or (held.task is not None and held.task.done()):
            held = _HeldSession(last_used=now)
            held.task = asyncio.create_task(self._hold(held, url, headers), name=f"mcp-session {_origin(url)}")
            self._sessions[key] = held
        await held.ready.wait()

        def discard() -> None:
            held.closing.set()
            if self._sessions.get(key) is held:
                del self._sessions[key]

        if held.client is None:
            discard()
            raise held.error or McpServerError("The MCP session closed.")
        held.last_used = time.monotonic()
        return held.client, discard

    async def close(self) -> None:
        """Close every held session (at shutdown)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for held in sessions:
            held.closing.set()
        await asyncio.gather(*(h.task for h in sessions if h.task is not None), return_exceptions=True)

    async def list_tools(self, url: str, headers: Mapping[str, str]) -> list[McpToolInfo]:
        async def run() -> list[McpToolInfo]:
            for attempt in (1, 2):  # listing is safe to repeat: once more on a fresh session if a held one failed
                client, discard = await self._session(url, headers)
                try:
                    return await self._list(client)
                except Exception:
                    discard()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

        return await self._guard(run(), f"listing the tools of {_origin(url)}")

    @staticmethod
    async def _list(client: Client) -> list[McpToolInfo]:
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                annotations = tool.annotations.model_dump(exclude_none=True) if tool.annotations else None
                tools.append(McpToolInfo(tool.name, tool.description, dict(tool.input_schema), annotations))
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(
        self, url: str, headers: Mapping[str, str], name: str, arguments: dict[str, Any], idempotency_key: str
    ) -> McpCallResult:
        """Call one tool; a tool-level error (isError) is a result with `error`, not an exception. A failed
        call is not repeated here (it may have run); its session is discarded."""

        async def run() -> McpCallResult:
            client, discard = await self._session(url, headers)
            meta = cast("RequestParamsMeta", {IDEMPOTENCY_META_KEY: idempotency_key})
            try:
                result = await client.call_tool(name, arguments, meta=meta)
            except BaseException:
                discard()
                raise
            return self._result(result)

        try:
            return await self._guard(run(), f"calling '{name}' on {_origin(url)}")
        except McpServerError as exc:
            return McpCallResult(output=None, error=str(exc))

    def _result(self, result: CallToolResult) -> McpCallResult:
        from mcp_types import TextContent

        parts: list[str] = []
        for block in result.content:
            if isinstance(block, TextContent):
                parts.append(block.text)
            else:
                parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
        text = "\n".join(parts)
        if not parts and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        encoded = text.encode("utf-8", "replace")
        if len(encoded) > self.max_output_bytes:
            text = encoded[: self.max_output_bytes].decode("utf-8", "ignore") + "\n[output truncated]"
        if result.is_error:
            return McpCallResult(output=None, error=text or "The MCP tool reported an error.")
        return McpCallResult(output=text, error=None)

    async def _guard(self, work: Coroutine[Any, Any, T], what: str) -> T:
        try:
            return await asyncio.wait_for(work, timeout=self.timeout_seconds)
        except TimeoutError as exc:
            raise McpServerError(f"Timed out after {self.timeout_seconds:g}s {what}.") from exc
        except McpServerError:
            raise
        except Exception as exc:  # the SDK raises many kinds (httpx2, anyio groups, MCP errors)
            raise McpServerError(f"Error {what}: {_describe(exc)}") from exc


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text[:500]
