"""What runs server-side tools, built once at start-up (service/app.py) and handed to both sides of the agent
loop: the commands (at create: tools checked and listed, secrets kept, an `auto` container made; at delete: the
response's container removed) and the run supervisor (executing calls).

Nothing writes into it afterwards; the one thing that changes is `McpSecrets`, through its own methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.config import Settings
from service.containers import Containers
from service.tools import sandbox_from_settings
from service.tools.mcp import McpConnector
from service.tools.mcp_policy import McpAddressPolicy
from service.tools.sandbox import Sandbox

Headers = dict[str, str]  # HTTP headers for one MCP server


class McpSecrets:
    """Foreground runs' MCP headers (server_label -> headers), in memory only: a foreground run does not outlive
    its process. A background run's are sealed in its request fact instead (service/tools/secrets.py).

    Put when a response is created, read when its calls are made, popped when its create is refused or the run
    ends. Never logged."""

    def __init__(self) -> None:
        self._by_response: dict[str, dict[str, Headers]] = {}

    def put(self, response_id: str, headers: dict[str, Headers]) -> None:
        self._by_response[response_id] = headers

    def get(self, response_id: str, server_label: str) -> Headers | None:
        return self._by_response.get(response_id, {}).get(server_label)

    def pop(self, response_id: str) -> None:
        self._by_response.pop(response_id, None)


@dataclass(frozen=True)
class ToolRuntime:
    settings: Settings
    connector: McpConnector  # held MCP sessions, with the server's URL policy
    sandbox: Sandbox  # the code interpreter's
    # Why the code interpreter cannot run here (service.tools.report_sandbox), None when it can.
    sandbox_unavailable: str | None = None
    containers: Containers | None = None  # who may use which container; None: no store (tests of the loop alone)
    secrets: McpSecrets = field(default_factory=McpSecrets)

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        policy: McpAddressPolicy | None = None,
        sandbox: Sandbox | None = None,
        sandbox_unavailable: str | None = None,
        containers: Containers | None = None,
    ) -> ToolRuntime:
        """The server's tools from its settings. `policy`: where MCP connections may go (McpConnector's default is
        a loopback development server's); `sandbox`: by default the one `settings` describe."""
        connector = McpConnector(
            timeout_seconds=settings.tool_timeout_seconds, max_output_bytes=settings.tool_output_bytes, policy=policy
        )
        sandbox = sandbox if sandbox is not None else sandbox_from_settings(settings)
        return cls(settings, connector, sandbox, sandbox_unavailable, containers)

    async def close(self) -> None:
        """Close held MCP sessions."""
        await self.connector.close()
