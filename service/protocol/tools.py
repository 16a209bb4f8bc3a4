"""Tools a request offers the model, and how it may choose among them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from service.protocol.base import Strict

# Tool types OpenAI offers that need what this server does not have (a search index, the web, a desktop);
# an operator offers one by plugging a provider into service/tools (see SearchProvider).
UNOFFERED_TOOL_TYPES: dict[str, str] = {
    "web_search_preview": "web search",
    "web_search_preview_2025_03_11": "web search",
    "web_search": "web search",
    "web_search_2025_08_26": "web search",
    "file_search": "file search (vector stores)",
    "computer_use_preview": "computer use",
    "image_generation": "image generation",
    "local_shell": "a local shell",
}
# Run by the server (service/tools: MCP client, sandboxed interpreter; service/tool_steps: the agent loop).
SERVER_TOOL_TYPES: dict[str, str] = {"mcp": "remote MCP servers", "code_interpreter": "the code interpreter"}


def unoffered_tool(tools: object) -> tuple[int, str] | None:
    """The index and message of the first tool in a raw `tools` list this server cannot run."""
    if not isinstance(tools, list):
        return None
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            continue
        if kind in UNOFFERED_TOOL_TYPES:
            return index, (
                f"This server does not offer {UNOFFERED_TOOL_TYPES[kind]} (tool type '{kind}'). "
                "It calls 'function' and 'custom' tools through the client."
            )
    return None


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class FunctionTool(Strict):
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


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


Tool = Annotated[FunctionTool | CustomTool | McpTool | CodeInterpreterTool, Field(discriminator="type")]


class FunctionToolChoice(Strict):
    type: Literal["function"]
    name: str


class CustomToolChoice(Strict):
    type: Literal["custom"]
    name: str


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
    | Annotated[FunctionToolChoice | CustomToolChoice | McpToolChoice | AllowedToolsChoice, Field(discriminator="type")]
)
