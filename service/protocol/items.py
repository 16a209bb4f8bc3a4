"""Input and output items (messages, function calls and outputs, reasoning) and their SQL-facing text."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from service.protocol.base import Strict
from service.protocol.client_tools import ITEM_PREFIX as CLIENT_ITEM_PREFIX
from service.protocol.client_tools import call_arguments, output_text

ConversationItem = dict[str, Any]

# Ids are identifiers: printable ASCII, no spaces, and short enough for the item_id column.
ItemId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]+$")]


class TextPart(Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class RefusalPart(Strict):
    """An assistant's earlier refusal, sent back as history: rendered as that assistant's text."""

    type: Literal["refusal"]
    refusal: str


class MessageItem(Strict):
    type: Literal["message"] = "message"
    id: ItemId | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[TextPart | RefusalPart, Field(discriminator="type")]]
    status: str | None = None
    # Whether an assistant message was commentary or the final answer: kept with the item, a hint.
    phase: Literal["commentary", "final_answer"] | None = None

    @model_validator(mode="after")
    def _refusals_are_the_assistants(self) -> MessageItem:
        # `content` may be a string: iterating one of megabytes would check each character on the event loop.
        parts = self.content if isinstance(self.content, list) else []
        if self.role != "assistant" and any(isinstance(part, RefusalPart) for part in parts):
            raise ValueError("refusal content parts belong to assistant messages")
        return self


class OutputTextPart(Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: dict[str, Any] | None = None


class OutputImagePart(Strict):
    """An image a tool returned: kept with the item; the model is told it cannot see it (unseen_part_text)."""

    type: Literal["input_image"]
    detail: str | None = None
    file_id: str | None = None
    image_url: str | None = None
    prompt_cache_breakpoint: dict[str, Any] | None = None


class OutputFilePart(Strict):
    type: Literal["input_file"]
    detail: str | None = None
    file_data: str | None = None
    file_id: str | None = None
    file_url: str | None = None
    filename: str | None = None
    prompt_cache_breakpoint: dict[str, Any] | None = None


# A tool's output as OpenAI accepts it: a string, or a list of content parts.
ToolOutput = str | list[Annotated[OutputTextPart | OutputImagePart | OutputFilePart, Field(discriminator="type")]]


def unseen_part_text(part: object) -> str | None:
    """What the model reads in place of a tool output part it cannot see (an image, a file): said, not dropped."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_image":
        return "[An image was returned here; this model cannot see images.]"
    if kind == "input_file":
        name = part.get("filename") if isinstance(part, dict) else None
        return f"[A file{f' ({name})' if name else ''} was returned here; this model cannot read files.]"
    return None


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    id: ItemId | None = None
    call_id: str
    name: str
    arguments: str
    status: str | None = None
    namespace: str | None = None  # the namespace tool the function belongs to (kept with the item)


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    id: ItemId | None = None
    call_id: str
    output: ToolOutput
    status: str | None = None
    name: str | None = None
    namespace: str | None = None


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
    output: ToolOutput
    status: str | None = None


class Caller(Strict):
    type: Literal["direct", "program"]
    caller_id: str | None = None


class ShellAction(Strict):
    commands: list[str]
    timeout_ms: int | None = None
    max_output_length: int | None = None


class ShellCallItem(Strict):
    """A `shell` tool call of an earlier turn (the client's history): the model reads it as its `shell` call."""

    type: Literal["shell_call"]
    id: ItemId | None = None
    call_id: str
    action: ShellAction
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    environment: dict[str, Any] | None = None
    caller: Caller | None = None
    created_by: str | None = None


class ShellOutcome(Strict):
    type: Literal["exit", "timeout"]
    exit_code: int | None = None


class ShellOutputChunk(Strict):
    stdout: str
    stderr: str
    outcome: ShellOutcome
    created_by: str | None = None


