"""Which server-side tools a request may use, and the callable behind each.

`refuse_unoffered` names the tool types this server does not run (a 400 that says so); `ToolRegistry`
holds the callables of one run, addressed as (namespace, name): an MCP tool by its `server_label`,
the code interpreter as `python`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.protocol.tools import UNOFFERED_TOOL_TYPES
from service.tools.base import SearchProvider, ServerTool, ToolResult
from service.tools.mcp import McpConnector


class ToolNotOffered(ValueError):
    def __init__(self, index: int, kind: str) -> None:
        what = UNOFFERED_TOOL_TYPES.get(kind, kind)
        super().__init__(
            f"This server does not offer {what} (tool type '{kind}'). It runs 'mcp' and 'code_interpreter' "
            "tools, and calls 'function' and 'custom' tools through the client."
        )
        self.param = f"tools[{index}].type"


def refuse_unoffered(tools: Sequence[Any], providers: Mapping[str, SearchProvider] | None = None) -> None:
    """Raise ToolNotOffered for the first tool whose type this server cannot run (no provider plugged in)."""
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind in UNOFFERED_TOOL_TYPES and kind not in (providers or {}):
            raise ToolNotOffered(index, kind)


@dataclass
class McpServerTool:
    """One MCP server of a request: calls go to its URL with its headers, for the tools it allows."""

    connector: McpConnector
    server_url: str
    headers: Mapping[str, str]
    allowed_tools: frozenset[str] | None = None

    async def call(self, name: str, arguments: str, idempotency_key: str) -> ToolResult:
        if self.allowed_tools is not None and name not in self.allowed_tools:
            return ToolResult(output=None, error=f"Tool '{name}' is not in allowed_tools.")
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolResult(output=None, error=f"The arguments are not JSON: {exc}")
        if not isinstance(parsed, dict):
            return ToolResult(output=None, error="The arguments must be a JSON object.")
        result = await self.connector.call(self.server_url, self.headers, name, parsed, idempotency_key)
        return ToolResult(output=result.output, error=result.error)


def allowed_tool_names(spec: Mapping[str, Any]) -> frozenset[str] | None:
    """`allowed_tools` as a list or as {"tool_names": [...]}; None = every tool the server lists."""
    allowed = spec.get("allowed_tools")
    if allowed is None:
        return None
    if isinstance(allowed, dict):
        names = allowed.get("tool_names")
        return None if names is None else frozenset(names)
    return frozenset(allowed)


def approval_required(spec: Mapping[str, Any], name: str) -> bool:
    """`require_approval`: "always" | "never" | {"never": {"tool_names": [...]}} | {"always": {...}}.
    OpenAI's default is "always"."""
    rule = spec.get("require_approval", "always")
    if rule == "never":
        return False
    if rule == "always" or rule is None:
        return True
    if isinstance(rule, dict):
        never = (rule.get("never") or {}).get("tool_names") or []
        always = (rule.get("always") or {}).get("tool_names")
        if name in never:
            return False
        if always is not None:
            return name in always
        return True
    return True


@dataclass
class ToolRegistry:
    """The server-side tools of one run, by namespace (an MCP server_label, or `python`)."""

    tools: dict[str, ServerTool] = field(default_factory=dict)

    def add(self, namespace: str, tool: ServerTool) -> None:
        if namespace in self.tools:
            raise ValueError(f"two server-side tools share the namespace '{namespace}'")
        self.tools[namespace] = tool

    def get(self, namespace: str) -> ServerTool | None:
        return self.tools.get(namespace)
