"""The stream events a response is made of, typed: the one source of their shape.

The stream builder (service/stream_builder.py) constructs these models and sends (and logs) their
`model_dump()`: fields are declared in the order they are sent, `type` and `sequence_number` first, so the
JSON is byte for byte the stored events'. `/openapi.json` documents the `data:` of each server-sent event
with `StreamEvent`. `obfuscation` is never logged: the SSE edge pads delta events with it when asked.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, Field

from service.protocol.output import (
    Logprob,
    OutputItem,
    OutputText,
    ReasoningTextContent,
    SummaryText,
    omitted,
)
from service.protocol.response_object import ResponseSnapshot

LifecycleType = Literal[
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
]


class ResponseLifecycleEvent(BaseModel):
    type: LifecycleType
    sequence_number: int
    response: ResponseSnapshot


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: Annotated[OutputText | ReasoningTextContent, Field(discriminator="type")]


class OutputTextDeltaEvent(BaseModel):
    type: Literal["response.output_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Logprob]
    obfuscation: str | None = omitted()


class OutputTextDoneEvent(BaseModel):
    type: Literal["response.output_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Logprob]


class ReasoningTextDeltaEvent(BaseModel):
    type: Literal["response.reasoning_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    obfuscation: str | None = omitted()


class ReasoningTextDoneEvent(BaseModel):
    type: Literal["response.reasoning_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


class ReasoningSummaryPartEvent(BaseModel):
    type: Literal["response.reasoning_summary_part.added", "response.reasoning_summary_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class ReasoningSummaryTextDeltaEvent(BaseModel):
    type: Literal["response.reasoning_summary_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class ReasoningSummaryTextDoneEvent(BaseModel):
    type: Literal["response.reasoning_summary_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    text: str


class FunctionCallArgumentsDeltaEvent(BaseModel):
    type: Literal["response.function_call_arguments.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str
    obfuscation: str | None = omitted()


class FunctionCallArgumentsDoneEvent(BaseModel):
    type: Literal["response.function_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomToolCallInputDeltaEvent(BaseModel):
    type: Literal["response.custom_tool_call_input.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str
    obfuscation: str | None = omitted()


class CustomToolCallInputDoneEvent(BaseModel):
    type: Literal["response.custom_tool_call_input.done"]
    sequence_number: int
    item_id: str
    output_index: int
    input: str


ItemStatusType = Literal[
    "response.mcp_list_tools.in_progress",
    "response.mcp_list_tools.completed",
    "response.mcp_list_tools.failed",
    "response.mcp_call.in_progress",
    "response.mcp_call.completed",
    "response.mcp_call.failed",
    "response.code_interpreter_call.in_progress",
    "response.code_interpreter_call.interpreting",
    "response.code_interpreter_call.completed",
    "response.compaction.compacting",
]


class ItemStatusEvent(BaseModel):
    """A server-side tool's item (or a compaction) moved on: the item's own events carry no payload."""

    type: ItemStatusType
    sequence_number: int
    item_id: str
    output_index: int


class McpCallArgumentsDeltaEvent(BaseModel):
    type: Literal["response.mcp_call_arguments.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class McpCallArgumentsDoneEvent(BaseModel):
    type: Literal["response.mcp_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


class CodeInterpreterCodeDeltaEvent(BaseModel):
    type: Literal["response.code_interpreter_call_code.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class CodeInterpreterCodeDoneEvent(BaseModel):
    type: Literal["response.code_interpreter_call_code.done"]
    sequence_number: int
    item_id: str
    output_index: int
    code: str


AnyStreamEvent = (
    ResponseLifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | OutputTextDeltaEvent
    | OutputTextDoneEvent
    | ReasoningTextDeltaEvent
    | ReasoningTextDoneEvent
    | ReasoningSummaryPartEvent
    | ReasoningSummaryTextDeltaEvent
    | ReasoningSummaryTextDoneEvent
    | FunctionCallArgumentsDeltaEvent
    | FunctionCallArgumentsDoneEvent
    | CustomToolCallInputDeltaEvent
    | CustomToolCallInputDoneEvent
    | ItemStatusEvent
    | McpCallArgumentsDeltaEvent
    | McpCallArgumentsDoneEvent
    | CodeInterpreterCodeDeltaEvent
    | CodeInterpreterCodeDoneEvent
)


def event_types(*models: type[AnyStreamEvent]) -> frozenset[str]:
    """The `type` values of these event models (each model's `type` is a Literal)."""
    return frozenset(value for model in models for value in get_args(model.model_fields["type"].annotation))


class StreamEvent(BaseModel):
    """One event of a response's stream, as OpenAI names and shapes it (the `data:` of a server-sent event)."""

    event: Annotated[AnyStreamEvent, Field(discriminator="type")]
