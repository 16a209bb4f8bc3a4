"""A create request's prompt: the history it continues (previous_response_id or a conversation), its input, its
tools (server tools prepared, their listings and approvals), rendered by the model's chat format and truncated to
fit the context. Shared by `create` and `input_tokens.count`, so both see the same tokens."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
from sqlalchemy.ext.asyncio import AsyncEngine

from service.agent import setup as agent_setup
from service.agent.runtime import ToolRuntime
from service.agent.setup import PreparedTools
from service.conversations.service import Conversations
from service.errors import InvalidRequest, NotFound
from service.model_runtime import ModelRuntime
from service.prompting.base import PromptRequest
from service.protocol import TERMINAL_STATUSES, CreateResponseRequest, is_response_id
from service.protocol.client_tools import as_function_item
from service.protocol.requests import model_effort
from service.protocol.tools import McpToolChoice, model_tools
from service.store import read_models

# store=false responses the current caller may continue from with previous_response_id: a WebSocket connection's
# own (service/http/websocket.py), kept for it as OpenAI keeps them; nowhere else is a store=false response read.
continuable_unstored: ContextVar[frozenset[str]] = ContextVar("continuable_unstored", default=frozenset())


@dataclass(frozen=True)
class AssembledPrompt:
    """What the model is shown for a request, and what a run needs to record of it."""

    request: PromptRequest
    token_ids: list[int]
    tools: list[Any]  # as the model sees them: function and custom tools, each MCP server's in its namespace
    effort: Literal["low", "medium", "high"]
    server_tools: PreparedTools


class PromptAssembler:
    def __init__(self, db: AsyncEngine, runtime: ModelRuntime, tools: ToolRuntime) -> None:
        self.db = db
        self.runtime = runtime
        self.tools = tools

    async def assemble(
        self, request: CreateResponseRequest, input_items: list[dict[str, Any]], *, project: str
    ) -> AssembledPrompt:
        """The rendered prompt (history from previous_response_id or the conversation, then the input)."""
        history: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            history = await self.history(request.previous_response_id, project=project)
        conversation_id = conversation_of(request)
        if conversation_id is not None:
            history = await Conversations(self.db).history(conversation_id, project=project)
        _check_call_ids(history, input_items)
        tools = [] if request.tool_choice == "none" else model_tools(request.tools)
        server_tools = await agent_setup.prepare(
            tools,
            self.tools,
            history=history,
            input_items=input_items,
            background=request.background,
            project=project,
            reserved_labels=self.runtime.chat_format.reserved_server_labels,
            forced_label=choice.server_label if isinstance(choice := request.tool_choice, McpToolChoice) else None,
        )
        # The model sees function and custom tools as given, and each server's tools in its namespace.
        tools = [t for t in tools if t not in agent_setup.server_specs(tools)] + server_tools.model_tools
        effort = model_effort(request)
        prompt_request, prompt_ids = await self._render_to_fit(
            history + input_items, request, tools=tools, effort=effort
        )
        return AssembledPrompt(prompt_request, prompt_ids, tools, effort, server_tools)

    async def _render_to_fit(
        self,
        items: list[dict[str, Any]],
        request: CreateResponseRequest,
        *,
        tools: list[Any],
        effort: Literal["low", "medium", "high"],
    ) -> tuple[PromptRequest, list[int]]:
        """Render the prompt; with truncation='auto', drop the oldest items until it leaves room to generate."""
        context = self.runtime.engine.max_context
        while True:
            prompt_request = PromptRequest(
                items=items,
                instructions=request.instructions,
                tools=tuple(tools),
                reasoning_effort=effort,
                response_format=_response_format(request),
            )
            try:
                prompt_ids = await asyncio.to_thread(self.runtime.render, prompt_request)
            except (ValueError, jinja2.TemplateError) as exc:
                # The model's prompt format cannot express this input (e.g. its chat template refuses it).
                raise InvalidRequest(
                    f"This model's prompt format cannot render the input: {exc}", param="input"
                ) from None
            # With truncation='auto' the prompt must leave room for the requested output (at least one token).
            wanted = request.max_output_tokens or 1
            fits = len(prompt_ids) + wanted <= context if request.truncation == "auto" else len(prompt_ids) < context
            if fits:
                return prompt_request, prompt_ids
            shorter = _drop_oldest(items)
            if request.truncation == "auto" and shorter:
                items = shorter
                continue
            if len(prompt_ids) < context:
                return prompt_request, prompt_ids  # nothing left to drop: the output gets what room remains
            asked = request.max_output_tokens
            requested = f" and {asked} output tokens were requested" if asked else ""
            raise InvalidRequest(
                f"The prompt is {len(prompt_ids)} tokens; this model's context holds {context}{requested}."
                + ("" if request.truncation == "auto" else " Set truncation='auto' to drop the oldest items."),
                param="input",
                code="context_length_exceeded",
            )

    async def history(self, previous_response_id: str, *, project: str) -> list[dict[str, Any]]:
        """The items a response continuing `previous_response_id` starts from: that response's whole chain."""
        if not is_response_id(previous_response_id):
            raise NotFound(
                f"Previous response with id '{previous_response_id}' not found.", param="previous_response_id"
            )
        async with self.db.connect() as connection:
            previous = await read_models.get_response(connection, previous_response_id, project=project)
            if previous is None or (
                previous.get("store") is False and previous_response_id not in continuable_unstored.get()
            ):
                raise NotFound(
                    f"Previous response with id '{previous_response_id}' not found.", param="previous_response_id"
                )
            if previous["status"] not in TERMINAL_STATUSES:
                raise InvalidRequest(
                    f"Previous response '{previous_response_id}' is still {previous['status']}.",
                    param="previous_response_id",
                    code="previous_response_in_progress",
                )
            history = await read_models.conversation_history(connection, previous_response_id, project=project)
        # A `compaction` output item renders as nothing: its summary is already in that response's input.
        return [item for item in history if item.get("type") != "compaction"]


def conversation_of(request: CreateResponseRequest) -> str | None:
    """The id of the conversation a request is in, if any."""
    conversation = request.conversation
    return conversation if isinstance(conversation, str) or conversation is None else conversation.id


def _drop_oldest(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items without the oldest one; a function call's output never outlives its call."""
    oldest, rest = items[0], items[1:]
    if oldest.get("type") == "function_call":
        rest = [item for item in rest if item.get("call_id") != oldest.get("call_id")]
    return rest


def _check_call_ids(history: list[dict[str, Any]], input_items: list[dict[str, Any]]) -> None:
    """A function_call_output (custom_tool_call_output) must answer a function (custom tool) call of this
    conversation (earlier or in the input)."""
    calls, outputs = ("function_call", "custom_tool_call"), ("function_call_output", "custom_tool_call_output")
    # A client tool's call or output (shell_call, ...) is checked as the function call or output it reads as.
    known = {item.get("call_id") for item in map(as_function_item, history) if item.get("type") in calls}
    for index, item in enumerate(map(as_function_item, input_items)):
        if item.get("type") in calls:
            known.add(item.get("call_id"))
        elif item.get("type") in outputs and item.get("call_id") not in known:
            raise InvalidRequest(
                f"No tool call found for function call output with call_id '{item.get('call_id')}'.",
                param=f"input[{index}].call_id",
                code="invalid_value",
            )


def _response_format(request: CreateResponseRequest) -> dict[str, Any] | None:
    """text.format as the prompt shows it to the model (and the constraint enforces it)."""
    text_format = request.text.format if request.text is not None else None
    return text_format.model_dump(mode="json", exclude_none=True) if text_format is not None else None
