"""Remote MCP servers over streamable HTTP (the official `mcp` SDK): listing tools, calling one (the URL policy is
mcp_policy.py).

Nothing here knows about HTTP requests to this service or the log. Errors a client caused (a bad or refused
`server_url`) raise `McpUrlRefused`; a server that cannot be reached, times out or does not speak MCP raises
`McpServerError` with one message for all of these (the detail goes to this server's own log), which becomes
an output item's `error`. Every error text that leaves the connector has the request's header values redacted
(`secrets.redact_text`). Connections go through `mcp_policy.guarded_http_client`, which applies
`McpAddressPolicy` to the addresses actually connected to; refused URLs are mcp_policy's `McpUrlRefused`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

from service.tools import secrets
from service.tools.mcp_policy import McpAddressPolicy, guarded_http_client

if TYPE_CHECKING:  # the SDK is imported when a session opens: it costs about a second at start-up
    from mcp import Client
    from mcp_types import CallToolResult, RequestParamsMeta

# The `_meta` key a tool call carries its idempotency key under; a retried call (after a crash) repeats it.
IDEMPOTENCY_META_KEY = "io.github.service/idempotency-key"


T = TypeVar("T")
log = logging.getLogger(__name__)
# What a client reads for every connection-level failure (see McpConnector._guard).
UNREACHABLE = "the MCP server could not be reached, or did not answer as an MCP server."


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

    def __init__(
        self,
        *,
        timeout_seconds: float,
        max_output_bytes: int,
        idle_seconds: float = 60.0,
        policy: McpAddressPolicy | None = None,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.max_output_bytes = max_output_bytes
        self.idle_seconds = idle_seconds
        # The composition root sets the server's own (service/app.py); this default is a loopback dev server's.
        self.policy = policy or McpAddressPolicy()
        self._sessions: dict[tuple[str, tuple[tuple[str, str], ...]], _HeldSession] = {}

    def _client(self, url: str, headers: Mapping[str, str]) -> Client:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        http = guarded_http_client(self.policy, timeout=self.timeout_seconds, headers=headers)
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

        return await self._guard(run(), "listing the tools", url, headers)

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
            from mcp import MCPError

            client, discard = await self._session(url, headers)
            meta = cast("RequestParamsMeta", {IDEMPOTENCY_META_KEY: idempotency_key})
            try:
                result = await client.call_tool(name, arguments, meta=meta)
            except MCPError as exc:  # the MCP server's own JSON-RPC error: its message is the tool's answer
                discard()
                return McpCallResult(output=None, error=f"Error calling '{name}': {exc.error.message[:500]}")
            except BaseException:
                discard()
                raise
            return self._result(result)

        try:
            result = await self._guard(run(), f"calling '{name}'", url, headers)
        except McpServerError as exc:
            return McpCallResult(output=None, error=str(exc))
        # The one place a call's error text leaves the connector: the client's secrets are taken out.
        return McpCallResult(
            result.output, secrets.redact_text(result.error, headers.values()) if result.error else None
        )

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

    async def _guard(self, work: Coroutine[Any, Any, T], what: str, url: str, headers: Mapping[str, str]) -> T:
        """Every failure to reach or talk to the server (refused, reset, timed out, TLS, not MCP, an address the
        policy refuses at connect time) reads the same to the client, so that listing cannot tell what
        answered on a port (nor does the text name the port); the detail goes to this server's log, without the
        client's secrets."""
        try:
            return await asyncio.wait_for(work, timeout=self.timeout_seconds)
        except Exception as exc:  # the SDK raises many kinds (httpx2, anyio groups, MCP errors)
            detail = f"timed out after {self.timeout_seconds:g}s" if isinstance(exc, TimeoutError) else _describe(exc)
            log.warning("MCP error %s of %s: %s", what, _origin(url), secrets.redact_text(detail, headers.values()))
            raise McpServerError(f"Error {what}: {UNREACHABLE}") from exc


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text[:500]
