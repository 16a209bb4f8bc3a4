"""The Response object, typed: what `response.*` lifecycle events carry and a GET returns.

The Response is created as a dict (service/protocol/response.py `initial_response`) and kept in the log's
request fact; the stream builder fills in its `output` (the items of output.py), `usage`, `status`,
`completed_at` and `error` or `incomplete_details` from these models. `ResponseObject` documents it in
`/openapi.json`; lifecycle events send the snapshot key for key (`ResponseSnapshot`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, PlainValidator

from service.protocol.output import OutputItem, omitted
from service.protocol.tools import FunctionTool, FunctionToolChoice


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
    cache_write_tokens: int | None = omitted()


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ConversationRef(BaseModel):
    id: str


# Fields in the order sent: the Response as created (service/protocol/response.py initial_response), whose
# `output`, `usage`, `status`, `completed_at` (and `error` or `incomplete_details`) the stream builder fills in.
class ResponseObject(BaseModel):
    """OpenAI's `Response` (and the Open Responses `ResponseResource`)."""

    id: str
    object: Literal["response"]
    created_at: int
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
    completed_at: int | None


def _as_stored(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("a Response object")
    return value


# A Response as the log holds it (the request fact's, then the builder's): sent as it is, key for key, so a
# response created by an earlier version replays unchanged; documented as a ResponseObject.
ResponseSnapshot = Annotated[dict[str, Any], PlainValidator(_as_stored, json_schema_input_type=ResponseObject)]
