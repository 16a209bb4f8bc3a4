"""Pydantic models of the HTTP envelopes the server returns around its items (deleted markers, lists, models,
errors, health), field for field as OpenAI's API types them, for `/openapi.json`. Items, stream events and the
Response object are service/protocol/output.py's, events.py's and response_object.py's: the models the server
builds them from."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from service.protocol.output import InputItem
from service.protocol.response_object import Usage


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
