"""Input and output items (messages, function calls and outputs, reasoning) and their SQL-facing text."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from service.protocol.base import Strict

ConversationItem = dict[str, Any]

# Ids are identifiers: printable ASCII, no spaces, and short enough for the item_id column.
ItemId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]+$")]


class TextPart(Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(Strict):
    type: Literal["message"] = "message"
    id: ItemId | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    status: str | None = None


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    id: ItemId | None = None
    call_id: str
    name: str
    arguments: str
    status: str | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    id: ItemId | None = None
    call_id: str
    output: str
    status: str | None = None


class CustomToolCallItem(Strict):
    type: Literal["custom_tool_call"]
    id: str | None = None
    call_id: str
    name: str
    input: str
    status: str | None = None


class CustomToolCallOutputItem(Strict):
    type: Literal["custom_tool_call_output"]
    id: str | None = None
    call_id: str
    output: str
    status: str | None = None


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    id: ItemId | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: None = None
    status: str | None = None


class McpApprovalResponseItem(Strict):
    """The client's answer to an `mcp_approval_request` of the previous response."""

    type: Literal["mcp_approval_response"]
    id: str | None = None
    approval_request_id: str
    approve: bool
    reason: str | None = None


InputItem = Annotated[
    MessageItem
    | McpApprovalResponseItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ReasoningItem,
    Field(discriminator="type"),
]


ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "mcp_approval_response": "mcpr",
}


def item_text(item: ConversationItem) -> str | None:
    """Plain text of an item for the SQL-facing `text` column."""
    kind = item.get("type")
    if kind in ("message", "reasoning"):
        return "".join(part.get("text", "") for part in item.get("content") or [])
    if kind == "function_call":
        return f"{item.get('name')}({item.get('arguments')})"
    if kind == "custom_tool_call":
        return f"{item.get('name')}({item.get('input')})"
    if kind in ("function_call_output", "custom_tool_call_output"):
        return str(item.get("output"))
    if kind in ("mcp_call", "mcp_approval_request"):
        return f"{item.get('server_label')}.{item.get('name')}({item.get('arguments')})"
    if kind == "code_interpreter_call":
        return str(item.get("code"))
    return None


def sql_text(text: str | None) -> str | None:
    """Text for a plain SQL column: PostgreSQL's text type cannot hold NUL, so it reads as U+FFFD there
    (the item's JSON in `data` keeps the exact text, escaped)."""
    return None if text is None else text.replace("\x00", "\ufffd")


def item_role(item: ConversationItem) -> str | None:
    kind = item.get("type")
    if kind == "message":
        return str(item.get("role"))
    if kind in ("function_call_output", "custom_tool_call_output"):
        return "tool"
    if kind in ("function_call", "custom_tool_call", "reasoning", "mcp_call", "mcp_approval_request"):
        return "assistant"
    if kind == "code_interpreter_call":
        return "assistant"
    return "tool" if kind == "mcp_list_tools" else None
