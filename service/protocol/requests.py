"""The create request: validated strictly (unknown fields are a 400 naming them), and its input normalised."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from service.errors import InvalidRequest
from service.protocol.base import Strict
from service.protocol.ids import derived_id
from service.protocol.items import (
    ID_PREFIX,
    ClientToolItem,
    ConversationItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    ItemReference,
    McpApprovalResponseItem,
    MessageItem,
    RefusalPart,
    client_tool_item,
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

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
SummaryMode = Literal["auto", "concise", "detailed"]
# Every effort OpenAI accepts, onto the model's three levels (and so onto config's reasoning budgets).
_MODEL_EFFORT: dict[str, Literal["low", "medium", "high"]] = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


class ReasoningConfig(Strict):
    effort: Effort | None = None
    # Echoed; the stream builder adds a summary part to each reasoning item (service/reasoning_summary.py).
    summary: SummaryMode | None = None
    generate_summary: SummaryMode | None = None  # deprecated alias of `summary`


class BackgroundOptions(Strict):
    """Scheduling hints: runs start in arrival order here whatever the window."""

    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = None


class PromptCacheOptions(Strict):
    """Hints for OpenAI's prompt cache; this server's prefix cache keeps what it can regardless."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: str | None = None
    # Prewarming returns no output: accepting it while generating would be a different answer.
    prewarm: bool | None = None  # true is refused in parse_create_request


class ImageOptions(Strict):
    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class StreamOptions(Strict):
    # Pads delta events with an `obfuscation` field (random characters) against length side channels.
    include_obfuscation: bool | None = None


# Tool outputs a request may ask to include; no tool that produces them runs here, so they add nothing.
_NO_OP_INCLUDES = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
]


class ConversationRef(Strict):
    id: str


class ContextManagement(Strict):
    # Compact the history before generating when the prompt exceeds compact_threshold (service/compaction.py).
    type: Literal["compaction"]
    compact_threshold: Annotated[int, Field(ge=1)] | None = None


Penalty = Annotated[float, Field(ge=-2, le=2)]


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
            | _NO_OP_INCLUDES
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
    return _MODEL_EFFORT[effort] if effort is not None else "medium"


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


def normalize_input(request: CreateResponseRequest, response_id: str) -> list[ConversationItem]:
    """The request's input as canonical Responses item dicts, each with a stable id."""
    items: list[Any] = (
        [MessageItem(role="user", content=request.input)] if isinstance(request.input, str) else request.input
    )
    return normalize_items(items, response_id, key="input", first_index=0)


def normalize_items(items: list[Any], owner_id: str, *, key: str, first_index: int) -> list[ConversationItem]:
    """Validated input items as canonical item dicts; an item without an id gets one derived from
    (owner, key, index), so a replay names it identically."""
    out: list[ConversationItem] = []
    for index, item in enumerate(items, start=first_index):
        item_id = item.id or derived_id(ID_PREFIX[item.type], owner_id, f"{key}:{index}")
        if isinstance(item, ItemReference):
            out.append({"id": item.id, "type": "item_reference"})  # resolved by service/item_references.py
        elif isinstance(item, MessageItem):
            part_type = "output_text" if item.role == "assistant" else "input_text"
            parts = [item.content] if isinstance(item.content, str) else item.content
            content: list[dict[str, Any]] = [
                {"type": "refusal", "refusal": part.refusal}
                if isinstance(part, RefusalPart)
                else {
                    "type": part_type,
                    "text": part if isinstance(part, str) else part.text,
                    **({"annotations": []} if part_type == "output_text" else {}),
                }
                for part in parts
            ]
            message = {"id": item_id, "type": "message", "role": item.role, "content": content, "status": "completed"}
            out.append({**message, "phase": item.phase} if item.phase is not None else message)
        elif isinstance(item, FunctionCallItem):
            out.append(
                {
                    "id": item_id,
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                    "status": "completed",
                    **({"namespace": item.namespace} if item.namespace is not None else {}),
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
                    "output": _tool_output(item.output),
                    "status": "completed",
                }
            )
        elif isinstance(item, FunctionCallOutputItem):
            out.append(
                {
                    "id": item_id,
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": _tool_output(item.output),
                    "status": "completed",
                }
            )
        elif isinstance(item, ClientToolItem):
            out.append(client_tool_item(item, item_id))
        elif isinstance(item, McpApprovalResponseItem):
            answer = {"approval_request_id": item.approval_request_id, "approve": item.approve, "reason": item.reason}
            out.append({"id": item_id, "type": "mcp_approval_response", **answer})
        else:
            reasoning_parts = [{"type": "reasoning_text", "text": part.text} for part in item.content or []]
            out.append({"id": item_id, "type": "reasoning", "summary": [], "content": reasoning_parts})
    return out


def _tool_output(output: Any) -> Any:
    """A tool output as sent: a string, or its content parts without the fields the client left out."""
    return output if isinstance(output, str) else [part.model_dump(exclude_none=True) for part in output]


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
