"""What the server returns, typed: output items, their parts, and the items it lists back.

The one source of these shapes. The stream builder constructs these models and sends their `model_dump()`;
`/openapi.json` is generated from them; the official SDK's types check them in tests (tests/test_conformance.py,
tests/test_output_models.py). Fields are declared in the order they are sent, so the JSON of a dump is
byte for byte what the log stores; a field made with `omitted()` is left out while it is None (OpenAI leaves
those keys out rather than sending null). The Response object around them is response_object.py's.

Items a client sent (inputs, the outputs of its tools) are stored as sent and listed back by
`input_items` and conversations: their models here (`InputMessage`, `FunctionCallOutput`, ...) describe
that listing; service/protocol/items.py validates them on the way in.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _absent(value: object) -> bool:
    return value is None


def omitted() -> Any:
    """A field left out of the sent JSON while it is None."""
    return Field(default=None, exclude_if=_absent)


# -- parts ----------------------------------------------------------------------------------------------
class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float


class Logprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]]
    logprobs: list[Logprob] | None = None  # always sent by this server; a client's history may leave it out


class InputText(BaseModel):
    type: Literal["input_text"]
    text: str


class Refusal(BaseModel):
    type: Literal["refusal"]
    refusal: str


class ReasoningTextContent(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class SummaryText(BaseModel):
    type: Literal["summary_text"]
    text: str


class ToolOutputImage(BaseModel):
    type: Literal["input_image"]
    detail: str | None = None
    file_id: str | None = None
    image_url: str | None = None


class ToolOutputFile(BaseModel):
    type: Literal["input_file"]
    file_data: str | None = None
    file_id: str | None = None
    file_url: str | None = None
    filename: str | None = None


# A tool output as sent: a string, or content parts (service/protocol/items.py ToolOutput).
ToolOutput = str | list[Annotated[InputText | ToolOutputImage | ToolOutputFile, Field(discriminator="type")]]


# -- output items (as the stream builder makes them) ----------------------------------------------------
class OutputMessage(BaseModel):
    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText]


class ReasoningOutputItem(BaseModel):
    id: str
    type: Literal["reasoning"]
    summary: list[SummaryText]
    content: list[ReasoningTextContent] | None = None
    status: ItemStatus | None = None
    encrypted_content: str | None = omitted()  # sealed into the item as it is sent (service/http/include_view.py)


class FunctionCall(BaseModel):
    id: str
    type: Literal["function_call"]
    status: ItemStatus | None = None
    call_id: str
    name: str
    arguments: str
    namespace: str | None = omitted()  # a namespace tool's function: its bare name, and its namespace


class CustomToolCall(BaseModel):
    id: str
    type: Literal["custom_tool_call"]
    status: ItemStatus | None = None
    call_id: str
    name: str
    input: str


class CompactionItem(BaseModel):
    """A compaction: an HMAC'd reference to server-side state (service/compaction.py)."""

    id: str
    type: Literal["compaction"]
    encrypted_content: str
    created_by: str | None = omitted()


