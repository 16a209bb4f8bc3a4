"""Validate a request's server-side tool specs (`mcp`, `code_interpreter`) against this server's policy.

Wire shape (OpenAI's): `{"type": "mcp", "server_label", "server_url", "server_description", "allowed_tools"
(list or {tool_names}), "require_approval" ("always" | "never" | {"never"|"always": {"tool_names"}}),
"headers", "authorization"}` and `{"type": "code_interpreter", "container": "cntr_…" | {"type": "auto"}}`.
Problems raise `ServerToolRefused` with the offending `param`, meant to become a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.tools import secrets
from service.tools.mcp import McpUrlRefused, check_server_url

Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolNames(_Strict):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class ApprovalFilter(_Strict):
    always: ToolNames | None = None
    never: ToolNames | None = None


class McpToolSpec(_Strict):
    type: Literal["mcp"]
    server_label: Label
    server_url: Annotated[str, Field(min_length=1, max_length=2048)]
    server_description: str | None = None
    allowed_tools: list[str] | ToolNames | None = None
    require_approval: Literal["always", "never"] | ApprovalFilter | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None


class AutoContainer(_Strict):
    type: Literal["auto"]
    file_ids: list[str] | None = None


class CodeInterpreterSpec(_Strict):
    type: Literal["code_interpreter"]
    container: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")] | AutoContainer


class ServerToolRefused(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_server_tools(
    tools: Sequence[Any],
    *,
    allowed_hosts: Sequence[str] | None,
    secret_key: str | None,
    background: bool,
    resolve: bool = True,
) -> list[McpToolSpec | CodeInterpreterSpec]:
    """The server-side tools of a raw `tools` list, validated; function/custom tools are skipped."""
    checked: list[McpToolSpec | CodeInterpreterSpec] = []
    labels: set[str] = set()
    for index, raw in enumerate(tools):
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind not in ("mcp", "code_interpreter"):
            continue
        model: type[McpToolSpec] | type[CodeInterpreterSpec] = McpToolSpec if kind == "mcp" else CodeInterpreterSpec
        try:
            spec = model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = str(first["loc"][0]) if first["loc"] else "type"  # the top-level field at fault
            raise ServerToolRefused(f"Invalid {kind} tool: {first['msg']}.", f"tools[{index}].{where}") from None
        if isinstance(spec, McpToolSpec):
            if spec.server_label in labels:
                raise ServerToolRefused(
                    f"Duplicate server_label '{spec.server_label}'.", f"tools[{index}].server_label"
                )
            labels.add(spec.server_label)
            try:
                check_server_url(spec.server_url, allowed_hosts, resolve=resolve)
            except McpUrlRefused as exc:
                raise ServerToolRefused(str(exc), f"tools[{index}].server_url") from None
            if background and secrets.has_secrets(raw):
                try:
                    secrets.seal(secret_key, raw)
                except secrets.SecretsNeedKey as exc:
                    raise ServerToolRefused(str(exc), f"tools[{index}].authorization") from None
        checked.append(spec)
    return checked
