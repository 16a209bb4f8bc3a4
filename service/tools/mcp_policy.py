"""Where MCP connections (and webhook deliveries) may go: the address policy, the check of a `server_url` at create
time, and the HTTP client whose every connection is checked again at connect time (`_GuardedBackend`: the addresses
actually connected to, so a name cannot resolve to a public address for the check and a private one for the
connection). A refused URL raises `McpUrlRefused`, which the create request's checks turn into a 400."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx2


class McpUrlRefused(ValueError):
    """The server_url is malformed or points where this service may not go."""


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