class McpListToolsEntry(BaseModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


class McpListTools(BaseModel):
    id: str
    type: Literal["mcp_list_tools"]
    server_label: str
    tools: list[McpListToolsEntry]
    error: str | None = None


class McpCallError(BaseModel):
    type: Literal["mcp_protocol_error", "mcp_tool_execution_error", "http_error"]
    code: int | None = None
    message: str | None = None
    content: Any = omitted()


class McpCall(BaseModel):
    id: str
    type: Literal["mcp_call"]
    server_label: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | None = None
    output: str | None = None
    error: McpCallError | None = None
    approval_request_id: str | None = None


class McpApprovalRequest(BaseModel):
    id: str
    type: Literal["mcp_approval_request"]
    server_label: str
    name: str
    arguments: str


class CodeInterpreterLogs(BaseModel):
    type: Literal["logs"]
    logs: str


class CodeInterpreterCall(BaseModel):
    id: str
    type: Literal["code_interpreter_call"]
    status: Literal["in_progress", "completed", "incomplete", "interpreting", "failed"]
    code: str | None
    container_id: str
    outputs: list[CodeInterpreterLogs] | None


# Client-run tools with their own items (service/protocol/client_tools.py): the calls the model makes.
ClientCallStatus = Literal["in_progress", "completed", "incomplete"]


class ShellAction(BaseModel):
    commands: list[str]
    timeout_ms: int | None = omitted()
    max_output_length: int | None = omitted()


class ShellCall(BaseModel):
    id: str
    type: Literal["shell_call"]
    status: ClientCallStatus
    call_id: str
    action: ShellAction


class LocalShellAction(BaseModel):
    type: Literal["exec"]
    command: list[str]
    env: dict[str, str]
    timeout_ms: int | None = omitted()
    user: str | None = omitted()
    working_directory: str | None = omitted()


class LocalShellCall(BaseModel):
    id: str
    type: Literal["local_shell_call"]
    status: ClientCallStatus
    call_id: str
    action: LocalShellAction


class PatchOperation(BaseModel):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str
    diff: str | None = omitted()  # none for delete_file


class ApplyPatchCall(BaseModel):
    id: str
    type: Literal["apply_patch_call"]
    status: Literal["in_progress", "completed"]  # the SDK's apply_patch_call has no `incomplete`
    call_id: str
    operation: PatchOperation


ServerToolItem = McpCall | McpApprovalRequest | CodeInterpreterCall
ClientCallItem = ShellCall | LocalShellCall | ApplyPatchCall
AnyOutputItem = (
    OutputMessage
    | ReasoningOutputItem
    | FunctionCall
    | CustomToolCall
    | McpListTools
    | ServerToolItem
    | ClientCallItem
    | CompactionItem
)
OutputItem = Annotated[AnyOutputItem, Field(discriminator="type")]


# -- items a client sent, as they are listed back ---------------------------------------------------------
class InputMessage(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["user", "system", "developer", "assistant"]
    status: ItemStatus | None = None
    content: list[InputText | OutputText | Refusal]
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallOutput(BaseModel):
    id: str
    type: Literal["function_call_output"]
    call_id: str
    output: ToolOutput
    status: ItemStatus | None = None


class CustomToolCallOutput(BaseModel):
    id: str
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: ToolOutput
    status: ItemStatus | None = None


class McpApprovalResponse(BaseModel):
    id: str
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    reason: str | None = None


class ShellOutcome(BaseModel):
    type: Literal["exit", "timeout"]
    exit_code: int | None = None


class ShellOutputChunk(BaseModel):
    stdout: str
    stderr: str
    outcome: ShellOutcome


class ShellCallOutput(BaseModel):
    id: str
    type: Literal["shell_call_output"]
    call_id: str
    output: list[ShellOutputChunk]
    max_output_length: int | None = None
    status: ClientCallStatus


class LocalShellCallOutput(BaseModel):
    id: str
    type: Literal["local_shell_call_output"]
    output: str
    status: ClientCallStatus | None = None


class ApplyPatchCallOutput(BaseModel):
    id: str
    type: Literal["apply_patch_call_output"]
    call_id: str
    status: Literal["completed", "failed"]
    output: str | None = None


class InputReasoning(BaseModel):
    """A reasoning item sent as input: its summary is kept as sent."""

    id: str
    type: Literal["reasoning"]
    summary: list[Any]
    content: list[ReasoningTextContent] | None = None
    status: ItemStatus | None = None
    encrypted_content: str | None = omitted()


InputItem = Annotated[
    InputMessage
    | InputReasoning
    | FunctionCall
    | FunctionCallOutput
    | CustomToolCall
    | CustomToolCallOutput
    | ShellCall
    | ShellCallOutput
    | LocalShellCall
    | LocalShellCallOutput
    | ApplyPatchCall
    | ApplyPatchCallOutput
    | McpListTools
    | McpCall
    | McpApprovalRequest
    | McpApprovalResponse
    | CodeInterpreterCall
    | CompactionItem,
    Field(discriminator="type"),
]
