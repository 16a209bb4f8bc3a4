"""The create request: validated strictly (unknown fields are a 400 naming them), and its input normalised."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from service.errors import InvalidRequest
from service.protocol.base import Strict
from service.protocol.ids import derived_id
from service.protocol.items import (
    ID_PREFIX,
    ConversationItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
)
from service.protocol.text import TextConfig
from service.protocol.tools import AllowedToolsChoice, Tool, ToolChoice


class ReasoningConfig(Strict):
    effort: Literal["low", "medium", "high"] | None = None
    summary: None = None


class CreateResponseRequest(Strict):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
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
    _check_tools(request)
    return request


def _check_tools(request: CreateResponseRequest) -> None:
    """tool_choice must name tools the request offers; names are unique (the model addresses tools by name)."""
    kinds: dict[str, str] = {}
    for index, tool in enumerate(request.tools):
        if tool.name in kinds:
            raise InvalidRequest(f"Duplicate tool name '{tool.name}'.", param=f"tools[{index}].name")
        kinds[tool.name] = tool.type
    choice = request.tool_choice
    if choice == "required" and not request.tools:
        raise InvalidRequest("tool_choice 'required' needs at least one tool in 'tools'.", param="tool_choice")
    if isinstance(choice, AllowedToolsChoice):
        if not choice.tools:
            raise InvalidRequest("allowed_tools must name at least one tool.", param="tool_choice.tools")
        for index, ref in enumerate(choice.tools):
            if kinds.get(ref.name) != ref.type:
                raise InvalidRequest(
                    f"Tool '{ref.name}' of type '{ref.type}' in allowed_tools is not in 'tools'.",
                    param=f"tool_choice.tools[{index}]",
                )
    elif not isinstance(choice, str) and kinds.get(choice.name) != choice.type:
        raise InvalidRequest(
            f"Tool choice '{choice.name}' of type '{choice.type}' not found in 'tools' parameter.",
            param="tool_choice",
        )


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
        item_id = item.id or derived_id(ID_PREFIX[item.type], response_id, f"input:{index}")
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
        elif isinstance(item, CustomToolCallItem):
            out.append(
                {
                    "id": item_id,
                    "type": "custom_tool_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "input": item.input,
                    "status": "completed",
                }
            )
        elif isinstance(item, CustomToolCallOutputItem):
            out.append(
                {
                    "id": item_id,
                    "type": "custom_tool_call_output",
                    "call_id": item.call_id,
                    "output": item.output,
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
    "custom",
    "custom_tool_call",
    "custom_tool_call_output",
    "allowed_tools",
    "json_schema",
    "json_object",
    "grammar",
    "dict",
    "list",
    "none",
}


def wants_logprobs(request: CreateResponseRequest) -> bool:
    return bool(request.include) and "message.output_text.logprobs" in (request.include or [])