class ShellCallOutputItem(Strict):
    type: Literal["shell_call_output"]
    id: ItemId | None = None
    call_id: str
    output: list[ShellOutputChunk]
    max_output_length: int | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    caller: Caller | None = None
    created_by: str | None = None


class LocalShellAction(Strict):
    type: Literal["exec"]
    command: list[str]
    env: dict[str, str]
    timeout_ms: int | None = None
    user: str | None = None
    working_directory: str | None = None


class LocalShellCallItem(Strict):
    type: Literal["local_shell_call"]
    id: ItemId | None = None
    call_id: str
    action: LocalShellAction
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class LocalShellCallOutputItem(Strict):
    """OpenAI's shape: `id` is the call's `call_id`."""

    type: Literal["local_shell_call_output"]
    id: ItemId
    output: str
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class PatchOperation(Strict):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str
    diff: str | None = None


class ApplyPatchCallItem(Strict):
    type: Literal["apply_patch_call"]
    id: ItemId | None = None
    call_id: str
    operation: PatchOperation
    status: Literal["in_progress", "completed"]
    caller: Caller | None = None
    created_by: str | None = None


class ApplyPatchCallOutputItem(Strict):
    type: Literal["apply_patch_call_output"]
    id: ItemId | None = None
    call_id: str
    status: Literal["completed", "failed"]
    output: str | None = None
    caller: Caller | None = None
    created_by: str | None = None


ClientToolItem = (
    ShellCallItem
    | ShellCallOutputItem
    | LocalShellCallItem
    | LocalShellCallOutputItem
    | ApplyPatchCallItem
    | ApplyPatchCallOutputItem
)


def client_tool_item(item: ClientToolItem, item_id: str) -> ConversationItem:
    """A client tool's call or output as stored and echoed: as sent (fields left out stay out), with its id; a
    call or output without a status is completed."""
    stored: ConversationItem = {**item.model_dump(exclude_none=True), "id": item_id}
    stored.setdefault("status", "completed")
    return stored


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


class ItemReference(Strict):
    """An item already stored in this project (of a stored response or a conversation), by id: resolved by
    service/item_references.py into that item before the prompt is rendered."""

    type: Literal["item_reference"] = "item_reference"  # may be left out, as OpenAI allows
    id: ItemId


InputItem = Annotated[
    MessageItem
    | ItemReference
    | McpApprovalResponseItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ShellCallItem
    | ShellCallOutputItem
    | LocalShellCallItem
    | LocalShellCallOutputItem
    | ApplyPatchCallItem
    | ApplyPatchCallOutputItem
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
    "item_reference": "ref",
    **CLIENT_ITEM_PREFIX,
}


def item_text(item: ConversationItem) -> str | None:
    """Plain text of an item for the SQL-facing `text` column."""
    kind = item.get("type")
    if kind in ("message", "reasoning"):
        return "".join(part.get("text", part.get("refusal", "")) for part in item.get("content") or [])
    if kind == "function_call":
        return f"{item.get('name')}({item.get('arguments')})"
    if kind == "custom_tool_call":
        return f"{item.get('name')}({item.get('input')})"
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        if isinstance(output, list):
            return "".join(unseen_part_text(part) or str(part.get("text", "")) for part in output)
        return str(output)
    if kind in ("shell_call", "local_shell_call", "apply_patch_call"):
        return f"{str(kind).removesuffix('_call')}({call_arguments(item)})"
    if kind in ("shell_call_output", "local_shell_call_output", "apply_patch_call_output"):
        return output_text(item)
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
    if kind in ("shell_call_output", "local_shell_call_output", "apply_patch_call_output"):
        return "tool"
    if kind in ("shell_call", "local_shell_call", "apply_patch_call"):
        return "assistant"
    if kind in ("function_call", "custom_tool_call", "reasoning", "mcp_call", "mcp_approval_request"):
        return "assistant"
    if kind == "code_interpreter_call":
        return "assistant"
    return "tool" if kind == "mcp_list_tools" else None
