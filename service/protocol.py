"""Wire models: the create request (validated strictly) and the Response object we emit.

Shapes follow the OpenAI Responses API as typed by the official `openai` package.
Anything we do not implement is rejected with a 400 naming the field, never ignored.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.errors import InvalidRequest

ConversationItem = dict[str, Any]


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


def derived_id(prefix: str, response_id: str, key: str) -> str:
    """Item ids are a pure function of (response, position) so a replayed run names items identically."""
    digest = hashlib.sha256(f"{response_id}:{key}".encode()).hexdigest()[:40]
    return f"{prefix}_{digest}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    status: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str
    output: str
    status: str | None = None


class ReasoningText(_Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: None = None
    status: str | None = None


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(_Strict):
    type: Literal["function"]
    name: str


class ReasoningConfig(_Strict):
    effort: Literal["low", "medium", "high"] | None = None
    summary: None = None


class TextFormat(_Strict):
    type: Literal["text"]


class TextConfig(_Strict):
    format: TextFormat | None = None


class CreateResponseRequest(_Strict):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | FunctionToolChoice = "auto"
    parallel_tool_calls: bool = True
    store: bool = True
    stream: bool = False
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled"] | None = None
    include: list[Literal["message.output_text.logprobs"]] | None = None
    # Extension (not in OpenAI's API): fixes the sampler so a run is reproducible.
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > 16:
                raise ValueError("metadata may hold at most 16 pairs")
            for key, item in value.items():
                if len(key) > 64 or len(item) > 512:
                    raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return value


def parse_create_request(body: Any) -> CreateResponseRequest:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if isinstance(body.get("input"), list):
        # OpenAI accepts EasyInputMessage items without a `type`; give them their tag before validation.
        body = {
            **body,
            "input": [
                {**item, "type": "message"}
                if isinstance(item, dict) and "type" not in item and "role" in item
                else item
                for item in body["input"]
            ],
        }
    try:
        request = CreateResponseRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid_from_validation(exc) from None
    if request.background and not request.store:
        raise InvalidRequest("background=true requires store=true.", param="background")
    if isinstance(request.input, list) and not request.input and request.previous_response_id is None:
        raise InvalidRequest("input must not be empty.", param="input")
    if request.tool_choice not in ("auto", "none"):
        # Forcing a call would need the decoder constrained to it; we do not pretend to.
        raise InvalidRequest(
            "tool_choice 'required' and named functions are not supported by this server; use 'auto' or 'none'.",
            param="tool_choice",
            code="unsupported_value",
        )
    return request


def _invalid_from_validation(exc: ValidationError) -> InvalidRequest:
    # A union reports one error per branch: the deepest one is the branch the client meant.
    first = max(exc.errors(), key=lambda error: len(error["loc"]))
    # Drop the type tags pydantic inserts into locations (e.g. 'list[TextPart]', 'message', 'str').
    path = []
    for part in first["loc"]:
        text = str(part)
        if isinstance(part, int):
            path.append(f"[{part}]")
        elif "[" in text or text in _TYPE_TAGS:
            continue
        else:
            path.append(f".{text}")
    param = "".join(path).lstrip(".") or None
    if first["type"] == "extra_forbidden":
        return InvalidRequest(
            f"Unsupported parameter: '{param}'. This server does not implement it.",
            param=param,
            code="unsupported_parameter",
        )
    if first["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    return InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value")


def normalize_input(request: CreateResponseRequest, response_id: str) -> list[ConversationItem]:
    """The request's input as canonical Responses item dicts, each with a stable id."""
    items: list[Any] = (
        [MessageItem(role="user", content=request.input)] if isinstance(request.input, str) else request.input
    )
    out: list[ConversationItem] = []
    for index, item in enumerate(items):
        item_id = item.id or derived_id(_ID_PREFIX[item.type], response_id, f"input:{index}")
        if isinstance(item, MessageItem):
            part_type = "output_text" if item.role == "assistant" else "input_text"
            parts = [item.content] if isinstance(item.content, str) else [part.text for part in item.content]
            content: list[dict[str, Any]] = [
                {"type": part_type, "text": text, **({"annotations": []} if part_type == "output_text" else {})}
                for text in parts
            ]
            out.append({"id": item_id, "type": "message", "role": item.role, "content": content, "status": "completed"})
        elif isinstance(item, FunctionCallItem):
            out.append(
                {
                    "id": item_id,
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                    "status": "completed",
                }
            )
        elif isinstance(item, FunctionCallOutputItem):
            out.append(
                {
                    "id": item_id,
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": item.output,
                    "status": "completed",
                }
            )
        else:
            reasoning_parts = [{"type": "reasoning_text", "text": part.text} for part in item.content or []]
            out.append({"id": item_id, "type": "reasoning", "summary": [], "content": reasoning_parts})
    return out


_TYPE_TAGS = {
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "str",
    "int",
    "float",
    "bool",
    "function",
    "dict",
    "list",
    "none",
}
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def wants_logprobs(request: CreateResponseRequest) -> bool:
    return bool(request.include) and "message.output_text.logprobs" in (request.include or [])


def item_text(item: ConversationItem) -> str | None:
    """Plain text of an item for the SQL-facing `text` column."""
    kind = item.get("type")
    if kind in ("message", "reasoning"):
        return "".join(part.get("text", "") for part in item.get("content") or [])
    if kind == "function_call":
        return f"{item.get('name')}({item.get('arguments')})"
    if kind == "function_call_output":
        return str(item.get("output"))
    return None


def item_role(item: ConversationItem) -> str | None:
    kind = item.get("type")
    if kind == "message":
        return str(item.get("role"))
    if kind == "function_call_output":
        return "tool"
    return "assistant" if kind in ("function_call", "reasoning") else None


def initial_response(
    request: CreateResponseRequest, *, response_id: str, model: str, created_at: float, max_output_tokens: int
) -> dict[str, Any]:
    """The Response object as it stands before generation starts."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "queued" if request.background else "in_progress",
        "background": request.background,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens or max_output_tokens,
        "metadata": request.metadata or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": (request.reasoning.effort if request.reasoning else None), "summary": None},
        "store": request.store,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.tool_choice
        if isinstance(request.tool_choice, str)
        else request.tool_choice.model_dump(),
        "tools": [tool.model_dump(exclude_none=False) for tool in request.tools],
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_logprobs": request.top_logprobs or 0,
        "truncation": "disabled",
        "usage": None,
        "user": request.user,
        "completed_at": None,
    }


TERMINAL_EVENT_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})
TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
