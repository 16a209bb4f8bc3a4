"""Tools a request offers the model, and how it may choose among them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.protocol.base import Strict
from service.protocol.client_tools import CLIENT_FUNCTIONS

# Tool types OpenAI offers that need what this server does not have (a search index, the web, a desktop):
# accepted, echoed in the Response's `tools` as sent, and not offered to the model (the create response says so
# in `x-tools-not-offered`); SERVICE_REFUSE_UNSUPPORTED_TOOLS makes them a 400. An operator offers one by plugging
# a provider into service/tools (see SearchProvider).
UNOFFERED_TOOL_TYPES: dict[str, str] = {
    "web_search_preview": "web search",
    "web_search_preview_2025_03_11": "web search",
    "web_search": "web search",
    "web_search_2025_08_26": "web search",
    "file_search": "file search (vector stores)",
    "computer_use_preview": "computer use",
    "computer": "computer use",
    "image_generation": "image generation",
    "programmatic_tool_calling": "programmatic tool calling",
    # Every deferred function is offered up front, so there is nothing for a search to load.
    "tool_search": "tool search (deferred tools are offered up front)",
}


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


Callers = list[Literal["direct", "programmatic"]]


class FunctionTool(Strict):
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # Hints: a deferred function is offered up front (there is no tool search here); the rest are kept and echoed.
    defer_loading: bool | None = None
    output_schema: dict[str, Any] | None = None
    allowed_callers: Callers | None = None


class CustomTextFormat(Strict):
    type: Literal["text"]


class CustomGrammarFormat(Strict):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(Strict):
    """A tool whose input is free text, or text matching a Lark grammar or a regex."""

    type: Literal["custom"]
    name: ToolName
    description: str | None = None
    format: Annotated[CustomTextFormat | CustomGrammarFormat, Field(discriminator="type")] | None = None
    defer_loading: bool | None = None
    allowed_callers: Callers | None = None


class NamespaceTool(Strict):
    """A group of client-run functions: offered to the model as plain functions (their names must be unique
    across the request); the model's calls come back as ordinary function_call items."""

    type: Literal["namespace"]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    tools: Annotated[
        list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]], Field(min_length=1, max_length=512)
    ]


class ClientTool(BaseModel):
    """`shell`, `local_shell`, `apply_patch`: run by the client, offered to the model as a function of the SDK's
    action shape (service/protocol/client_tools.py); the other fields (environment, ...) are kept as sent."""

    model_config = ConfigDict(extra="allow")

    type: Literal["shell", "local_shell", "apply_patch"]
    allowed_callers: Callers | None = None

    @model_validator(mode="after")
    def _run_by_the_client(self) -> ClientTool:
        # A shell in an OpenAI-hosted container would come back as calls the client never meant to run.
        environment = getattr(self, "environment", None)
        kind = environment.get("type") if isinstance(environment, dict) else None
        if kind in ("container_auto", "container_reference"):
            raise ValueError(
                f"A shell in a hosted container (environment type '{kind}') is not run by this server; "
                "use a 'local' environment (the client runs the commands)."
            )
        return self


class UnofferedTool(BaseModel):
    """A tool of a type in UNOFFERED_TOOL_TYPES: its fields are kept as sent (echoed), never read."""

    model_config = ConfigDict(extra="allow")

    type: Literal[tuple(UNOFFERED_TOOL_TYPES)]  # type: ignore[valid-type]


class McpToolNames(Strict):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilter(Strict):
    always: McpToolNames | None = None
    never: McpToolNames | None = None


class McpTool(Strict):
    """A remote MCP server the service calls (service/tools/specs.py checks its URL against policy)."""

    type: Literal["mcp"]
    server_label: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    server_url: Annotated[str, Field(min_length=1, max_length=2048)]
    server_description: str | None = None
    allowed_tools: list[str] | McpToolNames | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None


class AutoContainer(Strict):
    type: Literal["auto"]
    file_ids: list[str] | None = None


class CodeInterpreterTool(Strict):
    type: Literal["code_interpreter"]
    container: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")] | AutoContainer


Tool = Annotated[
    FunctionTool | CustomTool | NamespaceTool | ClientTool | McpTool | CodeInterpreterTool | UnofferedTool,
    Field(discriminator="type"),
]

# Fields of a tool echoed only when the request set them (OpenAI's echo leaves them out).
_ECHO_IF_SET = ("defer_loading", "output_schema", "allowed_callers")


def echoed_tool(tool: BaseModel) -> dict[str, Any]:
    """A tool as the Response echoes it: as sent, less MCP secrets (headers, authorization)."""
    if isinstance(tool, UnofferedTool | ClientTool):
        return tool.model_dump(exclude_unset=True)
    dumped = tool.model_dump(exclude_none=False, exclude={"headers", "authorization"})
    if isinstance(tool, NamespaceTool):
        dumped["tools"] = [echoed_tool(inner) for inner in tool.tools]
    return _unset_hints_dropped(dumped)


def _unset_hints_dropped(dumped: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in dumped.items() if not (key in _ECHO_IF_SET and value is None)}


def model_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """The tools the model is offered: a namespace's functions as plain functions, client tools with their own
    items as functions (client_tools); tools this server does not run left out."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, UnofferedTool):
            continue
        if isinstance(tool, NamespaceTool):
            out += [_unset_hints_dropped(inner.model_dump()) for inner in tool.tools]
        elif isinstance(tool, ClientTool):
            out.append(dict(CLIENT_FUNCTIONS[tool.type]))
        else:
            out.append(_unset_hints_dropped(tool.model_dump()))
    return out


def not_offered(tools: list[Any]) -> list[tuple[int, str]]:
    """(index, type) of each tool accepted but not offered to the model."""
    return [(index, tool.type) for index, tool in enumerate(tools) if isinstance(tool, UnofferedTool)]


class FunctionToolChoice(Strict):
    type: Literal["function"]
    name: str


class CustomToolChoice(Strict):
    type: Literal["custom"]
    name: str


class ClientToolChoice(Strict):
    """Force a call to the request's `shell` or `apply_patch` tool (OpenAI's ToolChoiceShell/ApplyPatch)."""

    type: Literal["shell", "apply_patch"]


def constraint_choice(choice: Any) -> Any:
    """tool_choice as the constraint reads it: a client tool forced by type is the function it is offered as."""
    if isinstance(choice, ClientToolChoice):
        return {"type": "function", "name": choice.type}
    return choice if isinstance(choice, str) else choice.model_dump()


class McpToolChoice(Strict):
    """Force a call to an MCP server's tool (`name`), or to one of its tools."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class AllowedToolRef(Strict):
    type: Literal["function", "custom"]
    name: str


class AllowedToolsChoice(Strict):
    """Restrict the model to a subset of `tools`; `required` forces one of them."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef]


ToolChoice = (
    Literal["auto", "none", "required"]
    | Annotated[
        FunctionToolChoice | CustomToolChoice | ClientToolChoice | McpToolChoice | AllowedToolsChoice,
        Field(discriminator="type"),
    ]
)
