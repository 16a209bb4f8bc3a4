"""The create request: validated strictly (unknown fields are a 400 naming them). Its option sub-models are in
request_options.py, its input's normalisation in normalize.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from service.errors import InvalidRequest
from service.protocol.base import Strict
from service.protocol.items import InputItem
from service.protocol.request_options import (
    MODEL_EFFORT,
    NO_OP_INCLUDES,
    BackgroundOptions,
    ContextManagement,
    ConversationRef,
    ImageOptions,
    Penalty,
    PromptCacheOptions,
    ReasoningConfig,
    StreamOptions,
)
from service.protocol.text import TextConfig
from service.protocol.tools import (
    UNOFFERED_TOOL_TYPES,
    AllowedToolsChoice,
    ClientTool,
    ClientToolChoice,
    CustomTool,
    FunctionTool,
    McpTool,
    McpToolChoice,
    NamespaceTool,
    Tool,
    ToolChoice,
    not_offered,
)


class CreateResponseRequest(Strict):
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: Annotated[str, Field(max_length=128)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # One tier here: any tier is accepted and the Response says "default", the tier that served it.
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    # The client's own labels (Codex sends them): kept in the logged request, never shown to the model.
    client_metadata: dict[str, str] | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: (
        list[
            Literal["message.output_text.logprobs", "code_interpreter_call.outputs", "reasoning.encrypted_content"]
            | NO_OP_INCLUDES
        ]
        | None
    ) = None
    # A Conversation (its id, or {"id": …}) whose items are the history and which the response's items join.
    conversation: str | ConversationRef | None = None
    # OpenAI parameters this server cannot honour: accepted only as null (see _UNSUPPORTED).
    prompt: None = None
    context_management: Annotated[list[ContextManagement], Field(max_length=1)] | None = None
    background_options: BackgroundOptions | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    image: ImageOptions | None = None
    moderation: None = None
    access_programs: None = None
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


# Why each OpenAI parameter without a meaning here is refused when it is set (null is accepted).
_UNSUPPORTED = {
    "prompt": "Prompt templates are stored on OpenAI's platform; this server has none. Send the input itself.",
    "moderation": "This server runs no moderation model.",
    "access_programs": "Access programs are an OpenAI platform feature this server does not have.",
}

# Content part types a message may carry on OpenAI that need a capability this server lacks.
_UNSUPPORTED_PARTS = {
    "input_image": "This server has no vision support: input_image content is not accepted.",
    "input_file": "This server has no file support: input_file content is not accepted.",
    "input_audio": "This server has no audio support: input_audio content is not accepted.",
}


def parse_create_request(body: Any) -> CreateResponseRequest:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    # null means "the default" for every parameter, as in OpenAI's API.
    body = {name: value for name, value in body.items() if value is not None}
    for name, reason in _UNSUPPORTED.items():
        if name in body:
            raise InvalidRequest(f"Unsupported parameter: '{name}'. {reason}", param=name, code="unsupported_parameter")
    cache_options = body.get("prompt_cache_options")
    if isinstance(cache_options, dict) and cache_options.get("prewarm") is True:
        raise InvalidRequest(
            "prompt_cache_options.prewarm=true asks for no output; this server has no cache to prewarm and always "
            "generates. Leave prewarm unset.",
            param="prompt_cache_options.prewarm",
            code="unsupported_value",
        )
    if isinstance(body.get("input"), list):
        _refuse_unsupported_parts(body["input"])
        # OpenAI accepts EasyInputMessage items, and item references, without a `type`: tag them first.
        body = {**body, "input": [_tagged(item) for item in body["input"]]}
    try:
        request = CreateResponseRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid_from_validation(exc) from None
    if request.conversation is not None and request.previous_response_id is not None:
        raise InvalidRequest(
            "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' or "
            "'conversation'.",
            param="conversation",
            code="mutually_exclusive_parameters",
        )
    if request.background and not request.store:
        raise InvalidRequest("background=true requires store=true.", param="background")
    _check_tools(request)
    return request


def _tagged(item: Any) -> Any:
    if not isinstance(item, dict) or "type" in item:
        return item
    if "role" in item:
        return {**item, "type": "message"}
    return {**item, "type": "item_reference"} if "id" in item else item


def refuse_not_offered(request: CreateResponseRequest) -> None:
    """The operator's choice (SERVICE_REFUSE_UNSUPPORTED_TOOLS): a tool this server does not run is a 400."""
    for index, kind in not_offered(request.tools):
        raise InvalidRequest(
            f"This server does not offer {UNOFFERED_TOOL_TYPES[kind]} (tool type '{kind}'). "
            "It calls 'function' and 'custom' tools through the client.",
            param=f"tools[{index}].type",
            code="unsupported_tool",
        )


