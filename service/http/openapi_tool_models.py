"""OpenAPI models of the server-side tools' output items, input item and stream events, field for field as
OpenAI's SDK types them (service/http/openapi_models.py composes them into the documented unions)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class McpListToolsEntry(BaseModel):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
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
    content: Any = None


class McpCall(BaseModel):
    id: str
    type: Literal["mcp_call"]
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: McpCallError | None = None
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | None = None
    approval_request_id: str | None = None


class McpApprovalRequest(BaseModel):
    id: str
    type: Literal["mcp_approval_request"]
    server_label: str
    name: str
    arguments: str


class McpApprovalResponse(BaseModel):
    id: str
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    reason: str | None = None


class CodeInterpreterLogs(BaseModel):
    type: Literal["logs"]
    logs: str


class CodeInterpreterCall(BaseModel):
    id: str
    type: Literal["code_interpreter_call"]
    code: str | None
    container_id: str
    outputs: list[CodeInterpreterLogs] | None
    status: Literal["in_progress", "completed", "incomplete", "interpreting", "failed"]


class _ToolEvent(BaseModel):
    sequence_number: int
    item_id: str
    output_index: int


class ServerToolStatusEvent(_ToolEvent):
    type: Literal[
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_list_tools.failed",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
    ]


class McpCallArgumentsDeltaEvent(_ToolEvent):
    type: Literal["response.mcp_call_arguments.delta"]
    delta: str


class McpCallArgumentsDoneEvent(_ToolEvent):
    type: Literal["response.mcp_call_arguments.done"]
    arguments: str


class CodeInterpreterCodeDeltaEvent(_ToolEvent):
    type: Literal["response.code_interpreter_call_code.delta"]
    delta: str


class CodeInterpreterCodeDoneEvent(_ToolEvent):
    type: Literal["response.code_interpreter_call_code.done"]
    code: str


# Client-run tools with their own items (service/protocol/client_tools.py): the calls the model makes and the
# outputs the client sends back, as the SDK types them.
ClientCallStatus = Literal["in_progress", "completed", "incomplete"]


class ShellAction(BaseModel):
    commands: list[str]
    timeout_ms: int | None = None
    max_output_length: int | None = None


class ShellCall(BaseModel):
    id: str
    type: Literal["shell_call"]
    call_id: str
    action: ShellAction
    status: ClientCallStatus


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


class LocalShellAction(BaseModel):
    type: Literal["exec"]
    command: list[str]
    env: dict[str, str]
    timeout_ms: int | None = None
    user: str | None = None
    working_directory: str | None = None


class LocalShellCall(BaseModel):
    id: str
    type: Literal["local_shell_call"]
    call_id: str
    action: LocalShellAction
    status: ClientCallStatus


class LocalShellCallOutput(BaseModel):
    id: str
    type: Literal["local_shell_call_output"]
    output: str
    status: ClientCallStatus | None = None


class PatchOperation(BaseModel):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str
    diff: str | None = None


class ApplyPatchCall(BaseModel):
    id: str
    type: Literal["apply_patch_call"]
    call_id: str
    operation: PatchOperation
    status: Literal["in_progress", "completed"]


class ApplyPatchCallOutput(BaseModel):
    id: str
    type: Literal["apply_patch_call_output"]
    call_id: str
    status: Literal["completed", "failed"]
    output: str | None = None
