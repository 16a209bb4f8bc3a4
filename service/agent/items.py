"""Output items of server-side tool calls (`mcp_call`, `mcp_approval_request`, `code_interpreter_call`,
`mcp_list_tools`): which call the model addressed, and the items as they start (typed by
service/protocol/output.py, the official SDK's shapes).

The model addresses an MCP tool as `SERVER_LABEL.NAME` and the code interpreter as `python`; function
tools keep their bare names (a function name cannot contain a dot), so the recipient alone decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from service.protocol.output import CodeInterpreterCall, McpApprovalRequest, McpCall, McpCallError, McpListTools
from service.tools.registry import approval_required

PYTHON = "python"
ServerKind = Literal["mcp_call", "mcp_approval_request", "code_interpreter_call"]
# A response's output item ids for these kinds.
ITEM_PREFIX: dict[str, str] = {
    "mcp_call": "mcp",
    "mcp_approval_request": "mcpr",
    "code_interpreter_call": "ci",
    "mcp_list_tools": "mcpl",
}


@dataclass(frozen=True)
class ServerCall:
    kind: ServerKind
    namespace: str  # server_label, or "python"
    name: str  # the MCP tool's name ("" for python)


def classify(recipient: str | None, tools: list[dict[str, Any]]) -> ServerCall | None:
    """The server-side call a recipient addresses in a response offering `tools`, or None (a client tool)."""
    if not recipient:
        return None
    if recipient == PYTHON and any(t.get("type") == "code_interpreter" for t in tools):
        return ServerCall("code_interpreter_call", PYTHON, "")
    label, dot, name = recipient.partition(".")
    if not dot:
        return None
    spec = next((t for t in tools if t.get("type") == "mcp" and t.get("server_label") == label), None)
    if spec is None:
        return None
    needs_approval = approval_required(spec, name)
    return ServerCall("mcp_approval_request" if needs_approval else "mcp_call", label, name)


def auto_container_id(response_id: str) -> str:
    """A response's `auto` container: derived from its (random, server-minted) id, so a resumed run finds
    the same one; its `containers` row is written in the response's create transaction."""
    return "cntr_" + response_id.removeprefix("resp_")


def named_container(tools: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The container a request's code_interpreter tool names (its index in `tools`, its id), if any."""
    for index, tool in enumerate(tools):
        if tool.get("type") == "code_interpreter" and isinstance(tool.get("container"), str):
            return index, str(tool["container"])
    return None


def wants_auto_container(tools: list[dict[str, Any]]) -> bool:
    return any(t.get("type") == "code_interpreter" and isinstance(t.get("container"), dict) for t in tools)


def container_id(response_id: str, tools: list[dict[str, Any]]) -> str:
    """The code interpreter's container: the one the request names (checked to be its project's, live
    container at create and again when code runs), else the response's own `auto` one."""
    named = named_container(tools)
    return named[1] if named is not None else auto_container_id(response_id)


def new_item(
    call: ServerCall, item_id: str, response_id: str, tools: list[dict[str, Any]]
) -> McpCall | McpApprovalRequest | CodeInterpreterCall:
    if call.kind == "code_interpreter_call":
        return CodeInterpreterCall(
            id=item_id,
            type="code_interpreter_call",
            status="in_progress",
            code="",
            container_id=container_id(response_id, tools),
            outputs=None,
        )
    if call.kind == "mcp_approval_request":
        return McpApprovalRequest(
            id=item_id, type="mcp_approval_request", server_label=call.namespace, name=call.name, arguments=""
        )
    return McpCall(
        id=item_id,
        type="mcp_call",
        server_label=call.namespace,
        name=call.name,
        arguments="",
        status="in_progress",
        output=None,
        error=None,
        approval_request_id=None,
    )


def mcp_error(message: str) -> McpCallError:
    """An MCP call's `error` in the SDK's shape (McpToolCallError)."""
    return McpCallError(type="mcp_protocol_error", code=-32000, message=message)


def list_tools_item(item_id: str, listed: dict[str, Any]) -> McpListTools:
    return McpListTools(
        id=item_id,
        type="mcp_list_tools",
        server_label=listed["server_label"],
        tools=listed.get("tools") or [],
        error=listed.get("error"),
    )
