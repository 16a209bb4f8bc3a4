"""Pydantic models of what the server returns, field for field as OpenAI's Responses API types
them. They exist to generate `/openapi.json` (the server builds its objects as dicts in the
stream builder and projection; tests/test_conformance.py checks those against OpenAI's types)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from service.http.openapi_tool_models import (
    ApplyPatchCall,
    ApplyPatchCallOutput,
    CodeInterpreterCall,
    CodeInterpreterCodeDeltaEvent,
    CodeInterpreterCodeDoneEvent,
    LocalShellCall,
    LocalShellCallOutput,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpCallArgumentsDeltaEvent,
    McpCallArgumentsDoneEvent,
    McpListTools,
    ServerToolStatusEvent,
    ShellCall,
    ShellCallOutput,
)
from service.protocol.tools import FunctionTool, FunctionToolChoice

ItemStatus = Literal["in_progress", "completed", "incomplete"]


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
    logprobs: list[Logprob] | None = None


class InputText(BaseModel):
    type: Literal["input_text"]
    text: str


class Refusal(BaseModel):
    type: Literal["refusal"]
    refusal: str


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


class ReasoningTextContent(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: ItemStatus
    content: list[OutputText]


class InputMessage(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["user", "system", "developer", "assistant"]
    status: ItemStatus | None = None
    content: list[InputText | OutputText | Refusal]
    phase: Literal["commentary", "final_answer"] | None = None


class ReasoningOutputItem(BaseModel):
    id: str
    type: Literal["reasoning"]
    summary: list[dict[str, Any]]
    content: list[ReasoningTextContent] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


class FunctionCall(BaseModel):
    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: ItemStatus | None = None
    namespace: str | None = None


class FunctionCallOutput(BaseModel):
    id: str
    type: Literal["function_call_output"]
    call_id: str
    output: ToolOutput
    status: ItemStatus | None = None


class CustomToolCall(BaseModel):
    id: str
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    status: ItemStatus | None = None


class CustomToolCallOutput(BaseModel):
    id: str
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: ToolOutput
    status: ItemStatus | None = None


class CompactionItem(BaseModel):
    """A compaction: an HMAC'd reference to server-side state (service/compaction.py)."""

    id: str
    type: Literal["compaction"]
    encrypted_content: str
    created_by: str | None = None


OutputItem = Annotated[
    OutputMessage
    | ReasoningOutputItem
    | FunctionCall
    | CustomToolCall
    | McpListTools
    | McpCall
    | McpApprovalRequest
    | CodeInterpreterCall
    | ShellCall
    | LocalShellCall
    | ApplyPatchCall
    | CompactionItem,
    Field(discriminator="type"),
]
InputItem = Annotated[
    InputMessage
    | ReasoningOutputItem
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


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"] | None = None


class Reasoning(BaseModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None  # echoed as sent
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseTextConfig(BaseModel):
    format: dict[str, Any]
    verbosity: Literal["low", "medium", "high"] | None = None


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int | None = None


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(BaseModel):
    """OpenAI's `Response` (and the Open Responses `ResponseResource`)."""

    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
    background: bool
    conversation: ConversationRef | None
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    metadata: dict[str, str]
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    prompt: None
    prompt_cache_key: str | None
    prompt_cache_retention: Literal["in_memory", "24h"] | None
    reasoning: Reasoning | None
    safety_identifier: str | None
    service_tier: Literal["auto", "default"]
    store: bool
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    text: ResponseTextConfig
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | dict[str, Any]
    tools: list[FunctionTool | dict[str, Any]]
    top_logprobs: int
    truncation: Literal["auto", "disabled"]
    usage: Usage | None
    user: str | None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class InputItemList(BaseModel):
    object: Literal["list"]
    data: list[InputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ConversationRef(BaseModel):
    id: str


class Conversation(BaseModel):
    id: str
    object: Literal["conversation"]
    created_at: int
    metadata: dict[str, str]


class DeletedConversation(BaseModel):
    id: str
    object: Literal["conversation.deleted"]
    deleted: Literal[True]


class ConversationItemList(BaseModel):
    """A page of a conversation's items (inputs and outputs alike)."""

    object: Literal["list"]
    data: list[InputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class InputTokens(BaseModel):
    object: Literal["response.input_tokens"]
    input_tokens: int


class CompactedResponse(BaseModel):
    """`POST /v1/responses/compact`: the user messages, then one `compaction` item."""

    id: str
    object: Literal["response.compaction"]
    created_at: int
    output: list[dict[str, Any]]
    usage: Usage


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    info: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"]


class ReadyChecks(BaseModel):
    database: bool  # reachable and at the head migration
    model: bool
    run_loop: bool
    accepting: bool  # not draining for shutdown


class Ready(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: ReadyChecks


# -- stream events (the `data:` of each server-sent event) -------------------------------------
class _Event(BaseModel):
    sequence_number: int


class ResponseLifecycleEvent(_Event):
    type: Literal[
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    response: ResponseObject


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: Annotated[OutputText | ReasoningTextContent, Field(discriminator="type")]


class OutputTextDeltaEvent(_Event):
    type: Literal["response.output_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Logprob]
    obfuscation: str | None = None


class OutputTextDoneEvent(_Event):
    type: Literal["response.output_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Logprob]


class ReasoningTextDeltaEvent(_Event):
    type: Literal["response.reasoning_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str
    obfuscation: str | None = None


class ReasoningTextDoneEvent(_Event):
    type: Literal["response.reasoning_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str


class FunctionCallArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str
    obfuscation: str | None = None


class FunctionCallArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomToolCallInputDeltaEvent(_Event):
    type: Literal["response.custom_tool_call_input.delta"]
    item_id: str
    output_index: int
    delta: str
    obfuscation: str | None = None


class CustomToolCallInputDoneEvent(_Event):
    type: Literal["response.custom_tool_call_input.done"]
    item_id: str
    output_index: int
    input: str


class CompactionCompactingEvent(BaseModel):
    type: Literal["response.compaction.compacting"]
    sequence_number: int
    item_id: str
    output_index: int


class StreamEvent(BaseModel):
    """One event of a response's stream, as OpenAI names and shapes it."""

    event: Annotated[
        ResponseLifecycleEvent
        | OutputItemEvent
        | ContentPartEvent
        | OutputTextDeltaEvent
        | OutputTextDoneEvent
        | ReasoningTextDeltaEvent
        | ReasoningTextDoneEvent
        | FunctionCallArgumentsDeltaEvent
        | FunctionCallArgumentsDoneEvent
        | CustomToolCallInputDeltaEvent
        | CustomToolCallInputDoneEvent
        | ServerToolStatusEvent
        | McpCallArgumentsDeltaEvent
        | McpCallArgumentsDoneEvent
        | CodeInterpreterCodeDeltaEvent
        | CodeInterpreterCodeDoneEvent
        | CompactionCompactingEvent,
        Field(discriminator="type"),
    ]
