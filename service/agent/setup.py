"""Server-side tools at request time: validate them, list each MCP server's tools, and say what the run
needs (the tools the model sees, the `mcp_list_tools` items, an approved call, the secrets).

Nothing here is logged in clear: `headers`/`authorization` stay in memory for the run, and a background run
keeps them sealed with SERVICE_SECRET_KEY (service/tools/secrets.py) so it can resume after a crash.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.agent.runtime import ToolRuntime
from service.errors import FailedDependency, InvalidRequest
from service.tools import secrets
from service.tools.mcp import McpServerError
from service.tools.registry import allowed_tool_names
from service.tools.specs import ServerToolRefused, check_server_tools


@dataclass
class PreparedTools:
    model_tools: list[dict[str, Any]] = field(default_factory=list)  # appended to the prompt's tools
    listed: list[dict[str, Any]] = field(default_factory=list)  # new mcp_list_tools items
    approved_call: dict[str, Any] | None = None  # an mcp_approval_response that approves a call
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # server_label -> HTTP headers (memory)
    sealed: dict[str, str] = field(default_factory=dict)  # server_label -> sealed secrets (background runs)


def server_specs(tools: Sequence[Any]) -> list[dict[str, Any]]:
    return [tool for tool in tools if isinstance(tool, dict) and tool.get("type") in ("mcp", "code_interpreter")]


async def prepare(
    raw_tools: list[dict[str, Any]],
    runtime: ToolRuntime,
    *,
    history: list[dict[str, Any]],
    input_items: list[dict[str, Any]],
    background: bool,
    project: str,
    reserved_labels: frozenset[str] = frozenset(),
    forced_label: str | None = None,
) -> PreparedTools:
    """Raises InvalidRequest (400) for what the client got wrong; an unreachable server is an item error, or a
    424 (FailedDependency) when the request forces a call to it (`forced_label`): nothing else can go on.
    A container the code interpreter names must be `project`'s, live (NotFound otherwise). `reserved_labels`:
    the server labels the model's format gives the code interpreter (ChatFormat.reserved_server_labels)."""
    settings, connector, sandbox_unavailable = runtime.settings, runtime.connector, runtime.sandbox_unavailable
    containers = runtime.containers
    specs = server_specs(raw_tools)
    prepared = PreparedTools()
    _find_approval(prepared, history, input_items)
    if not specs:
        if prepared.approved_call is not None:
            raise InvalidRequest("Approving an MCP call needs its mcp tool in 'tools'.", param="tools")
        return prepared
    try:
        await asyncio.to_thread(  # a thread: checking a server_url resolves its host name
            functools.partial(
                check_server_tools,
                raw_tools,
                allowed_hosts=settings.mcp_hosts(),
                secret_key=settings.secret_key,
                background=background,
                private_refused=await connector.policy.private_refused(),
            )
        )
    except ServerToolRefused as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    interpreters = [i for i, spec in enumerate(raw_tools) if spec.get("type") == "code_interpreter"]
    if len(interpreters) > 1:
        raise InvalidRequest("Only one code_interpreter tool per request.", param=f"tools[{interpreters[1]}]")
    earlier = {i["server_label"]: i for i in history if i.get("type") == "mcp_list_tools" and not i.get("error")}
    for index, spec in enumerate(raw_tools):
        if spec.get("type") == "code_interpreter":
            if sandbox_unavailable is not None:
                raise InvalidRequest(
                    f"This server cannot run the code interpreter: {sandbox_unavailable}",
                    param=f"tools[{index}].type",
                    code="unsupported_tool",
                )
            if isinstance(spec.get("container"), str) and containers is not None:
                await containers.check(spec["container"], f"tools[{index}].container", project=project)
            limit = settings.code_interpreter_max_code_chars
            prepared.model_tools.append({"type": "python", **({"max_code_chars": limit} if limit else {})})
            continue
        if spec.get("type") != "mcp":
            continue
        label = spec["server_label"]
        if label in reserved_labels and interpreters:
            # e.g. chat templates name the code interpreter `code_interpreter.python` (chat_template_server_tools)
            raise InvalidRequest(
                f"With a code_interpreter tool, server_label '{label}' is reserved on this model.",
                param=f"tools[{index}].server_label",
            )
        headers = secrets.request_headers(spec)
        if headers:
            prepared.headers[label] = headers
            # Sealed when a background run needs them after a crash, or whenever a key lets another replica
            # that claims the run use them.
            if background or settings.secret_key:
                prepared.sealed[label] = secrets.seal(settings.secret_key, spec)
        allowed = allowed_tool_names(spec)
        if label in earlier:  # listed by an earlier turn of this conversation: not listed again
            tools = earlier[label]["tools"]
        else:
            try:
                infos = await connector.list_tools(spec["server_url"], headers)
            except McpServerError as exc:
                if label == forced_label:
                    raise FailedDependency(
                        f"Error retrieving tool list from MCP server: '{label}'. {exc}",
                        param="tools",
                        code="http_error",  # OpenAI's code for this error
                    ) from None
                prepared.listed.append({"server_label": label, "tools": [], "error": str(exc)})
                continue
            tools = [info.as_item() for info in infos if allowed is None or info.name in allowed]
            prepared.listed.append({"server_label": label, "tools": tools, "error": None})
        for tool in tools:
            if allowed is not None and tool["name"] not in allowed:
                continue
            prepared.model_tools.append(
                {
                    "type": "mcp_function",
                    "namespace": label,
                    "server_description": spec.get("server_description"),
                    "name": tool["name"],
                    "description": tool.get("description"),
                    "parameters": tool.get("input_schema"),
                }
            )
    if prepared.approved_call is not None:
        labels = {s["server_label"] for s in specs if s.get("type") == "mcp"}
        if prepared.approved_call["server_label"] not in labels:
            raise InvalidRequest(
                f"The approved call's server '{prepared.approved_call['server_label']}' is not in 'tools'.",
                param="tools",
            )
    return prepared


def _find_approval(prepared: PreparedTools, history: list[dict[str, Any]], input_items: list[dict[str, Any]]) -> None:
    """An `mcp_approval_response` must answer an approval request of the history; an approving one is run."""
    requests = {i.get("id"): i for i in history if i.get("type") == "mcp_approval_request"}
    for index, item in enumerate(input_items):
        if item.get("type") != "mcp_approval_response":
            continue
        request = requests.get(item["approval_request_id"])
        if request is None:
            raise InvalidRequest(
                f"No mcp_approval_request with id '{item['approval_request_id']}' in this conversation.",
                param=f"input[{index}].approval_request_id",
                code="invalid_value",
            )
        if item.get("approve"):
            if prepared.approved_call is not None:
                raise InvalidRequest("Approve one MCP call per request.", param=f"input[{index}]", code="invalid_value")
            prepared.approved_call = {
                "server_label": request["server_label"],
                "name": request["name"],
                "arguments": request.get("arguments") or "",
                "approval_request_id": request["id"],
            }
