"""Validate a request's server-side tool specs (`mcp`, `code_interpreter`) against this server's policy.

Wire shape (OpenAI's): `{"type": "mcp", "server_label", "server_url", "server_description", "allowed_tools"
(list or {tool_names}), "require_approval" ("always" | "never" | {"never"|"always": {"tool_names"}}),
"headers", "authorization"}` and `{"type": "code_interpreter", "container": "cntr_…" | {"type": "auto"}}`.
Problems raise `ServerToolRefused` with the offending `param`, meant to become a 400.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.tools import secrets
from service.tools.mcp_policy import McpUrlRefused, check_server_url

# An HTTP field name (RFC 9110 token), and a value of printable ASCII: CR/LF would split the request, and the
# HTTP client refuses other control characters (NUL, DEL, ...) and non-ASCII, with an error quoting the value.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_UNSENDABLE = re.compile(r"[^\x20-\x7e]")

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
    private_refused: bool = False,
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
            _check_headers(spec, index)
            try:
                check_server_url(spec.server_url, allowed_hosts, resolve=resolve, private_refused=private_refused)
            except McpUrlRefused as exc:
                raise ServerToolRefused(str(exc), f"tools[{index}].server_url") from None
            if background and secrets.has_secrets(raw):
                try:
                    secrets.seal(secret_key, raw)
                except secrets.SecretsNeedKey as exc:
                    raise ServerToolRefused(str(exc), f"tools[{index}].authorization") from None
        checked.append(spec)
    return checked


def _check_headers(spec: McpToolSpec, index: int) -> None:
    """A 400 naming the field for a header name or value the HTTP client would refuse; the value is not quoted."""
    for name, value in (spec.headers or {}).items():
        if not _HEADER_NAME.fullmatch(name):
            raise ServerToolRefused(
                "A header name must be an HTTP token (letters, digits and !#$%&'*+-.^_`|~).", f"tools[{index}].headers"
            )
        if _UNSENDABLE.search(value):
            raise ServerToolRefused(
                f"The value of header '{name}' contains a control character (CR, LF, NUL, ...) or non-ASCII.",
                f"tools[{index}].headers.{name}",
            )
    if spec.authorization is not None and _UNSENDABLE.search(spec.authorization):
        raise ServerToolRefused(
            "authorization contains a control character (CR, LF, NUL, ...) or non-ASCII.",
            f"tools[{index}].authorization",
        )
