"""Remote MCP servers over streamable HTTP (the official `mcp` SDK): URL policy, listing tools, calling one.

Nothing here knows about HTTP requests to this service or the log. Errors a client caused (a bad or refused
`server_url`) raise `McpUrlRefused`; a server that cannot be reached, times out or does not speak MCP raises
`McpServerError` with one message for all of these (the detail goes to this server's own log), which becomes
an output item's `error`. Every error text that leaves the connector has the request's header values redacted
(`secrets.redact_text`). Connections go through `_GuardedBackend`, which applies `McpAddressPolicy` to the
addresses actually connected to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

from service.tools import secrets

if TYPE_CHECKING:  # the SDK is imported when a session opens: it costs about a second at start-up
    import httpx2
    from mcp import Client
    from mcp_types import CallToolResult, RequestParamsMeta

# The `_meta` key a tool call carries its idempotency key under; a retried call (after a crash) repeats it.
IDEMPOTENCY_META_KEY = "io.github.service/idempotency-key"


T = TypeVar("T")
log = logging.getLogger(__name__)
# What a client reads for every connection-level failure (see McpConnector._guard).
UNREACHABLE = "the MCP server could not be reached, or did not answer as an MCP server."


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


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class McpAddressPolicy:
    """Where MCP connections may go (docs/architecture.md, "MCP URL policy").

    - `allowed_hosts` (SERVICE_MCP_ALLOWED_HOSTS) set: only those hosts, wherever they resolve: the operator
      vouches for them, loopback and private addresses included.
    - Otherwise link-local (cloud metadata), multicast, unspecified and reserved addresses are always refused,
      and, when `private_refused()` (API keys configured, or listening beyond loopback), every address that is
      not globally routable too: loopback, RFC 1918 and ULA private, carrier-grade NAT, documentation ranges,
      and IPv6 forms embedding such an IPv4 address (mapped, 6to4, Teredo, NAT64).
    A development server (no key, loopback only) may reach loopback and private MCP servers, as its user can.
    """

    allowed_hosts: tuple[str, ...] = ()
    listen_host: str | None = None  # what `serve --host` listens on; None: loopback
    keys_configured: Callable[[], Awaitable[bool]] | None = None

    async def private_refused(self) -> bool:
        if self.listen_host is not None and not _is_loopback_name(self.listen_host):
            return True
        return self.keys_configured is not None and await self.keys_configured()

    def named(self, host: str) -> bool:
        """True when `host` is named by the allow list (its addresses are then not checked); McpUrlRefused when
        an allow list is set and does not name it."""
        if not self.allowed_hosts:
            return False
        if not any(_host_matches(host, pattern.strip().lower()) for pattern in self.allowed_hosts if pattern.strip()):
            raise McpUrlRefused(f"server_url host '{host}' is not in this server's allowed MCP hosts.")
        return True


def check_server_url(
    url: str,
    allowed_hosts: Sequence[str] | None,
    *,
    resolve: bool = True,
    private_refused: bool = False,
) -> None:
    """Refuse anything but http(s) URLs with a host, and hosts McpAddressPolicy refuses (a host name is
    resolved here to give a 400 early; every connection checks its addresses again, see _GuardedBackend)."""
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
    if McpAddressPolicy(tuple(allowed_hosts or ())).named(host):
        return
    for address in _addresses(host, resolve=resolve):
        check_address(host, address, private_refused=private_refused)


def check_address(host: str, address: IpAddress, *, private_refused: bool) -> None:
    """McpUrlRefused for an address the policy refuses (the address and the IPv4 one it embeds, if any)."""
    for one in (address, *_embedded_ipv4(address)):
        if one.is_link_local or one.is_multicast or one.is_unspecified or one.is_reserved:
            raise McpUrlRefused(f"server_url host '{host}' is a link-local, metadata or reserved address.")
        if private_refused and not one.is_global:
            raise McpUrlRefused(
                f"server_url host '{host}' is a loopback, private or otherwise non-public address, "
                "which this server does not connect MCP tools to."
            )


def _embedded_ipv4(address: IpAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [one for one in found if one is not None]


def _is_loopback_name(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _addresses(host: str, *, resolve: bool) -> list[IpAddress]:
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
    return _parsed(infos)


def _parsed(infos: Sequence[tuple[Any, ...]]) -> list[IpAddress]:
    found: list[IpAddress] = []
    for info in infos:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        except ValueError:
            continue
        if address not in found:
            found.append(address)
    return found


class _GuardedBackend:
    """An httpcore2 network backend that resolves a host once, checks every address against the policy, and
    connects to a checked address (so a name cannot resolve to a public address for the check and a private
    one for the connection). TLS still verifies and sends SNI for the URL's name (httpcore2 passes the
    origin's host to start_tls), and the Host header is the URL's."""

    def __init__(self, policy: McpAddressPolicy) -> None:
        import httpcore2

        self.policy = policy
        self.inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> Any:
        import httpcore2

        name = host.lower().strip("[]")
        if self.policy.named(name):
            targets = [host]
        else:
            private_refused = await self.policy.private_refused()
            addresses = _addresses(name, resolve=False)
            if not addresses:
                loop = asyncio.get_running_loop()
                try:
                    infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
                except OSError as exc:
                    raise httpcore2.ConnectError(f"could not resolve {name}: {exc}") from exc
                addresses = _parsed(infos)
            for address in addresses:
                check_address(name, address, private_refused=private_refused)
            targets = [str(address) for address in addresses]
        failure: Exception = httpcore2.ConnectError(f"no address for {name}")
        for target in targets:
            try:
                return await self.inner.connect_tcp(
                    target, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except httpcore2.ConnectError as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise McpUrlRefused("MCP connections do not use unix sockets.")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_http_client(
    policy: McpAddressPolicy, *, timeout: float, headers: Mapping[str, str] | None = None
) -> httpx2.AsyncClient:
    """An HTTP client whose every connection goes through `policy` at connect time (`_GuardedBackend`): MCP
    sessions and webhook deliveries alike. No redirects are followed (a redirect is a new, unchecked URL)."""
    import httpcore2
    import httpx2

    # trust_env=False: an HTTP(S)_PROXY of the environment would connect for us, past the address checks.
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    pool = transport._pool  # noqa: SLF001 (httpx2 takes no network backend; the same pool, guarded)
    transport._pool = httpcore2.AsyncConnectionPool(  # noqa: SLF001
        ssl_context=pool._ssl_context,  # noqa: SLF001
        network_backend=cast("httpcore2.AsyncNetworkBackend", _GuardedBackend(policy)),
    )
    return httpx2.AsyncClient(
        headers=dict(headers or {}), timeout=timeout, transport=transport, trust_env=False, follow_redirects=False
    )


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