def model_effort(request: CreateResponseRequest) -> Literal["low", "medium", "high"]:
    """The model's reasoning level for the request's `reasoning.effort` (medium when unset)."""
    effort = request.reasoning.effort if request.reasoning else None
    return MODEL_EFFORT[effort] if effort is not None else "medium"


def _check_tools(request: CreateResponseRequest) -> None:
    """tool_choice must name tools the request offers; names are unique (the model addresses tools by name,
    a namespace's functions among them)."""
    kinds: dict[str, str] = {}
    labels = {tool.server_label for tool in request.tools if isinstance(tool, McpTool)}
    for index, tool in enumerate(request.tools):
        named: list[tuple[str, FunctionTool | CustomTool]] = []
        if isinstance(tool, NamespaceTool):
            named = [(f"tools[{index}].tools[{inner}].name", fn) for inner, fn in enumerate(tool.tools)]
        elif isinstance(tool, FunctionTool | CustomTool):
            named = [(f"tools[{index}].name", tool)]
        # server tools (mcp, code_interpreter): checked by service/tools/specs.py
        for param, fn in named:
            if fn.name in kinds:
                raise InvalidRequest(f"Duplicate tool name '{fn.name}'.", param=param)
            kinds[fn.name] = fn.type
        if isinstance(tool, ClientTool):  # offered as the function named after its type (client_tools)
            if tool.type in kinds:
                raise InvalidRequest(f"Duplicate tool name '{tool.type}'.", param=f"tools[{index}].type")
            kinds[tool.type] = tool.type
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
    elif isinstance(choice, McpToolChoice):
        if choice.server_label not in labels:
            raise InvalidRequest(
                f"Tool choice names MCP server '{choice.server_label}', which is not in 'tools'.", param="tool_choice"
            )
    elif isinstance(choice, ClientToolChoice):
        if kinds.get(choice.type) != choice.type:
            raise InvalidRequest(f"Tool choice '{choice.type}' not found in 'tools' parameter.", param="tool_choice")
    elif not isinstance(choice, str) and kinds.get(choice.name) != choice.type:
        raise InvalidRequest(
            f"Tool choice '{choice.name}' of type '{choice.type}' not found in 'tools' parameter.",
            param="tool_choice",
        )


def _refuse_unsupported_parts(items: list[Any]) -> None:
    for index, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        for part_index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:
                raise InvalidRequest(
                    _UNSUPPORTED_PARTS[kind], param=f"input[{index}].content[{part_index}]", code="unsupported_content"
                )


def _invalid_from_validation(exc: ValidationError) -> InvalidRequest:
    # A union reports one error per branch: the deepest one is the branch the client meant.
    first = max(exc.errors(), key=lambda error: len(error["loc"]))
    # Drop the type tags pydantic inserts into locations (e.g. 'list[TextPart]', 'message', 'str').
    path = []
    for position, part in enumerate(first["loc"]):
        text = str(part)
        if position == 0:  # a top-level parameter, never a tag (`reasoning` is both)
            path.append(f".{text}")
        elif isinstance(part, int):
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
    "item_reference",
    "input_text",
    "input_image",
    "input_file",
    "output_text",
    "allowed_tools",
    "json_schema",
    "json_object",
    "grammar",
    "dict",
    "list",
    "none",
    "shell",
    "local_shell",
    "apply_patch",
    "shell_call",
    "shell_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
}


def wants_logprobs(request: CreateResponseRequest) -> bool:
    return bool(request.include) and "message.output_text.logprobs" in (request.include or [])
